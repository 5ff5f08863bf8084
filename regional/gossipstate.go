package regional

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// gossipState is what a controller keeps of gossip across restarts
// (GossipConfig.StateFile): the epoch of its summary generations, so they
// keep increasing whatever its wall clock does, and the gossip addresses
// of the controllers it has seen, to rejoin through.
type gossipState struct {
	// Epoch is incremented at every start; generations are
	// Epoch<<generationSeqBits | a counter from 1.
	Epoch uint64 `json:"epoch"`
	// Peers are gossip addresses (host:port) of other controllers seen,
	// most recent first.
	Peers []string `json:"peers,omitempty"`
}

// generationSeqBits is the width of a generation's counter: 2^42 summaries
// per start (at one every 5 s, 700,000 years), and an epoch of 1 already
// puts generations above the wall-clock milliseconds earlier versions
// used (2^42 ms is the year 2109), so peers running one keep taking them.
const generationSeqBits = 42

// maxPeersKept bounds the peers remembered.
const maxPeersKept = 64

// loadGossipState reads the state file; a missing one is a first start.
func loadGossipState(path string) (gossipState, error) {
	var st gossipState
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("gossip state %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("gossip state %s: %w", path, err)
	}
	return st, nil
}

// save writes the state file atomically (a temporary file, synced, renamed
// over it, the directory synced).
func (st gossipState) save(path string) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("gossip state: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".gossip-state-*")
	if err != nil {
		return fmt.Errorf("gossip state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("gossip state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("gossip state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gossip state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gossip state: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// nextEpoch increments and persists the epoch, and returns it.
func nextEpoch(path string) (gossipState, error) {
	st, err := loadGossipState(path)
	if err != nil {
		return st, err
	}
	if st.Epoch >= 1<<(64-generationSeqBits)-1 {
		return st, fmt.Errorf("gossip state %s: epoch %d exhausted", path, st.Epoch)
	}
	st.Epoch++
	return st, st.save(path)
}

// rememberPeers puts addrs first among the peers (most recent first,
// unique, at most maxPeersKept) and reports whether the list changed.
func (st *gossipState) rememberPeers(addrs []string) bool {
	next := slices.Clone(addrs)
	for _, p := range st.Peers {
		if !slices.Contains(next, p) {
			next = append(next, p)
		}
	}
	if len(next) > maxPeersKept {
		next = next[:maxPeersKept]
	}
	if slices.Equal(next, st.Peers) {
		return false
	}
	st.Peers = next
	return true
}
