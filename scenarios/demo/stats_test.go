package demo

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func testStats(t *testing.T) (*stats, *time.Time) {
	t.Helper()
	p, err := residency.Parse("policy.yaml", fleet.ExamplePolicy)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return newStats(p, func() time.Time { return now }), &now
}

// Each outcome the client can see is classified as the policy says: a
// request served outside its allowed regions is a violation, a denial of an
// allowed request and a 503 while an allowed region was up are errors.
func TestRecordClassifies(t *testing.T) {
	st, now := testStats(t)
	t0 := *now
	ok := func(entry, served, tenant, class string, fwd bool) sample {
		return sample{sent: t0, done: t0, answered: t0, entry: entry, served: served, pod: served + "-pod-0", forwarded: fwd, status: 200,
			ttft: 20 * time.Millisecond, prompt: 100, cached: 50, tenant: tenant, class: class}
	}
	st.record(ok("us-east-1", "us-east-1", "acme", "internal", false))
	st.record(ok("us-east-1", "eu-west-1", "eu-health", "phi", true))
	if st.violations != 0 || st.errs != 0 || st.forwards != 1 || st.requests != 2 {
		t.Fatalf("allowed answers: violations %d errors %d forwards %d requests %d", st.violations, st.errs, st.forwards, st.requests)
	}
	// EU PHI served in the US, public US data served in the EU: violations.
	st.record(ok("us-east-1", "us-west-2", "eu-health", "phi", true))
	st.record(ok("us-west-2", "eu-west-1", "acme", "public", true))
	if st.violations != 2 {
		t.Fatalf("violations %d, want 2", st.violations)
	}
	// A denial of an embargoed tenant is expected; of an allowed one, an error.
	st.record(sample{entry: "eu-west-1", status: 451, code: codeDenied, tenant: "embargoed-3", class: "public"})
	if st.denials != 1 || st.errs != 0 {
		t.Fatalf("embargoed denial: denials %d errors %d", st.denials, st.errs)
	}
	st.record(sample{entry: "eu-west-1", status: 451, code: codeDenied, tenant: "acme", class: "public"})
	if st.denials != 2 || st.errs != 1 {
		t.Fatalf("denial of an allowed request: denials %d errors %d", st.denials, st.errs)
	}
	// 503 no healthy region: expected only while every allowed region was
	// failed over at some time during the request.
	phi503 := sample{sent: t0.Add(time.Second), done: t0.Add(2 * time.Second), entry: "us-east-1", status: 503, code: codeNoRegion, tenant: "eu-health", class: "phi"}
	st.record(phi503)
	if st.errs != 2 {
		t.Fatalf("503 with eu-west-1 up: errors %d, want 2", st.errs)
	}
	st.setDown("eu-west-1", true, t0.Add(1500*time.Millisecond))
	st.setDown("eu-west-1", false, t0.Add(5*time.Second))
	st.record(phi503)
	if st.errs != 2 || st.refused != 2 {
		t.Fatalf("503 while eu-west-1 was failed over: errors %d refused %d", st.errs, st.refused)
	}
	late := phi503
	late.sent, late.done = t0.Add(6*time.Second), t0.Add(7*time.Second)
	st.record(late)
	if st.errs != 3 {
		t.Fatalf("503 after recovery: errors %d, want 3", st.errs)
	}
	// Transport failures, answers without the region header, other statuses.
	st.record(sample{entry: "us-east-1", err: "connection refused", tenant: "acme", class: "public"})
	st.record(sample{entry: "us-east-1", status: 200, tenant: "acme", class: "public"})
	st.record(sample{entry: "us-east-1", status: 502, code: "upstream_failed", tenant: "acme", class: "public"})
	if st.errs != 6 {
		t.Fatalf("errors %d, want 6", st.errs)
	}
	// Probes count for violations, not in the traffic figures.
	p := ok("us-west-2", "eu-west-1", "acme", "public", true)
	p.probe = true
	st.record(p)
	if st.violations != 3 || st.probes != 1 || st.requests != 12 {
		t.Fatalf("probe: violations %d probes %d requests %d", st.violations, st.probes, st.requests)
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ p, want float64 }{{0.5, 5}, {0.95, 10}, {0.9, 9}, {0.1, 1}, {0, 1}, {1, 10}} {
		if got := percentile(v, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("empty")
	}
}

func TestRateWindow(t *testing.T) {
	var w rateWindow
	base := time.Unix(1000, 0)
	for s := 0; s < 20; s++ {
		for i := 0; i <= s%3; i++ { // 1, 2, 3, 1, 2, 3, ... per second
			w.add(base.Add(time.Duration(s) * time.Second))
		}
	}
	// Seconds 14..18 before 19.5: 3+1+2+3+1 = 10 events in 5 s.
	if got := w.rate(base.Add(19500 * time.Millisecond)); got != 2 {
		t.Fatalf("rate %v, want 2", got)
	}
	if got := w.rate(base.Add(60 * time.Second)); got != 0 {
		t.Fatalf("rate long after %v, want 0", got)
	}
}

// The table a person sees, from a fixed set of answers (golden file;
// go test -run TestTable -update rewrites it).
func TestTable(t *testing.T) {
	st, now := testStats(t)
	t0 := *now
	infos := []regionInfo{
		{name: "us-east-1", url: "http://127.0.0.1:1", admin: "http://127.0.0.1:2", pods: []podInfo{{"us-east-1-pod-0", "h100"}, {"us-east-1-pod-1", "h100"}}},
		{name: "us-west-2", url: "http://127.0.0.1:3", admin: "http://127.0.0.1:4", pods: []podInfo{{"us-west-2-pod-0", "h100"}}},
		{name: "eu-west-1", url: "http://127.0.0.1:5", admin: "http://127.0.0.1:6", pods: []podInfo{{"eu-west-1-pod-0", "h200"}}},
	}
	add := func(entry, served, pod, tenant, class string, ttftMs, prompt, cached int) {
		st.record(sample{sent: t0, done: t0, answered: t0, entry: entry, served: served, pod: pod, forwarded: entry != served, status: 200,
			ttft: time.Duration(ttftMs) * time.Millisecond, prompt: prompt, cached: cached, tenant: tenant, class: class})
	}
	for i := 0; i < 10; i++ {
		add("us-east-1", "us-east-1", "us-east-1-pod-0", "acme", "internal", 20+i, 4000, 3900)
		add("us-east-1", "us-east-1", "us-east-1-pod-1", "acme", "internal", 40+2*i, 2000, 1000)
	}
	add("us-west-2", "us-east-1", "us-east-1-pod-0", "acme", "internal", 30, 6000, 5800)
	add("us-west-2", "us-west-2", "us-west-2-pod-0", "globex", "public", 150, 800, 0)
	add("us-east-1", "eu-west-1", "eu-west-1-pod-0", "eu-health", "phi", 90, 1200, 1100)
	add("eu-west-1", "eu-west-1", "eu-west-1-pod-0", "eu-health", "phi", 25, 1200, 1150)
	st.record(sample{entry: "eu-west-1", status: 451, code: codeDenied, tenant: "embargoed-1", class: "public"})
	st.event("failing us-west-2 over (meridian failover trigger --region us-west-2)")
	st.setDown("us-west-2", true, t0)
	*now = t0.Add(3 * time.Second)
	snap := st.snapshot(infos, func(r string) string {
		if r == "us-west-2" {
			return "failed"
		}
		return "active"
	})
	snap.AuditCounts = map[string]int64{"cross_region": 2, "forwarded_in": 2, "residency_denied": 1}
	snap.Regions[0].Replicas = []ReplicaView{{ID: "ctl-us-east-1-1", State: "ready"}, {ID: "ctl-us-east-1-2", State: "down"}}
	snap.Regions[1].Replicas = []ReplicaView{{ID: "ctl-us-west-2-1", State: "ready"}, {ID: "ctl-us-west-2-2", State: "ready"}}
	snap.Regions[2].Replicas = []ReplicaView{{ID: "ctl-eu-west-1-1", State: "ready"}, {ID: "ctl-eu-west-1-2", State: "starting"}}
	got := strings.Join(table(snap, []string{"Meridian demo · test"}, 8), "\n") + "\n"
	path := filepath.Join("testdata", "table.txt")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("table differs from %s (rerun with -update if intended):\n%s", path, got)
	}
}

// The replica kill's figures: a failed request that was in flight on the
// killed replica (sent to it, or answered by its pod, before the kill) is
// lost with it and is no error; any other failure while it is down is
// both; after it is back, failures are errors again. Hit rates are taken
// in windows either side of the kill.
func TestReplicaLossAccounting(t *testing.T) {
	st, now := testStats(t)
	t0 := *now
	ok := func(at time.Time, prompt, cached int) sample {
		return sample{sent: at, done: at, answered: at, entry: "us-east-1", served: "us-east-1", pod: "us-east-1-pod-0", status: 200,
			ttft: 20 * time.Millisecond, prompt: prompt, cached: cached, tenant: "acme", class: "internal", replica: "ctl-us-east-1-1"}
	}
	cut := func(sent, done time.Time, replica, controller string) sample {
		return sample{sent: sent, done: done, entry: "us-east-1", tenant: "acme", class: "internal", replica: replica, controller: controller,
			err: "stream: unexpected EOF"}
	}
	st.record(ok(t0.Add(time.Second), 1000, 900))
	kill := t0.Add(10 * time.Second)
	st.replicaKilled("ctl-us-east-1-2", kill)
	st.record(cut(kill.Add(-time.Second), kill.Add(time.Millisecond), "ctl-us-east-1-2", ""))                // entered there
	st.record(cut(kill.Add(-time.Second), kill.Add(time.Millisecond), "ctl-us-east-1-1", "ctl-us-east-1-2")) // its pod answered
	st.record(cut(kill.Add(time.Second), kill.Add(2*time.Second), "ctl-us-east-1-1", ""))                    // another failure
	st.record(ok(kill.Add(2*time.Second), 1000, 700))
	if st.loss.inflightLost != 2 || st.loss.failedDuring != 1 || st.errs != 1 {
		t.Fatalf("during the loss: in flight lost %d, failed during %d, errors %d", st.loss.inflightLost, st.loss.failedDuring, st.errs)
	}
	st.replicaRestarted("ctl-us-east-1-2", kill.Add(3*time.Second), kill.Add(5*time.Second))
	st.record(cut(kill.Add(6*time.Second), kill.Add(7*time.Second), "ctl-us-east-1-2", ""))
	if st.loss.inflightLost != 2 || st.loss.failedDuring != 1 || st.errs != 2 || st.loss.kills != 1 || st.loss.restarts != 1 {
		t.Fatalf("after the restart: %+v, errors %d", st.loss, st.errs)
	}
	before, n := st.hitRateBetween(kill.Add(-10*time.Second), kill)
	after, m := st.hitRateBetween(kill, kill.Add(10*time.Second))
	if n != 1 || m != 1 || before != 0.9 || after != 0.7 {
		t.Fatalf("hit rates %v (%d) before, %v (%d) after", before, n, after, m)
	}
}
