package regional

import (
	"strings"

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
		if old, ok := g.reg.Get(p.Name); ok && old.Info().Static {
			continue
		}
		g.reg.Remove(p.Name)
		delete(g.pods, p.Name)
		g.m.discovered.WithLabelValues("left").Inc()
	}
}
