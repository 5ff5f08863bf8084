package global

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden output of testdata/failover/*.txt")

// A script is a sequence of blocks: command lines, a "----" line, then the
// expected output up to a blank line. Lines starting with '#' before a block
// are comments. Commands:
//
//	config key=value...            grace, hold-down, min-pods, report-max-age, auto-recover
//	member ID REGION               record a controller (makes its region known)
//	set REGION STATE [auto] [at=T] an operator (or, with auto, the automatic failover) sets a state
//	observe REGION [controllers=N] [dead=N] [pods=N] [age=D]   (pods=-1: unknown; age: of the report)
//	view REGION by=OBSERVER [pods=N] [age=D]   the observing region's view of REGION (pods=-1: none)
//	unview REGION by=OBSERVER      drop that view
//	forget REGION                  drop the region's observation
//	step T                         run the decider at t0+T and commit its transitions
//	decide T                       run the decider at t0+T, keep its transitions pending
//	commit                         commit the pending transitions (compare-and-set)
//	state                          print every known region's state
type scriptBlock struct {
	comments []string
	cmds     []string
	want     []string
}

func parseScript(t *testing.T, path string) []scriptBlock {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []scriptBlock
		cur    scriptBlock
		inOut  bool
	)
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		switch {
		case inOut && line == "":
			blocks = append(blocks, cur)
			cur, inOut = scriptBlock{}, false
		case inOut:
			cur.want = append(cur.want, line)
		case line == "----":
			if len(cur.cmds) == 0 {
				t.Fatalf("%s: output marker without commands", path)
			}
			inOut = true
		case len(cur.cmds) == 0 && (line == "" || strings.HasPrefix(line, "#")):
			cur.comments = append(cur.comments, line)
		default:
			cur.cmds = append(cur.cmds, line)
		}
	}
	if inOut || len(cur.cmds) > 0 {
		blocks = append(blocks, cur)
	}
	return blocks
}

type failoverScript struct {
	t       *testing.T
	x       *tf
	d       *Decider
	cfg     AutoFailoverConfig
	obs     Observations
	pending []Transition // decided, not yet committed
	at      time.Time
}

func (s *failoverScript) run(cmd string) []string {
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return nil
	}
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	dur := func(v string) time.Duration {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.t.Fatalf("%q: %v", cmd, err)
		}
		return d
	}
	num := func(v string) int {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.t.Fatalf("%q: %v", cmd, err)
		}
		return n
	}
	switch f[0] {
	case "config":
		for k, v := range args {
			switch k {
			case "grace":
				s.cfg.Grace = dur(v)
			case "hold-down":
				s.cfg.HoldDown = dur(v)
			case "min-pods":
				s.cfg.MinHealthyPods = num(v)
			case "report-max-age":
				s.cfg.ReportMaxAge = dur(v)
			case "auto-recover":
				s.cfg.AutoRecover = v == "true"
			default:
				s.t.Fatalf("%q: unknown config key %s", cmd, k)
			}
		}
		if err := s.cfg.Validate(); err != nil {
			return []string{"error: " + err.Error()}
		}
		s.d = NewDecider(s.cfg)
		return nil
	case "member":
		s.x.apply(member(pos[0], pos[1]))
		return nil
	case "set":
		st, err := ParseRegionState(pos[1])
		if err != nil {
			s.t.Fatal(err)
		}
		c := region(pos[0], st)
		c.Region.Force = true
		c.Region.Automatic = len(pos) > 2 && pos[2] == "auto"
		c.Actor = "operator"
		if v, ok := args["at"]; ok {
			s.at = t0.Add(dur(v))
		}
		c.At = s.at.UnixNano()
		if r := s.x.apply(c); r.Err != nil {
			return []string{"error: " + r.Err.Error()}
		}
		return nil
	case "observe":
		o, ok := s.obs[pos[0]]
		if !ok {
			o = RegionObservation{HealthyPods: -1}
		}
		for k, v := range args {
			switch k {
			case "controllers":
				o.Controllers = num(v)
			case "dead":
				o.DeadControllers = num(v)
			case "pods":
				o.HealthyPods = num(v)
			case "age":
				o.ReportAge = dur(v)
			default:
				s.t.Fatalf("%q: unknown observation %s", cmd, k)
			}
		}
		s.obs[pos[0]] = o
		return nil
	case "view", "unview":
		o, ok := s.obs[pos[0]]
		if !ok {
			o = RegionObservation{HealthyPods: -1}
		}
		by, ok := args["by"]
		if !ok {
			s.t.Fatalf("%q: by=OBSERVER missing", cmd)
		}
		if o.Views == nil {
			o.Views = map[string]PeerView{}
		}
		if f[0] == "unview" {
			delete(o.Views, by)
			s.obs[pos[0]] = o
			return nil
		}
		v, ok := o.Views[by]
		if !ok {
			v = PeerView{HealthyPods: -1}
		}
		for k, val := range args {
			switch k {
			case "by":
			case "pods":
				v.HealthyPods = num(val)
			case "age":
				v.ReportAge = dur(val)
			default:
				s.t.Fatalf("%q: unknown view field %s", cmd, k)
			}
		}
		o.Views[by] = v
		s.obs[pos[0]] = o
		return nil
	case "forget":
		delete(s.obs, pos[0])
		return nil
	case "step", "decide":
		s.at = t0.Add(dur(pos[0]))
		dec := s.d.Step(s.at, s.x.state(), s.obs)
		var out []string
		for _, n := range dec.Notes {
			out = append(out, "note: "+n)
		}
		s.pending = dec.Transitions
		if f[0] == "decide" {
			for _, tr := range dec.Transitions {
				out = append(out, fmt.Sprintf("decided %s: %s -> %s (%s)", tr.Region, tr.From, tr.To, tr.Reason))
			}
		} else {
			out = append(out, s.commit()...)
		}
		if len(out) == 0 {
			out = []string{"no change"}
		}
		return out
	case "commit":
		return s.commit()
	case "state":
		st := s.x.state()
		var out []string
		regions := st.KnownRegions()
		for r := range s.obs {
			if !st.knowsRegion(r) {
				regions = append(regions, r)
			}
		}
		sort.Strings(regions)
		for _, r := range regions {
			rs, _ := st.RegionStatus(r)
			line := fmt.Sprintf("%s %s", r, st.RegionState(r))
			if rs.Automatic {
				line += " (auto)"
			}
			if !rs.Since.IsZero() {
				line += fmt.Sprintf(" since %v", rs.Since.Sub(t0))
			}
			out = append(out, line)
		}
		return out
	}
	s.t.Fatalf("unknown command %q", cmd)
	return nil
}

// commit applies the pending transitions as the runner does: compare-and-set
// from the state they were decided on.
func (s *failoverScript) commit() []string {
	var out []string
	for _, tr := range s.pending {
		from := tr.From
		c := region(tr.Region, tr.To)
		c.At = s.at.UnixNano()
		c.Actor = "auto:leader"
		c.Region.Reason, c.Region.Expect, c.Region.Automatic, c.Region.Force = tr.Reason, &from, true, true
		r := s.x.apply(c)
		line := fmt.Sprintf("%s: %s -> %s (%s)", tr.Region, tr.From, tr.To, tr.Reason)
		if r.Err != nil {
			line += " REJECTED: " + r.Err.Error()
		}
		out = append(out, line)
	}
	s.pending = nil
	return out
}

func TestFailoverScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/failover/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			cfg := DefaultAutoFailoverConfig()
			s := &failoverScript{t: t, x: newTF(t), cfg: cfg, d: NewDecider(cfg), obs: Observations{}, at: t0}
			blocks := parseScript(t, path)
			var rewritten strings.Builder
			for i, b := range blocks {
				var got []string
				for _, cmd := range b.cmds {
					got = append(got, s.run(cmd)...)
				}
				if len(got) == 0 {
					got = []string{"ok"}
				}
				for _, c := range b.comments {
					rewritten.WriteString(c + "\n")
				}
				for _, c := range b.cmds {
					rewritten.WriteString(c + "\n")
				}
				rewritten.WriteString("----\n" + strings.Join(got, "\n") + "\n")
				if i < len(blocks)-1 {
					rewritten.WriteString("\n")
				}
				if !*update && strings.Join(got, "\n") != strings.Join(b.want, "\n") {
					t.Errorf("%s: block %d (%s):\ngot:\n%s\nwant:\n%s", path, i+1, strings.Join(b.cmds, "; "),
						strings.Join(got, "\n"), strings.Join(b.want, "\n"))
				}
			}
			if *update {
				if err := os.WriteFile(path, []byte(rewritten.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestAutoFailoverConfigValidate(t *testing.T) {
	if err := DefaultAutoFailoverConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*AutoFailoverConfig){
		"Interval":       func(c *AutoFailoverConfig) { c.Interval = 0 },
		"MinHealthyPods": func(c *AutoFailoverConfig) { c.MinHealthyPods = -1 },
		"Grace":          func(c *AutoFailoverConfig) { c.Grace = -time.Second },
		"HoldDown":       func(c *AutoFailoverConfig) { c.HoldDown = -time.Second },
		"ReportMaxAge":   func(c *AutoFailoverConfig) { c.ReportMaxAge = 0 },
		"only evidence":  func(c *AutoFailoverConfig) { c.MinHealthyPods = 0 },
	}
	for want, mut := range cases {
		c := DefaultAutoFailoverConfig()
		mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}
