package regional

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/route"
)

// Pods come from three sources: static configuration, announcements on the
// region's topic (PodUp, PodDown), and discovery (pods.discovery). This file
// holds what the controller does with discovery's snapshots.

// ApplyDiscovered applies what changed between two discovery snapshots:
// pods that joined or changed are registered with their endpoints (a pod
// already known keeps its announced epoch and, where discovery names none,
// its model and profile); pods that left are removed from the registry and
// the index (their blocks are swept later), unless static. It runs under
// the ingester's lock, so it never interleaves with an announcement of the
// same pod.
func (g *Ingester) ApplyDiscovered(d discovery.Delta) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range append(d.Joined, d.Changed...) {
		info := route.PodInfo{Name: p.Name, Endpoint: strings.TrimRight(p.Endpoint, "/"), Model: p.Model, Profile: p.Profile}
		if old, ok := g.reg.Get(p.Name); ok {
			cur := old.Info()
			if cur.Static {
				continue // configuration wins over discovery
			}
			info.Epoch = cur.Epoch
			if info.Model == "" {
				info.Model = cur.Model
			}
			if info.Profile == "" {
				info.Profile = cur.Profile
			}
		}
		if _, _, err := g.reg.Upsert(info); err != nil {
			g.reject("registry_full", err)
			continue
		}
		g.discovered[p.Name] = true
		g.m.discovered.WithLabelValues("joined").Inc()
	}
	for _, p := range d.Left {
		delete(g.discovered, p.Name)
		delete(g.leases, p.Name)
		if old, ok := g.reg.Get(p.Name); ok && old.Info().Static {
			continue
		}
		g.forgetPodLocked(p.Name)
		g.m.discovered.WithLabelValues("left").Inc()
	}
}

// lease is a pod's last announcement that carried a TTL (PodUp.TTL).
type lease struct {
	at       time.Time     // when the last PodUp was applied
	ttl      time.Duration // how long it holds
	lapsedAt time.Time     // when the pod lapsed (zero: it has not)
}

// renewLocked records an announcement of p: with a TTL it holds that long
// (and a lapsed pod is restored); without one it holds until a PodDown.
func (g *Ingester) renewLocked(p *route.Pod, ttl time.Duration) {
	if ttl <= 0 {
		delete(g.leases, p.Name)
		p.SetLapsed(false)
		return
	}
	g.leases[p.Name] = &lease{at: g.now(), ttl: ttl}
	if p.Lapsed() {
		p.SetLapsed(false)
		g.m.podExpiry.WithLabelValues("restored").Inc()
		g.log.Info("lapsed pod announced itself again", "pod", p.Name)
	}
}

// ExpirePods removes, in two phases, the pods whose announcements ran out
// and that do not answer: a pod not announced again within its TTL and not
// heard from (no scrape or request answered) within its TTL lapses — it is
// no candidate and does not count as serving, but keeps its slot and its
// blocks, and an announcement or an answer restores it; a pod lapsed for a
// further TTL is removed from the registry and the index (its blocks are
// swept). A pod that stopped announcing but answers stays. Static pods and
// pods that discovery finds are held by those sources and never expire.
func (g *Ingester) ExpirePods() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for name, l := range g.leases {
		p, ok := g.reg.Get(name)
		if !ok {
			delete(g.leases, name)
			continue
		}
		if p.Info().Static || g.discovered[name] {
			continue
		}
		announced := now.Sub(l.at) <= l.ttl
		answered := !p.LastContact().IsZero() && now.Sub(p.LastContact()) <= l.ttl
		switch {
		case announced || answered:
			if !l.lapsedAt.IsZero() {
				l.lapsedAt = time.Time{}
				p.SetLapsed(false)
				g.m.podExpiry.WithLabelValues("restored").Inc()
				g.log.Info("lapsed pod answers again", "pod", name)
			}
		case l.lapsedAt.IsZero():
			l.lapsedAt = now
			p.SetLapsed(true)
			g.m.podExpiry.WithLabelValues("lapsed").Inc()
			g.log.Warn("pod lapsed: not announced and not answering within its TTL; no more requests go to it",
				"pod", name, "ttl", l.ttl, "announced_ago", now.Sub(l.at))
		case now.Sub(l.lapsedAt) >= l.ttl:
			g.forgetPodLocked(name)
			g.m.podExpiry.WithLabelValues("removed").Inc()
			g.log.Warn("pod removed: lapsed for a further TTL", "pod", name, "ttl", l.ttl)
		}
	}
}

// RunLeases expires pods (ExpirePods) every interval until ctx ends.
func (g *Ingester) RunLeases(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		g.ExpirePods()
	}
}

// StaticChange is what ApplyStatic did.
type StaticChange struct {
	Added, Changed, Removed []string
}

// Empty reports whether nothing changed.
func (s StaticChange) Empty() bool { return len(s.Added)+len(s.Changed)+len(s.Removed) == 0 }

// ApplyStatic replaces the static pods listed by old (pods.static in force)
// with next (a reload's): pods added are registered, pods whose entry
// changed take the new entry (their load accounting and announced epoch
// carry on, so their blocks stay), and pods no longer listed leave the
// registry and the index (their blocks are swept later), unless discovery
// has found them, in which case they stay as discovered pods. A pod that
// was known from its announcements and is now listed becomes static. It
// runs under the ingester's lock, so it never interleaves with an
// announcement. A full registry leaves the pods it could not add out and
// is returned; the rest is applied.
func (g *Ingester) ApplyStatic(old, next []route.PodInfo) (StaticChange, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ch StaticChange
	var errs []error
	prev := make(map[string]route.PodInfo, len(old))
	for _, p := range old {
		prev[p.Name] = p
	}
	listed := make(map[string]bool, len(next))
	for _, p := range next {
		listed[p.Name] = true
		was, known := prev[p.Name]
		if known && was == p {
			continue
		}
		info := p
		info.Static = true
		if cur, ok := g.reg.Get(p.Name); ok {
			info.Epoch = cur.Info().Epoch
		}
		if _, _, err := g.reg.Upsert(info); err != nil {
			errs = append(errs, fmt.Errorf("static pod %s: %w", p.Name, err))
			continue
		}
		if known {
			ch.Changed = append(ch.Changed, p.Name)
		} else {
			ch.Added = append(ch.Added, p.Name)
		}
	}
	for _, p := range old {
		if listed[p.Name] {
			continue
		}
		ch.Removed = append(ch.Removed, p.Name)
		cur, ok := g.reg.Get(p.Name)
		if !ok {
			continue
		}
		if g.discovered[p.Name] {
			info := cur.Info()
			info.Static = false
			if _, _, err := g.reg.Upsert(info); err != nil {
				errs = append(errs, fmt.Errorf("static pod %s: %w", p.Name, err))
			}
			continue
		}
		g.forgetPodLocked(p.Name)
	}
	return ch, errors.Join(errs...)
}
