package fleet

import (
	"context"
	"fmt"
	"net/url"
	"sync"

	"github.com/meridian-llm/meridian/regional"
)

// Replica is one controller of a region. It keeps its configuration with
// the addresses it bound at its first start, so that it starts again on
// the same addresses (a load balancer's backend, a peer's Raft and gossip
// address) and the same directories (its Raft log and audit chain carry
// on).
type Replica struct {
	ID     string
	Region string

	f    *Fleet
	deps regional.Deps

	mu     sync.Mutex
	cfg    regional.Config
	ctl    *regional.Controller // nil while down
	url    string               // the API's base URL, fixed after the first start
	starts int
}

// Controller returns the running controller, or nil while the replica is
// down.
func (r *Replica) Controller() *regional.Controller {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ctl
}

// URL is the base URL of the replica's API (the same across restarts).
func (r *Replica) URL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.url
}

// Starts is how many times the replica was started.
func (r *Replica) Starts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

// open starts the controller from r.cfg and, at the first start, pins the
// addresses it bound into r.cfg.
func (r *Replica) open(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctl != nil {
		return fmt.Errorf("replica %s: already running", r.ID)
	}
	ctl, err := regional.Open(ctx, r.cfg, r.deps)
	if err != nil {
		return err
	}
	r.ctl = ctl
	r.starts++
	if r.starts == 1 {
		// Start again where it was: the same API and admin addresses, the
		// same Raft and gossip ports; no second bootstrap.
		r.url = ctl.URL()
		r.cfg.Listen = ctl.Addr()
		if u, err := url.Parse(ctl.AdminURL()); err == nil {
			r.cfg.AdminListen = u.Host
		}
		if g := ctl.Global(); g != nil {
			r.cfg.Raft.Bind = g.RaftAddr()
		}
		if g := ctl.Gossip(); g != nil {
			r.cfg.Gossip.Bind = g.Addr()
		}
	}
	return nil
}

// Kill stops the replica as a crash would (regional.Controller.Kill):
// connections cut, no gossip leave, no Raft leadership transfer.
func (r *Replica) Kill() error {
	r.mu.Lock()
	ctl := r.ctl
	r.ctl = nil
	r.mu.Unlock()
	if ctl == nil {
		return fmt.Errorf("replica %s: not running", r.ID)
	}
	return ctl.Kill()
}

// Stop stops the replica gracefully, as on SIGTERM
// (regional.Controller.Shutdown): not ready at once, drained, out of the
// gossip pool, Raft leadership handed over. It returns once the controller
// has stopped.
func (r *Replica) Stop(ctx context.Context) error {
	r.mu.Lock()
	ctl := r.ctl
	r.mu.Unlock()
	if ctl == nil {
		return fmt.Errorf("replica %s: not running", r.ID)
	}
	err := ctl.Shutdown(ctx)
	r.mu.Lock()
	if r.ctl == ctl {
		r.ctl = nil
	}
	r.mu.Unlock()
	return err
}

// Start starts a replica that was killed or stopped again, on its
// addresses and directories, joining the Raft and gossip clusters through
// the running controllers, and returns once it is ready as Fleet.WaitReady
// means it (its index rebuilt from the topic), or ctx ends.
func (r *Replica) Start(ctx context.Context) error {
	admin, gossipAddrs := r.f.joinAddrs(r)
	r.mu.Lock()
	r.cfg.Raft.Bootstrap = false
	r.cfg.Raft.Join, r.cfg.Gossip.Join = admin, gossipAddrs
	r.mu.Unlock()
	if err := r.open(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", r.ID, err)
	}
	return r.f.WaitReady(ctx)
}

// close closes the controller if it runs (graceful, bounded by ctx).
func (r *Replica) close(ctx context.Context) error {
	r.mu.Lock()
	ctl := r.ctl
	r.ctl = nil
	r.mu.Unlock()
	if ctl == nil {
		return nil
	}
	return ctl.Close(ctx)
}
