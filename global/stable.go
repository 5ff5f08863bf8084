package global

import (
	"sync"

	"github.com/hashicorp/raft"
)

// stableStore guards Raft's stable store (the WAL) against writes after the
// node closes it. Raft's transport answers a heartbeat on its own
// goroutine, which can pass Raft's shutdown check just before the node
// closes the WAL; the heartbeat's term write then fails, and Raft panics on
// a failed term write. Once closed, writes are dropped (the node is gone and
// nothing reads them back) and reads fail.
type stableStore struct {
	mu     sync.RWMutex
	closed bool
	s      raft.StableStore
}

var _ raft.StableStore = (*stableStore)(nil)

func (s *stableStore) Set(key, val []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.s.Set(key, val)
}

func (s *stableStore) Get(key []byte) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.s.Get(key)
}

func (s *stableStore) SetUint64(key []byte, val uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.s.SetUint64(key, val)
}

func (s *stableStore) GetUint64(key []byte) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.s.GetUint64(key)
}

// close makes every later write a no-op; it returns once no write is in
// progress, so the store underneath can then be closed.
func (s *stableStore) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}
