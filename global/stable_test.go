package global

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// After close, a term write (which Raft panics on if it fails) is a no-op
// instead of an error from a closed WAL.
func TestStableStoreAfterClose(t *testing.T) {
	inner := raft.NewInmemStore()
	s := &stableStore{s: inner}
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	s.close()
	if err := s.SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatalf("a write after close failed: %v", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("x")); err != nil {
		t.Fatalf("a write after close failed: %v", err)
	}
	if v, _ := inner.GetUint64([]byte("CurrentTerm")); v != 3 {
		t.Fatalf("a write after close reached the store: term %d", v)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); !errors.Is(err, ErrClosed) {
		t.Fatalf("a read after close: %v", err)
	}
}
