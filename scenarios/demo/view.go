package demo

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// Figures are the live figures of a region, a pod or the whole system.
// Percentiles and the rate are over the recent answers (the last 2,048, the
// last 5 s); counts since the start.
type Figures struct {
	Requests  int64   `json:"requests"` // answered with 200 here
	RatePerS  float64 `json:"rate_per_s"`
	HitRate   float64 `json:"hit_rate"` // cached prompt tokens / prompt tokens
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP95Ms float64 `json:"ttft_p95_ms"`
}

// PodView is one pod.
type PodView struct {
	Name     string `json:"name"`
	Hardware string `json:"hardware"`
	Figures
}

// ReplicaView is one controller of a region.
type ReplicaView struct {
	ID    string `json:"id"`
	URL   string `json:"url"`
	State string `json:"state"` // ready, starting (not ready yet: index catching up), down
}

// RegionView is one region: what was served there, and what entered there.
type RegionView struct {
	Name         string        `json:"name"`
	State        string        `json:"state"` // as its own controller sees it
	Replicas     []ReplicaView `json:"replicas"`
	URL          string        `json:"url"`
	AdminURL     string        `json:"admin_url"`
	ConsoleURL   string        `json:"console_url"` // the controller's console (admin listener, admin token)
	MetricsURL   string        `json:"metrics_url"`
	ForwardedIn  int64         `json:"forwarded_in"`      // served here, entered elsewhere
	ForwardedOut int64         `json:"forwarded_out"`     // entered here, served elsewhere
	Denied       int64         `json:"residency_denials"` // entered here, 451
	Refused      int64         `json:"no_healthy_region"` // entered here, 503
	Errors       int64         `json:"errors"`            // entered here
	Figures
	Pods []PodView `json:"pods"`
}

// Totals are the whole system's figures.
type Totals struct {
	Figures
	Errors     int64 `json:"errors"`
	Forwards   int64 `json:"cross_region_forwards"`
	Denials    int64 `json:"residency_denials"`
	Refused    int64 `json:"no_healthy_region"`
	Violations int64 `json:"residency_violations"`
	Sent       int64 `json:"sent"`   // generator requests, whatever their outcome
	Probes     int64 `json:"probes"` // failover probes
}

// PHIView follows the EU health tenant's PHI.
type PHIView struct {
	Entered        map[string]int64 `json:"entered"` // by entry region
	Served         map[string]int64 `json:"served"`  // by serving region
	Refused        int64            `json:"refused"`
	DuringFailover struct {
		Answered  int64 `json:"answered"`
		InEU      int64 `json:"in_eu"`
		Elsewhere int64 `json:"elsewhere"`
		Refused   int64 `json:"refused"`
	} `json:"during_failover"`
}

// Snapshot is everything the table and the status page show.
type Snapshot struct {
	ElapsedS       float64          `json:"elapsed_s"`
	Phase          string           `json:"phase"`
	Plan           string           `json:"plan"`
	Dir            string           `json:"dir"`
	Regions        []RegionView     `json:"regions"`
	Totals         Totals           `json:"totals"`
	EUPHI          PHIView          `json:"eu_phi"`
	Events         []Event          `json:"events"`
	Decisions      []Decision       `json:"decisions"`
	AuditCounts    map[string]int64 `json:"audit_counts"`
	FailoverRegion string           `json:"failover_region,omitempty"`
}

// podInfo is a pod's static description.
type podInfo struct{ name, hardware string }

// regionInfo is a region's static description.
type regionInfo struct {
	name, url, admin string
	pods             []podInfo
	replicas         []*fleet.Replica
}

// replicasUp is "ready/all" of a region's controllers.
func replicasUp(rs []ReplicaView) string {
	if len(rs) == 0 {
		return ""
	}
	n := 0
	for _, r := range rs {
		if r.State == "ready" {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, len(rs))
}

func figures(t *tally, now time.Time) Figures {
	if t == nil {
		return Figures{}
	}
	s := sortedCopy(t.ttft.vals)
	return Figures{Requests: t.served, RatePerS: t.rate.rate(now), HitRate: ratio(t.cached, t.prompt),
		TTFTP50Ms: percentile(s, 0.5), TTFTP95Ms: percentile(s, 0.95)}
}

// snapshot builds the view of the figures now.
func (s *stats) snapshot(regions []regionInfo, state func(region string) string) Snapshot {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := Snapshot{ElapsedS: s.elapsed(now), Events: slices.Clone(s.events)}
	for _, ri := range regions {
		t := s.regions[ri.name]
		rv := RegionView{Name: ri.name, State: state(ri.name), URL: ri.url, AdminURL: ri.admin, ConsoleURL: ri.admin + "/ui", MetricsURL: ri.url + "/metrics",
			Figures: figures(t, now)}
		if t != nil {
			rv.ForwardedIn, rv.ForwardedOut, rv.Denied, rv.Refused, rv.Errors = t.fwdIn, t.fwdOut, t.denied, t.refused, t.errs
		}
		for _, p := range ri.pods {
			rv.Pods = append(rv.Pods, PodView{Name: p.name, Hardware: p.hardware, Figures: figures(s.pods[p.name], now)})
		}
		snap.Regions = append(snap.Regions, rv)
	}
	r := sortedCopy(s.recent.vals)
	snap.Totals = Totals{Figures: Figures{Requests: int64(len(s.ttfts)), RatePerS: s.rate.rate(now), HitRate: ratio(s.cached, s.prompt),
		TTFTP50Ms: percentile(r, 0.5), TTFTP95Ms: percentile(r, 0.95)},
		Errors: s.errs, Forwards: s.forwards, Denials: s.denials, Refused: s.refused, Violations: s.violations,
		Sent: s.requests, Probes: s.probes}
	snap.EUPHI = PHIView{Entered: maps.Clone(s.phi.entered), Served: maps.Clone(s.phi.served), Refused: s.phi.refused}
	f := &snap.EUPHI.DuringFailover
	f.Answered, f.InEU, f.Elsewhere, f.Refused = s.phi.inFailure.entered, s.phi.inFailure.servedEU, s.phi.inFailure.elsewhere, s.phi.inFailure.refused
	return snap
}

func fmtMs(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1fms", v)
	case v < 10000:
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fs", v/1000)
}

func fmtPct(v float64, n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func fmtAt(s float64) string { return fmt.Sprintf("t+%.1fs", s) }

// table renders the snapshot as lines of text.
func table(s Snapshot, header []string, maxEvents int) []string {
	lines := slices.Clone(header)
	lines = append(lines, "", fmt.Sprintf("%-22s %-10s %-5s %7s %6s %6s %9s %8s %7s %7s %7s  %s", "REGION / POD", "STATE", "HW", "SERVED", "REQ/S", "HIT", "TTFT p50", "p95", "FWD IN", "FWD OUT", "DENIED", "CTL"))
	for _, r := range s.Regions {
		lines = append(lines, fmt.Sprintf("%-22s %-10s %-5s %7d %6.1f %6s %9s %8s %7d %7d %7d  %s", r.Name, r.State, "", r.Requests, r.RatePerS,
			fmtPct(r.HitRate, r.Requests), fmtMs(r.TTFTP50Ms), fmtMs(r.TTFTP95Ms), r.ForwardedIn, r.ForwardedOut, r.Denied, replicasUp(r.Replicas)))
		for _, rp := range r.Replicas {
			if rp.State != "ready" {
				lines = append(lines, fmt.Sprintf("  controller %s %s", rp.ID, rp.State))
			}
		}
		for _, p := range r.Pods {
			lines = append(lines, fmt.Sprintf("  %-20s %-10s %-5s %7d %6.1f %6s %9s %8s", p.Name, "", p.Hardware, p.Requests, p.RatePerS,
				fmtPct(p.HitRate, p.Requests), fmtMs(p.TTFTP50Ms), fmtMs(p.TTFTP95Ms)))
		}
	}
	t := s.Totals
	lines = append(lines, fmt.Sprintf("%-22s %-10s %-5s %7d %6.1f %6s %9s %8s %7d %7d %7d", "all regions", "", "", t.Requests, t.RatePerS,
		fmtPct(t.HitRate, t.Requests), fmtMs(t.TTFTP50Ms), fmtMs(t.TTFTP95Ms), t.Forwards, t.Forwards, t.Denials))
	lines = append(lines, "",
		fmt.Sprintf("requests sent %d · cross-region forwards %d · residency denials (451) %d · no healthy region (503) %d · errors %d · residency violations %d",
			t.Sent, t.Forwards, t.Denials, t.Refused, t.Errors, t.Violations),
		phiLine(s.EUPHI))
	if f := s.EUPHI.DuringFailover; f.Answered+f.Refused > 0 {
		lines = append(lines, fmt.Sprintf("EU PHI while a region was failed over: %d answered, %d in eu-west-1, %d elsewhere, %d refused (503)",
			f.Answered, f.InEU, f.Elsewhere, f.Refused))
	}
	if len(s.AuditCounts) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(s.AuditCounts)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, s.AuditCounts[k]))
		}
		lines = append(lines, "audit records: "+strings.Join(parts, " · "))
	}
	if maxEvents > 0 && len(s.Events) > 0 {
		lines = append(lines, "", "events")
		ev := s.Events
		if len(ev) > maxEvents {
			ev = ev[len(ev)-maxEvents:]
		}
		for _, e := range ev {
			lines = append(lines, fmt.Sprintf("  %-9s %s", fmtAt(e.At), e.Text))
		}
	}
	return lines
}

func phiLine(p PHIView) string {
	var entered, served []string
	for _, r := range regionNames {
		entered = append(entered, fmt.Sprintf("%s %d", r, p.Entered[r]))
	}
	var elsewhere int64
	for r, n := range p.Served {
		if r != "eu-west-1" {
			elsewhere += n
		}
	}
	served = append(served, fmt.Sprintf("eu-west-1 %d", p.Served["eu-west-1"]), fmt.Sprintf("elsewhere %d", elsewhere))
	return fmt.Sprintf("EU PHI (eu-health/phi) entered %s -> served %s, refused %d", strings.Join(entered, ", "), strings.Join(served, ", "), p.Refused)
}

// screen draws the table on a terminal (redrawn in place) or as plain
// periodic lines.
type screen struct {
	w        io.Writer
	terminal bool
	drawn    bool
	events   int // events already printed (plain mode)
	lastLine time.Time
}

const (
	ansiHome      = "\x1b[H"
	ansiClear     = "\x1b[2J"
	ansiClearLine = "\x1b[K"
	ansiClearDown = "\x1b[J"
	ansiHide      = "\x1b[?25l"
	ansiShow      = "\x1b[?25h"
)

// draw shows the snapshot.
func (sc *screen) draw(s Snapshot, header []string, now time.Time, force bool) {
	if sc.w == nil {
		return
	}
	if sc.terminal {
		var b strings.Builder
		if !sc.drawn {
			b.WriteString(ansiHide + ansiClear)
			sc.drawn = true
		}
		b.WriteString(ansiHome)
		for _, l := range table(s, header, 8) {
			b.WriteString(l)
			b.WriteString(ansiClearLine + "\n")
		}
		b.WriteString(ansiClearDown)
		_, _ = io.WriteString(sc.w, b.String())
		return
	}
	// Plain: new events as they come; the figures every 5 s.
	var b strings.Builder
	for _, e := range s.Events[min(sc.events, len(s.Events)):] {
		fmt.Fprintf(&b, "%-9s event: %s\n", fmtAt(e.At), e.Text)
	}
	sc.events = len(s.Events)
	if force || now.Sub(sc.lastLine) >= 5*time.Second {
		sc.lastLine = now
		at := fmtAt(s.ElapsedS)
		for _, r := range s.Regions {
			fmt.Fprintf(&b, "%-9s %-10s %-10s served %d (%.1f/s) hit %s ttft p50 %s p95 %s fwd-in %d fwd-out %d denied %d controllers %s\n", at, r.Name, r.State,
				r.Requests, r.RatePerS, fmtPct(r.HitRate, r.Requests), fmtMs(r.TTFTP50Ms), fmtMs(r.TTFTP95Ms), r.ForwardedIn, r.ForwardedOut, r.Denied,
				replicasUp(r.Replicas))
		}
		t := s.Totals
		fmt.Fprintf(&b, "%-9s %-21s sent %d served %d hit %s ttft p50 %s p95 %s cross-region %d denied %d errors %d violations %d\n", at, "all",
			t.Sent, t.Requests, fmtPct(t.HitRate, t.Requests), fmtMs(t.TTFTP50Ms), fmtMs(t.TTFTP95Ms), t.Forwards, t.Denials, t.Errors, t.Violations)
		fmt.Fprintf(&b, "%-9s %s\n", at, phiLine(s.EUPHI))
	}
	_, _ = io.WriteString(sc.w, b.String())
}

// done restores the terminal.
func (sc *screen) done() {
	if sc.w != nil && sc.terminal && sc.drawn {
		_, _ = io.WriteString(sc.w, ansiShow)
	}
}
