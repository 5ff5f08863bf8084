package regional

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional/console"
)

// The console (package regional/console) is served on the admin listener:
// it shows operational data (the region's pods and load, the other
// regions, decisions with their rules), so it sits where an operator
// already authenticates. The page itself is static; its JSON needs the
// admin token. A controller without an admin listener (no Raft, no audit
// log) has no console.

// openConsole mounts the console on the admin API's mux and starts its
// sampler and, with the Raft tier, the watch of region states; run is the
// lifetime of both.
func (c *Controller) openConsole(run context.Context, admin *http.ServeMux, token string) error {
	con, err := console.New(console.Config{Controller: c.cfg.ControllerID, Region: c.cfg.Region, Gatherer: c.Metrics,
		Live: c.consoleLive, Now: c.now, Logger: c.log.With("component", "console")})
	if err != nil {
		return err
	}
	c.mr.console = con
	h := con.Handler(func(h http.Handler) http.Handler { return bearer(token, h) })
	admin.Handle("/ui", h)
	admin.Handle("/ui/", h)
	c.goRun("console", func() error { return con.Run(run) })
	if n := c.mr.node; n != nil {
		c.goRun("console-regions", func() error { return watchRegionStates(run, n, con.RecordFailover) })
	}
	return nil
}

// consoleAuditor is the audit log as the request path sees it, telling
// the console of each record once it is durable.
type consoleAuditor struct {
	Auditor
	con *console.Console
	now func() time.Time
}

func (a consoleAuditor) Append(ctx context.Context, e audit.Entry) error {
	if err := a.Auditor.Append(ctx, e); err != nil {
		return err
	}
	d := console.Decision{Time: a.now(), Kind: string(e.Kind), Origin: e.Origin, Region: e.Region, Pod: e.Pod, DataClass: e.DataClass,
		Rule: e.Rule, PolicyVersion: e.PolicyVersion, DecisionID: e.DecisionID}
	if len(e.Cost) > 0 {
		var cost struct {
			Reason   string  `json:"reason"`
			MarginMs float64 `json:"margin_ms"`
		}
		if json.Unmarshal(e.Cost, &cost) == nil {
			d.Reason, d.MarginMs = cost.Reason, cost.MarginMs
		}
	}
	a.con.Record(d)
	return nil
}

// watchRegionStates tells record of every change of a region's committed
// state until ctx is done: first the last change of each region already
// committed, then each change as the local state applies it.
func watchRegionStates(ctx context.Context, n *global.Node, record func(console.Failover)) error {
	seen := map[string]global.RegionStatus{}
	first := true
	for {
		changed := n.StateChanged()
		st := n.State()
		regions := st.Regions()
		slices.SortFunc(regions, func(a, b global.RegionStatus) int { return cmp.Compare(a.Index, b.Index) })
		for _, rs := range regions {
			old, known := seen[rs.Region]
			if known && old.Index == rs.Index {
				continue
			}
			seen[rs.Region] = rs
			if first && rs.Index == 0 {
				continue // never changed
			}
			f := console.Failover{Time: rs.Since, Region: rs.Region, To: rs.State.String(), Actor: rs.Actor, Reason: rs.Reason,
				Automatic: rs.Automatic, Index: rs.Index}
			switch {
			case known:
				f.From = old.State.String()
			case !first:
				f.From = global.RegionActive.String() // a region without a recorded change is active
			}
			record(f)
		}
		first = false
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// consoleLive is what the console shows of the controller now.
func (c *Controller) consoleLive(now time.Time) console.Live {
	mr := c.mr
	l := console.Live{Ready: c.Ready()}
	if mr.control != nil {
		l.PolicyVersion = mr.control.View().Version
	}
	pods := c.Registry.Pods()
	for _, p := range pods {
		info, load := p.Info(), p.Load()
		state := "serving"
		switch {
		case info.Endpoint == "":
			state = "no endpoint"
		case p.Lapsed():
			state = "lapsed"
		case p.Ejected(now):
			state = "ejected"
		}
		l.Pods = append(l.Pods, console.Pod{Name: p.Name, Hardware: info.Profile, Model: info.Model, State: state,
			InFlight: load.InFlight, PendingPrefill: load.PendingPrefill, KVUtil: load.KVUtil, Routed: load.Routed, EngineWaiting: load.EngineWaiting})
	}
	slices.SortFunc(l.Pods, func(a, b console.Pod) int { return strings.Compare(a.Name, b.Name) })

	local := console.Region{Name: c.cfg.Region, Local: true, Live: true, Routable: true, Pods: len(pods)}
	var st *global.State
	if mr.node != nil {
		st = mr.node.State()
		h := mr.node.Health()
		r := &console.Raft{State: h.RaftState, Leader: h.Leader, Term: h.Term, AppliedIndex: h.AppliedIndex, CommitIndex: h.CommitIndex,
			LastContactMs: float64(h.LastContact) / float64(time.Millisecond), Stale: h.Stale}
		if h.LastContact < 0 {
			r.LastContactMs = -1
		}
		voters := map[string]bool{}
		if servers, err := mr.node.Servers(); err == nil {
			for _, s := range servers {
				voters[s.ID] = s.Suffrage == "voter"
			}
		}
		reporting := map[string]bool{} // the region's other replicas: their load reports
		for _, rep := range c.Registry.PeerReports() {
			reporting[rep.Peer] = true
		}
		for _, m := range st.Members() {
			live := "alive"
			if m.ID != c.cfg.ControllerID && !reporting[m.ID] {
				var ok bool
				if live, ok = mr.liveness(m.ID); !ok {
					live = "unknown"
				}
			}
			r.Members = append(r.Members, console.Member{ID: m.ID, Region: m.Region, Voter: voters[m.ID], Liveness: live})
		}
		l.Raft = r
		local.State, local.Routable = st.RegionState(c.cfg.Region).String(), st.Routable(c.cfg.Region)
	}
	l.Regions = append(l.Regions, local)
	known := map[string]bool{c.cfg.Region: true}
	if g := mr.gossipRef.Load(); g != nil {
		gv := &console.Gossip{Isolated: g.Isolated()}
		for _, rv := range g.View().Regions {
			known[rv.Region] = true
			r := console.Region{Name: rv.Region, Live: rv.Live, Alive: rv.Alive, Suspect: rv.Suspect, Dead: rv.Dead,
				RTTMs: float64(rv.RTT) / float64(time.Millisecond), RTTSource: string(rv.RTTSource), Routable: true}
			for _, ctl := range rv.Controllers {
				r.Controllers = append(r.Controllers, ctl.Name)
			}
			if rv.Summary != nil {
				age := rv.Age(now).Seconds()
				r.SummaryAgeS, r.Pods = &age, rv.Summary.Totals().Pods
			}
			if st != nil {
				r.State, r.Routable = st.RegionState(rv.Region).String(), st.Routable(rv.Region)
			}
			gv.Alive, gv.Suspect, gv.Dead = gv.Alive+rv.Alive, gv.Suspect+rv.Suspect, gv.Dead+rv.Dead
			l.Regions = append(l.Regions, r)
		}
		for _, rep := range c.Registry.PeerReports() {
			gv.Replicas = append(gv.Replicas, console.Replica{ID: rep.Peer, ReportAgeS: max(time.Since(rep.At), 0).Seconds(), InFlight: rep.InFlight})
		}
		l.Gossip = gv
	}
	if st != nil {
		// Regions the Raft state knows but gossip does not (yet, or any
		// more): shown with their state, not live.
		for _, name := range st.KnownRegions() {
			if !known[name] {
				l.Regions = append(l.Regions, console.Region{Name: name, State: st.RegionState(name).String(), Routable: st.Routable(name)})
			}
		}
	}
	return l
}

// Console returns the controller's console, or nil without an admin
// listener.
func (c *Controller) Console() *console.Console {
	if c.mr == nil {
		return nil
	}
	return c.mr.console
}
