package global

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// Peer is one entry of a peers.json recovery file: the servers that remain
// after a quorum was lost. Its JSON form is hashicorp/raft's
// ([{"id": ..., "address": ..., "non_voter": false}, ...]).
type Peer struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	NonVoter bool   `json:"non_voter,omitempty"`
}

// WritePeersFile writes the recovery file for a node whose data directory is
// dataDir; the node applies it the next time it opens (see doc.go: every
// surviving node must be stopped, get the same file, and be started again).
func WritePeersFile(dataDir string, peers []Peer) error {
	if len(peers) == 0 {
		return fmt.Errorf("write peers file: no peers")
	}
	voters := 0
	seen := map[string]bool{}
	for i, p := range peers {
		if rej := validID("peer id", p.ID); rej != nil {
			return fmt.Errorf("write peers file: peer %d: %s", i, rej.Message)
		}
		if p.Address == "" {
			return fmt.Errorf("write peers file: peer %q has no address", p.ID)
		}
		if seen[p.ID] {
			return fmt.Errorf("write peers file: peer %q is listed twice", p.ID)
		}
		seen[p.ID] = true
		if !p.NonVoter {
			voters++
		}
	}
	if voters == 0 {
		return fmt.Errorf("write peers file: at least one peer must be a voter")
	}
	b, err := json.MarshalIndent(peers, "", "  ")
	if err != nil {
		return fmt.Errorf("write peers file: %w", err)
	}
	dir := filepath.Join(dataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write peers file: %w", err)
	}
	tmp := filepath.Join(dir, "peers.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write peers file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "peers.json")); err != nil {
		return fmt.Errorf("write peers file: %w", err)
	}
	return nil
}

// recoverFromPeersFile replaces the Raft configuration in the local storage
// with the one in path (raft.RecoverCluster), then renames the file so it is
// applied once.
func recoverFromPeersFile(rc *raft.Config, logs raft.LogStore, stable raft.StableStore,
	snaps raft.SnapshotStore, trans raft.Transport, path string) error {
	conf, err := raft.ReadConfigJSON(path)
	if err != nil {
		return fmt.Errorf("recover from %s: %w", path, err)
	}
	// RecoverCluster replays the log into a throwaway state machine to write
	// a snapshot; the real one is restored from that snapshot afterwards.
	if err := raft.RecoverCluster(rc, newFSM(nil), logs, stable, snaps, trans, conf); err != nil {
		return fmt.Errorf("recover from %s: %w", path, err)
	}
	if err := os.Rename(path, path+".applied"); err != nil {
		return fmt.Errorf("recover from %s: rename after recovery: %w", path, err)
	}
	return nil
}
