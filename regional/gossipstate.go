package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// gossipSelf is GET /v1/gossip/self on the admin API: how other
// controllers reach this one's gossip pool (they rejoin through it).
type gossipSelf struct {
	Controller string `json:"controller"`
	Region     string `json:"region"`
	GossipAddr string `json:"gossip_addr"`
}

// gossipSelfPath is where the admin API serves gossipSelf.
const gossipSelfPath = "/v1/gossip/self"

// rejoinAddrs gives the gossip pool, while it is isolated from every other
// region, the addresses it would not know by itself: the peers remembered
// from before a restart, and the gossip address of every other member of
// the Raft configuration, asked of its admin API.
func (c *Controller) rejoinAddrs(ctx context.Context) []string {
	mr := c.mr
	mr.gstateMu.Lock()
	out := slices.Clone(mr.gstate.Peers)
	mr.gstateMu.Unlock()
	if mr.node == nil {
		return out
	}
	for _, m := range mr.node.State().Members() {
		if m.ID == c.cfg.ControllerID || m.AdminAddr == "" {
			continue
		}
		addr, err := c.askGossipAddr(ctx, m.AdminAddr)
		if err != nil {
			c.log.Debug("no gossip address from a raft member", "member", m.ID, "err", err)
			continue
		}
		out = append(out, addr)
	}
	return out
}

// askGossipAddr asks a controller's admin API for its gossip address.
func (c *Controller) askGossipAddr(ctx context.Context, adminURL string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(adminURL, "/")+gossipSelfPath, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.AdminToken)
	resp, err := c.mr.adminClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", gossipSelfPath, resp.Status)
	}
	var self gossipSelf
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&self); err != nil {
		return "", err
	}
	if _, _, err := net.SplitHostPort(self.GossipAddr); err != nil {
		return "", fmt.Errorf("gossip address %q: %w", self.GossipAddr, err)
	}
	return self.GossipAddr, nil
}

// rememberGossipPeers keeps the controllers gossip has seen in the state
// file, when they changed, so that a restart can rejoin through them.
func (c *Controller) rememberGossipPeers() {
	mr := c.mr
	peers := mr.gossip.Peers()
	mr.gstateMu.Lock()
	defer mr.gstateMu.Unlock()
	if !mr.gstate.rememberPeers(peers) {
		return
	}
	if err := mr.gstate.save(mr.gstateFile); err != nil {
		c.log.Warn("gossip peers not remembered", "err", err)
	}
}
