package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// finish seals and verifies the audit logs, fills the result, prints the
// summary (and the JSON) and closes the fleet.
func (r *runner) finish(ctx context.Context, foErr error, closeFleet func() error) (Result, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	auditDir := r.f.AuditDir()
	ar, aerr := sealAndVerify(actx, r.f, auditDir, filepath.Join(r.dir, "checkpoints.jsonl"))
	res := &r.res
	res.AuditRecords, res.AuditVerified, res.AuditIssues = ar.records, ar.verified, ar.problems

	st := r.st
	st.mu.Lock()
	res.Requests, res.Errors, res.CrossRegionForwards = st.requests, st.errs, st.forwards
	res.ResidencyDenials, res.ResidencyViolations, res.Refused, res.Probes = st.denials, st.violations, st.refused, st.probes
	res.HitRate = ratio(st.cached, st.prompt)
	all := sortedCopy(st.ttfts)
	res.ErrorKinds = maps.Clone(st.errorKinds)
	res.Events = slices.Clone(st.events)
	res.EUPHI = PHIView{Entered: maps.Clone(st.phi.entered), Served: maps.Clone(st.phi.served), Refused: st.phi.refused}
	l := st.loss
	res.ReplicaKills, res.ReplicaRestarts = l.kills, l.restarts
	res.RequestsFailedDuringReplicaLoss, res.InflightLostOnReplicaKill = l.failedDuring, l.inflightLost
	if !l.killed.IsZero() {
		// Equal windows either side of the kill: up to 15 s, and not
		// reaching past the failover (which moves traffic and caches).
		w := min(15*time.Second, l.killed.Sub(st.start))
		if r.cfg.FailoverAfter >= 0 {
			if fo := st.start.Add(r.cfg.FailoverAfter); fo.After(l.killed) {
				w = min(w, fo.Sub(l.killed))
			}
		}
		res.HitRateBeforeReplicaKill, _ = st.hitRateBetween(l.killed.Add(-w), l.killed)
		res.HitRateAfterReplicaKill, _ = st.hitRateBetween(l.killed, l.killed.Add(w))
	}
	st.mu.Unlock()
	res.TTFTP50Ms, res.TTFTP95Ms = percentile(all, 0.5), percentile(all, 0.95)

	r.writeSummary(ar, auditDir)
	var errs []error
	if r.cfg.JSON {
		b, err := json.Marshal(res)
		if err != nil {
			errs = append(errs, err)
		} else if _, err := fmt.Fprintf(r.out, "%s\n", b); err != nil {
			errs = append(errs, err)
		}
	}
	if aerr != nil {
		errs = append(errs, aerr)
	}
	if foErr != nil {
		errs = append(errs, foErr)
	}
	if err := closeFleet(); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return *res, fmt.Errorf("demo: %w", err)
	}
	return *res, nil
}

func (r *runner) writeSummary(ar auditReport, auditDir string) {
	res, cfg := &r.res, r.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "\nSummary after %.0f s\n", res.Elapsed.Seconds())
	if !cfg.NoTraffic {
		var kinds []string
		for _, k := range slices.Sorted(maps.Keys(res.ErrorKinds)) {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, res.ErrorKinds[k]))
		}
		errs := fmt.Sprint(res.Errors)
		if len(kinds) > 0 {
			errs += " (" + strings.Join(kinds, ", ") + ")"
		}
		fmt.Fprintf(&b, "  requests %d · errors %s · hit rate %.1f%% · TTFT p50 %s, p95 %s (client side, streamed)\n",
			res.Requests, errs, 100*res.HitRate, fmtMs(res.TTFTP50Ms), fmtMs(res.TTFTP95Ms))
		fmt.Fprintf(&b, "  cross-region forwards %d · residency denials %d · no healthy region %d · residency violations %d\n",
			res.CrossRegionForwards, res.ResidencyDenials, res.Refused, res.ResidencyViolations)
		fmt.Fprintf(&b, "  %s\n", phiLine(res.EUPHI))
		if res.ReplicaKills > 0 {
			fmt.Fprintf(&b, "  replica killed %d, started again %d · requests failed while it was down %d (in flight on it: %d lost) · hit rate %.1f%% before the kill, %.1f%% after\n",
				res.ReplicaKills, res.ReplicaRestarts, res.RequestsFailedDuringReplicaLoss, res.InflightLostOnReplicaKill,
				100*res.HitRateBeforeReplicaKill, 100*res.HitRateAfterReplicaKill)
		}
		for _, e := range res.Events {
			if strings.HasPrefix(e.Text, "error (") || strings.HasPrefix(e.Text, "RESIDENCY VIOLATION") {
				fmt.Fprintf(&b, "    %s %s\n", fmtAt(e.At), e.Text)
			}
		}
		if res.FailoverMovedS > 0 {
			fmt.Fprintf(&b, "  failover of %s: every request that may be served elsewhere was, %.3f s after the trigger returned\n",
				cfg.FailoverRegion, res.FailoverMovedS)
		}
	}
	verdict := "verified against the checkpoints committed in Raft"
	if !res.AuditVerified {
		verdict = "NOT verified"
		if len(ar.problems) > 0 {
			verdict += ": " + strings.Join(ar.problems[:min(3, len(ar.problems))], "; ")
		}
	}
	fmt.Fprintf(&b, "  audit: %d records, %s\n", res.AuditRecords, verdict)
	fmt.Fprintf(&b, "\nWhere to look next (kept in %s):\n", res.Dir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --kind cross_region\n", auditDir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --kind residency_denied --json\n", auditDir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --tenant eu-health --hmac-key-file %s\n", auditDir, r.keyFile)
	fmt.Fprintf(&b, "  meridian audit verify --dir %s --checkpoints %s\n", auditDir, ar.checkpoints)
	fmt.Fprintf(&b, "  logs: %s\n", filepath.Join(res.Dir, "demo.log"))
	fmt.Fprintf(&b, "While a demo runs (meridian demo --duration 0 keeps it up until Ctrl-C), these answered:\n")
	for _, l := range r.endpoints {
		fmt.Fprintf(&b, "%s\n", l)
	}
	_, _ = io.WriteString(r.disp, b.String())
}

// endpointLines lists where to look while the demo runs.
func endpointLines(infos []regionInfo, statusURL, token string) []string {
	var lines []string
	if statusURL != "" {
		lines = append(lines, "  status page  "+statusURL)
	}
	for _, ri := range infos {
		lines = append(lines, fmt.Sprintf("  %-11s  api %s  metrics %s/metrics  admin %s", ri.name, ri.url, ri.url, ri.admin))
		for _, rep := range ri.replicas[min(1, len(ri.replicas)):] {
			lines = append(lines, fmt.Sprintf("  %-11s  api %s  (replica %s)", "", rep.URL(), rep.ID))
		}
	}
	if len(infos) > 0 {
		lines = append(lines, fmt.Sprintf("  console      %s/ui#token=%s (each controller's admin address + /ui; the admin token opens it)", infos[0].admin, token))
		lines = append(lines, fmt.Sprintf("  failover     meridian failover status --admin %s --token %s", infos[0].admin, token))
	}
	return lines
}

func planText(cfg Config) string {
	if cfg.NoTraffic {
		return "no traffic generator"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sessions, %d controllers per region", cfg.Sessions, cfg.Replicas)
	if cfg.killsReplica() {
		fmt.Fprintf(&b, ", a replica of %s killed at t+%.0fs and started again at t+%.0fs", cfg.ReplicaKillRegion,
			cfg.ReplicaKillAfter.Seconds(), (cfg.ReplicaKillAfter + cfg.ReplicaDownFor).Seconds())
	}
	if cfg.FailoverAfter >= 0 {
		fmt.Fprintf(&b, ", failover of %s at t+%.0fs, recovery at t+%.0fs", cfg.FailoverRegion, cfg.FailoverAfter.Seconds(), (cfg.FailoverAfter + cfg.FailoverFor).Seconds())
	}
	if cfg.Duration > 0 {
		fmt.Fprintf(&b, ", end at t+%.0fs", cfg.Duration.Seconds())
	} else {
		b.WriteString(", until interrupted")
	}
	return b.String()
}
