package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// startDrillFleet starts a 3-region fleet (us-east-1, us-west-2, eu-west-1,
// the example policy) for the drill tests. Its cleanup waits for
// memberlist's probe goroutines, which outlive Close by up to a probe
// timeout, so this package's goleak check stays strict.
func startDrillFleet(t *testing.T, fc fleet.Config) *fleet.Fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-region fleet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	fc.Dir = t.TempDir()
	f, err := fleet.Start(ctx, fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.Close(cctx); err != nil {
			t.Errorf("fleet close: %v", err)
		}
		waitGoroutinesGone(t, "memberlist.(*Memberlist).probeNode", 20*time.Second)
	})
	return f
}

// waitGoroutinesGone waits (bounded) until no goroutine's stack mentions fn.
func waitGoroutinesGone(t *testing.T, fn string, limit time.Duration) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte(fn)) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines in %s still running %v after the fleet closed", fn, limit)
			return
		}
		<-tick.C
	}
}

func fleetDrillConfig(f *fleet.Fleet, region, admin string) Config {
	cfg := DefaultConfig()
	cfg.Admin = f.Region(admin).Controller.AdminURL()
	cfg.Token = f.AdminToken
	cfg.Controllers = map[string]string{}
	for _, r := range f.Regions {
		cfg.Controllers[r.Name] = r.Controller.URL()
	}
	cfg.Region = region
	cfg.HTTP = f.HTTP // https, with the fleet's CA
	cfg.Hold = time.Second
	cfg.MovedTimeout, cfg.BackTimeout = 30*time.Second, 30*time.Second
	// A probe is a TLS request through the race detector on a loaded
	// machine: give it room (the default 5 s is for real fleets).
	cfg.ProbeTimeout = 20 * time.Second
	// The drill's timing targets (5 s to move, 10 s to come back) are
	// wall-clock figures for a real fleet; on a loaded test machine they
	// measure the machine. Here they are only the outer bound: the test
	// checks that traffic moves and comes back, never served outside the
	// policy, and the benchmark figures come from real drills.
	cfg.TargetMoved, cfg.TargetBack = cfg.MovedTimeout, cfg.BackTimeout
	return cfg
}

func runFleetDrill(t *testing.T, f *fleet.Fleet, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed {
		t.Fatalf("drill of %s failed:\n%s", cfg.Region, md.String())
	}
	t.Logf("drill of %s: moved %v (target %v), back %v (target %v), trigger call %v, recover call %v, %d requests, %d errors, %d violations",
		cfg.Region, rep.Moved.D(), cfg.TargetMoved, rep.Back.D(), cfg.TargetBack, rep.TriggerLatency.D(), rep.RecoverLatency.D(),
		rep.Requests, rep.Errors, rep.Violations)
	// Whatever the verdict says, check the facts it rests on.
	if rep.Violations != 0 || rep.Moved == nil || rep.Moved.D() > cfg.TargetMoved || rep.Back == nil || rep.Back.D() > cfg.TargetBack {
		t.Fatalf("passed with violations %d, moved %v, back %v", rep.Violations, rep.Moved, rep.Back)
	}
	var kinds []string
	for _, e := range rep.Timeline {
		kinds = append(kinds, e.Kind)
	}
	for _, want := range []string{EventStart, EventBaseline, EventTriggerSent, EventTriggerReturned, EventFirstMoved, EventMoved,
		EventRecoverSent, EventRecoverReturned, EventFirstBack, EventBack, EventEnd} {
		if !slices.Contains(kinds, want) {
			t.Errorf("timeline lacks %s: %v", want, kinds)
		}
	}
	for i := 1; i < len(rep.Timeline); i++ {
		if rep.Timeline[i].At.Before(rep.Timeline[i-1].At) {
			t.Errorf("timeline out of order at %d: %+v", i, rep.Timeline[i])
		}
	}
	if !strings.Contains(md.String(), "| moved |") || !strings.Contains(md.String(), "| back |") {
		t.Errorf("markdown lacks the timeline:\n%s", md.String())
	}
	// The region is active again everywhere.
	for _, r := range f.Regions {
		if !r.Controller.Global().State().Routable(cfg.Region) {
			t.Errorf("%s does not see %s routable after the drill", r.Name, cfg.Region)
		}
	}
	return rep
}

// servedIn lists the regions a probe was served in during a phase.
func servedIn(p ProbeReport, phase string) []string {
	var out []string
	for _, o := range p.Outcomes {
		if r, ok := strings.CutPrefix(o.Outcome, "200 "); ok && o.Phase == phase && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

var durationRE = regexp.MustCompile(`\d+(\.\d+)?(ns|µs|ms|s|m)\b`)

// TestDrillOnFleet runs drills on a real 3-region fleet (controllers, Raft,
// gossip, Kafka-protocol broker, engine simulators on loopback).
func TestDrillOnFleet(t *testing.T) {
	f := startDrillFleet(t, fleet.Config{})

	// us-east-1 fails: its public and pii traffic must all go to us-west-2
	// (same zone). gorgo's remote-share cap does not apply to a region that
	// cannot serve (it once did, and this drill caught it: about half of the
	// moved traffic was refused).
	t.Run("us-east-1", func(t *testing.T) {
		cfg := fleetDrillConfig(f, "us-east-1", "us-west-2")
		cfg.Hold = 3 * time.Second // long enough for the share window to fill
		rep := runFleetDrill(t, f, cfg)
		if rep.Errors != 0 || rep.Violations != 0 || !rep.Passed {
			t.Fatalf("drill of us-east-1: passed %v, %d errors, %d violations, failed checks %v; errors: %v", rep.Passed, rep.Errors, rep.Violations, failedChecks(rep), probeErrors(rep))
		}
	})

	// us-west-2 fails: its public and pii traffic moves to us-east-1 (same
	// zone) within the target and comes back; nothing is served outside the
	// policy. The drill talks to eu-west-1's admin API (any controller).
	t.Run("us-west-2", func(t *testing.T) {
		cfg := fleetDrillConfig(f, "us-west-2", "eu-west-1")
		rep := runFleetDrill(t, f, cfg)
		var affected []string
		for _, p := range rep.Probes {
			if p.Affected {
				affected = append(affected, p.Probe)
				if got := servedIn(p, "failed"); !slices.Contains(got, "us-east-1") {
					t.Errorf("%s while us-west-2 failed: served in %v, want us-east-1", p.Probe, got)
				}
				if p.Moved == nil || p.Back == nil {
					t.Errorf("%s: moved %v back %v", p.Probe, p.Moved, p.Back)
				}
			}
		}
		slices.Sort(affected)
		if want := []string{"us-west-2:dr-drill:pii", "us-west-2:dr-drill:public"}; !slices.Equal(affected, want) {
			t.Errorf("affected probes %v, want %v", affected, want)
		}
		// The verdict, with the timings masked, as a golden file.
		var md bytes.Buffer
		if err := rep.WriteMarkdown(&md); err != nil {
			t.Fatal(err)
		}
		s := md.String()
		s = s[strings.Index(s, "## Verdict"):strings.Index(s, "## Timeline")]
		checkGolden(t, "testdata/fleet-us-west-2.verdict.md", []byte(durationRE.ReplaceAllString(s, "DUR")))
		// The JSON report reads back.
		var js bytes.Buffer
		if err := rep.WriteJSON(&js); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Moved == nil || back.Moved.D().Round(time.Microsecond) != rep.Moved.D().Round(time.Microsecond) {
			t.Fatalf("JSON round trip: %v %v", err, back.Moved)
		}
	})

	// eu-west-1 fails: the EU health tenant's PHI (and pii entering in the
	// EU) can be served nowhere else, so every origin gets 503
	// residency_no_healthy_region until it is back — never an answer from
	// the US. Public data entering in the EU moves to the US.
	t.Run("eu-west-1", func(t *testing.T) {
		cfg := fleetDrillConfig(f, "eu-west-1", "us-east-1")
		// Failing eu-west-1 empties the EU zone: the cluster refuses
		// unless forced, naming the stranded traffic; the drill forces it.
		_, err := global.NewClient(cfg.Admin, cfg.Token, f.HTTP).Trigger(context.Background(), global.FailoverRequest{Region: "eu-west-1"})
		if !errors.Is(err, global.ErrStrandsTraffic) || !strings.Contains(err.Error(), "eu-health-phi") {
			t.Fatalf("emptying the EU zone without force: %v", err)
		}
		cfg.Force = true
		rep := runFleetDrill(t, f, cfg)
		n := 0
		for _, p := range rep.Probes {
			if p.Tenant == "eu-health" || (p.Origin == "eu-west-1" && p.DataClass == "pii") {
				n++
				if !p.Affected || p.Moved == nil {
					t.Errorf("%s not affected or never refused: %+v", p.Probe, p)
				}
				for _, ph := range []string{"before", "failed", "after"} {
					if got := servedIn(p, ph); len(got) > 1 || (len(got) == 1 && got[0] != "eu-west-1") {
						t.Errorf("%s served in %v (%s)", p.Probe, got, ph)
					}
				}
				refused := 0
				for _, o := range p.Outcomes {
					if o.Phase == "failed" && o.Outcome == outcomeNoHealthy {
						refused += o.Count
					}
				}
				if refused == 0 {
					t.Errorf("%s never refused while eu-west-1 was out: %+v", p.Probe, p.Outcomes)
				}
			}
			if p.Probe == "eu-west-1:dr-drill:public" {
				if got := servedIn(p, "failed"); !slices.ContainsFunc(got, func(r string) bool { return strings.HasPrefix(r, "us-") }) {
					t.Errorf("EU public data while eu-west-1 failed: served in %v, want the US", got)
				}
			}
		}
		if n != 4 {
			t.Fatalf("%d EU-bound probes, want 4", n)
		}
		if rep.Refused == 0 {
			t.Fatal("no refusal counted")
		}
	})
}

func checkGolden(t *testing.T, file string, got []byte) {
	t.Helper()
	if updating() {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test ./dr/drill -run %s -update)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test ./dr/drill -run %s -update to accept)\n--- got\n%s\n--- want\n%s", filepath.Base(file), t.Name(), got, want)
	}
}

// probeErrors lists the outcomes the drill counted as errors, by probe.
func probeErrors(rep *Report) []string {
	var out []string
	for _, p := range rep.Probes {
		for _, o := range p.Outcomes {
			if o.Class == "error" {
				out = append(out, fmt.Sprintf("%s %s: %s x%d", p.Probe, o.Phase, o.Outcome, o.Count))
			}
		}
	}
	return out
}
