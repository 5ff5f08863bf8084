package drill

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// The drill's judge is tested with scripts in testdata/*.txt: the
// probes' outcomes over time (as a controller would answer), the trigger
// and recovery times; the judge's report is compared with NAME.md and
// NAME.json (go test ./dr/drill -run TestDrillScripts -update rewrites
// them), and the verdict with the script's "want" line, which -update
// never touches.
//
// Script lines (times are offsets from the start, durations Go syntax):
//
//	region R                  the drilled region (required)
//	drain                     drain instead of fail
//	rounds N                  baseline rounds (3)
//	interval D                between two requests of one probe (100ms); probe i starts at i*D/n
//	latency D                 of every request (10ms)
//	propagate D               default outcomes change this long after the trigger (recovery) was sent (200ms)
//	routable R...             regions routable at the start (all of the policy's)
//	targets MOVED BACK        (5s 10s)
//	max-errors N              (-1)
//	trigger SENT RETURNED     the trigger call
//	trigger-error SENT MSG    a failed trigger call
//	recover SENT RETURNED     the recovery call
//	recover-error SENT MSG    a failed recovery call
//	gave-up-moved AT TIMEOUT  the drill stopped waiting for traffic to move
//	gave-up-back AT TIMEOUT
//	abort-baseline            the outer layer's abort on baseline problems
//	end AT                    last request sent before AT
//	probes default            DefaultProbes of the policy's regions
//	probe O:T:C               a probe; indented lines "AT OUTCOME" script it
//	                          (OUTCOME "200 REGION", "STATUS CODE", "error KIND" or "sim"), each from AT on
//	want pass | want fail CHECK[, CHECK]
//
// Unscripted probes answer as simOutcome says for the region states.

var update = flag.Bool("update", false, "rewrite the golden reports in testdata (NAME.md, NAME.json, fleet-*.md)")

// updating reports whether -update was given.
func updating() bool { return *update }

var scriptBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type segment struct {
	at      time.Duration
	outcome string
}

type drillScript struct {
	region                  string
	drain                   bool
	rounds                  int
	interval, latency, prop time.Duration
	routable                []string
	targetMoved, targetBack time.Duration
	maxErrors               int
	trigSent, trigDone      time.Duration
	trigErr                 string
	recSent, recDone        time.Duration
	recErr                  string
	gaveUpMoved, gaveUpBack time.Duration
	movedTimeout, backTO    time.Duration
	abortBaseline           bool
	end                     time.Duration
	probes                  []Probe
	segments                map[Probe][]segment
	want                    string
}

func mustDur(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func parseDrillScript(t *testing.T, file string) *drillScript {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := &drillScript{rounds: 3, interval: 100 * time.Millisecond, latency: 10 * time.Millisecond, prop: 200 * time.Millisecond,
		targetMoved: 5 * time.Second, targetBack: 10 * time.Second, maxErrors: -1, trigSent: -1, recSent: -1,
		gaveUpMoved: -1, gaveUpBack: -1, movedTimeout: 60 * time.Second, backTO: 60 * time.Second, segments: map[Probe][]segment{}}
	var cur *Probe
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		fail := func(format string, args ...any) { t.Fatalf("%s:%d: %s", file, n, fmt.Sprintf(format, args...)) }
		if line[0] == ' ' || line[0] == '\t' {
			if cur == nil || len(f) < 2 {
				fail("a segment needs a probe above it and AT OUTCOME")
			}
			s.segments[*cur] = append(s.segments[*cur], segment{mustDur(t, f[0]), strings.Join(f[1:], " ")})
			continue
		}
		cur = nil
		arg := func(i int) string {
			if i >= len(f) {
				fail("%s: missing argument %d", f[0], i)
			}
			return f[i]
		}
		switch f[0] {
		case "region":
			s.region = arg(1)
		case "drain":
			s.drain = true
		case "rounds":
			s.rounds, _ = strconv.Atoi(arg(1))
		case "interval":
			s.interval = mustDur(t, arg(1))
		case "latency":
			s.latency = mustDur(t, arg(1))
		case "propagate":
			s.prop = mustDur(t, arg(1))
		case "routable":
			s.routable = f[1:]
		case "targets":
			s.targetMoved, s.targetBack = mustDur(t, arg(1)), mustDur(t, arg(2))
		case "max-errors":
			s.maxErrors, _ = strconv.Atoi(arg(1))
		case "trigger":
			s.trigSent, s.trigDone = mustDur(t, arg(1)), mustDur(t, arg(2))
		case "trigger-error":
			s.trigSent, s.trigErr = mustDur(t, arg(1)), strings.Join(f[2:], " ")
		case "recover":
			s.recSent, s.recDone = mustDur(t, arg(1)), mustDur(t, arg(2))
		case "recover-error":
			s.recSent, s.recErr = mustDur(t, arg(1)), strings.Join(f[2:], " ")
		case "gave-up-moved":
			s.gaveUpMoved, s.movedTimeout = mustDur(t, arg(1)), mustDur(t, arg(2))
		case "gave-up-back":
			s.gaveUpBack, s.backTO = mustDur(t, arg(1)), mustDur(t, arg(2))
		case "abort-baseline":
			s.abortBaseline = true
		case "end":
			s.end = mustDur(t, arg(1))
		case "probes":
			s.probes = append(s.probes, DefaultProbes([]string{"us-east-1", "us-west-2", "eu-west-1"})...)
		case "probe":
			p, err := ParseProbe(arg(1))
			if err != nil {
				fail("%v", err)
			}
			if !slices.Contains(s.probes, p) {
				s.probes = append(s.probes, p)
			}
			cur = &s.probes[slices.Index(s.probes, p)]
		case "want":
			s.want = strings.Join(f[1:], " ")
		default:
			fail("unknown directive %q", f[0])
		}
	}
	if s.region == "" || s.end == 0 || s.want == "" {
		t.Fatalf("%s: region, end and want are required", file)
	}
	return s
}

// simOutcome is how a controller of origin answers probe p when the regions
// in down cannot serve: at home when allowed, else in the first allowed
// region (by name) that can serve, else 503; 451 when the policy allows
// nothing.
func simOutcome(pol *residency.Policy, p Probe, down func(string) bool) string {
	d := pol.Evaluate(residency.Attributes{Tenant: p.Tenant, DataClass: p.DataClass, OriginRegion: p.Origin, Model: "meridian/sim-70b"})
	if d.Allowed.Empty() {
		return outcomeDenied
	}
	if d.Allows(p.Origin) && !down(p.Origin) {
		return "200 " + p.Origin
	}
	regs := d.Regions()
	sort.Strings(regs)
	for _, r := range regs {
		if !down(r) {
			return "200 " + r
		}
	}
	return outcomeNoHealthy
}

// resultOf turns a scripted outcome into what the outer layer would see.
func resultOf(outcome string) probeResult {
	var r probeResult
	f := strings.Fields(outcome)
	if f[0] == "error" {
		r.errKind, r.detail = f[1], "scripted "+f[1]
		return r
	}
	r.status, _ = strconv.Atoi(f[0])
	switch {
	case r.status == 200 && len(f) > 1:
		r.region = f[1]
	case len(f) > 1:
		r.code, r.detail = f[1], "scripted "+f[1]
	}
	return r
}

// run plays the script through a judge and returns the report.
func (s *drillScript) run(t *testing.T, pol *residency.Policy) *Report {
	t.Helper()
	routable := s.routable
	if routable == nil {
		for _, r := range pol.Regions() {
			routable = append(routable, r.Name)
		}
	}
	slices.Sort(routable)
	j := newJudge(pol, "meridian/sim-70b", s.region, routable, s.probes, s.rounds)
	at := func(d time.Duration) time.Time { return scriptBase.Add(d) }
	downAt := func(sent time.Duration) func(string) bool {
		failed := s.trigSent >= 0 && sent >= s.trigSent+s.prop && (s.recSent < 0 || s.recErr != "" || sent < s.recSent+s.prop)
		return func(r string) bool { return !slices.Contains(routable, r) || (failed && r == s.region) }
	}
	type event struct {
		at     time.Duration
		mark   func(time.Time)
		result *probeResult
	}
	var evs []event
	mark := func(d time.Duration, f func(time.Time)) {
		if d >= 0 {
			evs = append(evs, event{at: d, mark: f})
		}
	}
	mark(s.trigSent, j.markTriggerSent)
	if s.trigErr == "" && s.trigSent >= 0 {
		mark(s.trigDone, j.markTriggerReturned)
	}
	mark(s.recSent, j.markRecoverSent)
	if s.recErr == "" && s.recSent >= 0 {
		mark(s.recDone, j.markRecoverReturned)
	}
	for i, p := range s.probes {
		for seq, sent := 0, s.interval*time.Duration(i)/time.Duration(len(s.probes)); sent < s.end; seq, sent = seq+1, sent+s.interval {
			out := "sim"
			for _, sg := range s.segments[p] {
				if sg.at <= sent {
					out = sg.outcome
				}
			}
			if out == "sim" {
				out = simOutcome(pol, p, downAt(sent))
			}
			r := resultOf(out)
			r.probe, r.seq, r.sent, r.done = i, seq, at(sent), at(sent+s.latency)
			r.decision = fmt.Sprintf("dec-%d-%d", i, seq)
			evs = append(evs, event{at: sent + s.latency, result: &r})
		}
	}
	// Marks before results at the same time; results of a probe in order.
	slices.SortStableFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if (a.mark != nil) != (b.mark != nil) {
			if a.mark != nil {
				return -1
			}
			return 1
		}
		return 0
	})
	m := drillMeta{cfg: Config{Admin: "http://admin.test:8081", Controllers: map[string]string{}, Drain: s.drain,
		Interval: s.interval, TargetMoved: s.targetMoved, TargetBack: s.targetBack, MovedTimeout: s.movedTimeout,
		BackTimeout: s.backTO, MaxErrors: s.maxErrors}, policy: pol.Revision() + " (v1@5)",
		routable: routable, started: scriptBase, finished: at(s.end),
		triggerDetail: s.region + " is failed (raft index 41)", recoverDetail: s.region + " is active (raft index 57)"}
	if s.drain {
		m.triggerDetail = s.region + " is draining (raft index 41)"
	}
	for _, p := range s.probes {
		m.cfg.Controllers[p.Origin] = "http://" + p.Origin + ".test:8080"
	}
	for _, e := range evs {
		if e.mark != nil {
			e.mark(at(e.at))
			continue
		}
		j.observe(*e.result)
		if s.abortBaseline && j.baselineDone() {
			why, err := j.baselineAbort()
			if err == nil {
				t.Fatal("abort-baseline: the baseline has no problem")
			}
			m.aborted, m.finished = why, at(e.at)
			break
		}
	}
	if s.trigErr != "" {
		m.triggerErr, m.aborted = s.trigErr, "trigger failed: "+s.trigErr
	}
	if s.recErr != "" {
		m.recoverErr, m.aborted = s.recErr, "recover failed: "+s.recErr
	}
	m.recovered = s.recSent >= 0 && s.recErr == ""
	if s.gaveUpMoved >= 0 {
		m.movedGaveUp = at(s.gaveUpMoved)
	}
	if s.gaveUpBack >= 0 {
		m.backGaveUp = at(s.gaveUpBack)
	}
	return j.report(m)
}

func failedChecks(rep *Report) []string {
	var out []string
	for _, c := range rep.Checks {
		if !c.Passed {
			out = append(out, c.Name)
		}
	}
	return out
}

func TestDrillScripts(t *testing.T) {
	pol, err := residency.Parse("policy.yaml", fleet.ExamplePolicy)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) < 6 {
		t.Fatalf("found only %d drill scripts", len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".txt")
		t.Run(name, func(t *testing.T) {
			s := parseDrillScript(t, file)
			rep := s.run(t, pol)
			got := "pass"
			if f := failedChecks(rep); len(f) > 0 || !rep.Passed {
				got = strings.TrimSpace("fail " + strings.Join(f, ", "))
			}
			if got != s.want {
				t.Errorf("verdict %q, script wants %q", got, s.want)
			}
			var md, js bytes.Buffer
			if err := rep.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if err := rep.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			for _, g := range []struct {
				ext string
				got []byte
			}{{".md", md.Bytes()}, {".json", js.Bytes()}} {
				golden := filepath.Join("testdata", name+g.ext)
				if updating() {
					if err := os.WriteFile(golden, g.got, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test ./dr/drill -run TestDrillScripts -update)", err)
				}
				if !bytes.Equal(g.got, want) {
					t.Errorf("%s differs (run go test ./dr/drill -run TestDrillScripts -update to accept)\n--- got\n%s", golden, g.got)
				}
			}
		})
	}
}

// The timeline names, of several errors (or refusals) at the latest time,
// the first one listed, as of several at the earliest time.
func TestFirstLast(t *testing.T) {
	t1 := scriptBase.Add(time.Second)
	s := []ProbeSample{{At: scriptBase, Probe: "a"}, {At: scriptBase, Probe: "b"}, {At: t1, Probe: "c"}, {At: t1, Probe: "d"}}
	if first, last := firstLast(s); first.Probe != "a" || last.Probe != "c" {
		t.Fatalf("first %s, last %s; want a, c", first.Probe, last.Probe)
	}
	if first, last := firstLast(s[3:]); first.Probe != "d" || last.Probe != "d" {
		t.Fatalf("one sample: first %s, last %s", first.Probe, last.Probe)
	}
}
