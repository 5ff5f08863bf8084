package demo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/residency"
)

// probe is one kind of request sent during a failover: a tenant and data
// class entering at a region.
type probe struct {
	entry, tenant, class string
	movable              bool // the policy allows a region other than the failed one
}

// probes lists every (entry region, tenant, data class) of the workloads.
func probes(p *residency.Policy, regions []string, failed string) []probe {
	var out []probe
	seen := map[string]bool{}
	for _, entry := range regions {
		for _, w := range workloads {
			k := entry + "|" + w.tenant + "|" + w.class
			if seen[k] {
				continue
			}
			seen[k] = true
			d := p.Evaluate(residency.Attributes{Tenant: w.tenant, DataClass: w.class, OriginRegion: entry})
			movable := slices.ContainsFunc(d.Regions(), func(r string) bool { return r != failed })
			out = append(out, probe{entry: entry, tenant: w.tenant, class: w.class, movable: movable})
		}
	}
	return out
}

// failover fails a region over through the Raft tier's admin API, measures
// how long until every probe that may be served elsewhere is, and recovers
// the region at recoverAt.
type failover struct {
	region    string
	admin     *global.Client
	states    func() map[string]global.RegionState // every controller's view of region's state
	c         *client
	st        *stats
	policy    *residency.Policy
	regions   []string
	now       func() time.Time
	probeWait time.Duration // give up on a probe after this long
}

// run returns the time from the trigger returning until every movable
// probe was answered outside the failed region (its response headers).
func (fo *failover) run(ctx context.Context, recoverAt time.Time) (time.Duration, error) {
	req := global.FailoverRequest{Region: fo.region, Reason: "meridian demo", Actor: "meridian-demo"}
	fo.st.event("failing %s over (meridian failover trigger --region %s)", fo.region, fo.region)
	fo.st.setDown(fo.region, true, fo.now())
	_, err := fo.admin.Trigger(ctx, req)
	if errors.Is(err, global.ErrStrandsTraffic) {
		// The cluster refuses a failover that leaves some traffic with no
		// allowed region, and says which; the demo shows it, then insists.
		fo.st.event("refused: %v", err)
		fo.st.event("failing %s over anyway (meridian failover trigger --region %s --force)", fo.region, fo.region)
		req.Force = true
		_, err = fo.admin.Trigger(ctx, req)
	}
	if err != nil {
		fo.st.setDown(fo.region, false, fo.now())
		fo.st.event("failover of %s failed: %v", fo.region, err)
		return 0, fmt.Errorf("failover trigger %s: %w", fo.region, err)
	}
	t0 := fo.now()
	moved, err := fo.measure(ctx, t0)
	if err != nil {
		fo.st.event("traffic did not move off %s: %v", fo.region, err)
	}

	t := time.NewTimer(recoverAt.Sub(fo.now()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	fo.st.event("recovering %s (meridian failover recover --region %s)", fo.region, fo.region)
	if _, rerr := fo.admin.Recover(rctx, req); rerr != nil {
		fo.st.event("recovery of %s failed: %v", fo.region, rerr)
		return moved, fmt.Errorf("failover recover %s: %w", fo.region, rerr)
	}
	r0 := fo.now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !fo.everywhere(global.RegionActive) {
		select {
		case <-tick.C:
		case <-rctx.Done():
			fo.st.setDown(fo.region, false, fo.now())
			return moved, fmt.Errorf("recover %s: not active on every controller: %w", fo.region, rctx.Err())
		}
	}
	fo.st.setDown(fo.region, false, fo.now())
	fo.st.event("%s active again on every controller %.3f s after recover returned; its sessions return", fo.region, fo.now().Sub(r0).Seconds())
	return moved, err
}

// everywhere reports whether every controller sees the region in state s.
func (fo *failover) everywhere(s global.RegionState) bool {
	for _, v := range fo.states() {
		if v != s {
			return false
		}
	}
	return true
}

// measure sends every movable probe until it is answered outside the failed
// region, and every other probe once (they must be refused).
func (fo *failover) measure(ctx context.Context, t0 time.Time) (time.Duration, error) {
	ps := probes(fo.policy, fo.regions, fo.region)
	var (
		mu    sync.Mutex
		moved time.Duration
		errs  []string
		wg    sync.WaitGroup
		phi   []string            // where the EU PHI probes entering the failed region went
		rest  = map[string]bool{} // where the other probes entering it went
	)
	for i, p := range ps {
		if !p.movable {
			continue
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			deadline := t0.Add(fo.probeWait)
			for n := 0; ; n++ {
				x, _ := fo.c.chat(ctx, p.entry, p.tenant, p.class, "", []message{{Role: "user", Content: fmt.Sprintf("probe %d: %s", n, text(rng, 12))}}, 1)
				if ctx.Err() != nil {
					return
				}
				x.probe = true
				fo.st.record(x)
				if x.err == "" && x.status == http.StatusOK && x.served != fo.region {
					mu.Lock()
					moved = max(moved, x.answered.Sub(t0))
					if p.entry == fo.region {
						if p.tenant == "eu-health" && p.class == "phi" {
							phi = append(phi, x.served)
						} else {
							rest[x.served] = true
						}
					}
					mu.Unlock()
					return
				}
				if fo.now().After(deadline) {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("%s/%s entering %s still served in %s after %v", p.tenant, p.class, p.entry, x.served, fo.probeWait))
					mu.Unlock()
					return
				}
				if !pause(ctx, nil, 10*time.Millisecond) {
					return
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return 0, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	n := 0
	for _, p := range ps {
		if p.movable {
			n++
		}
	}
	fo.st.event("traffic moved off %s %.3f s after the trigger returned: all %d probes that may be served elsewhere were", fo.region, moved.Seconds(), n)
	for _, served := range phi {
		d := fo.policy.Evaluate(residency.Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: fo.region})
		others := slices.Sorted(maps.Keys(rest))
		fo.st.event("EU PHI entering %s is served in %s (rule %s allows only %v), not with the rest of %s's traffic in %v",
			fo.region, served, d.Rule.Name, d.Regions(), fo.region, others)
	}
	// Requests the policy allows only in the failed region are refused,
	// never served elsewhere.
	for i, p := range ps {
		if p.movable {
			continue
		}
		rng := rand.New(rand.NewPCG(uint64(i), 8))
		x, _ := fo.c.chat(ctx, p.entry, p.tenant, p.class, "", []message{{Role: "user", Content: "probe: " + text(rng, 12)}}, 1)
		if ctx.Err() != nil {
			return moved, nil
		}
		x.probe = true
		fo.st.record(x)
		fo.st.event("%s/%s entering %s: %d %s: the policy allows only %s, so it is refused, not moved", p.tenant, p.class, p.entry, x.status, x.code, fo.region)
	}
	return moved, nil
}
