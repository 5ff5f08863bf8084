package drill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// simCluster is an in-memory cluster behind an http.RoundTripper, for
// testing Run, the drill's outer layer, inside a synctest bubble (fake
// time): an admin API (policy, failover status, trigger, recover) and one
// controller per region answering as simOutcome says for the region states
// it has seen.
// A state change reaches the controllers after propagate.
type simCluster struct {
	mu        sync.Mutex
	pol       *residency.Policy
	doc       []byte
	regions   []string
	propagate time.Duration
	latency   time.Duration
	// stuck: this region's controller never sees its own region fail.
	stuck string
	// broken: this region's controller answers 502.
	broken string
	// recoverFails: recover answers 503 no_leader.
	recoverFails bool
	// onTrigger runs after a trigger is applied.
	onTrigger func()

	state    map[string]global.RegionState
	changes  []simChange
	index    uint64
	triggers int
	recovers int
}

type simChange struct {
	at     time.Time
	region string
	state  global.RegionState
}

const simToken = "sim-token"

func newSimCluster(t *testing.T) *simCluster {
	t.Helper()
	pol, err := residency.Parse("policy.yaml", fleet.ExamplePolicy)
	if err != nil {
		t.Fatal(err)
	}
	return &simCluster{pol: pol, doc: fleet.ExamplePolicy, regions: []string{"eu-west-1", "us-east-1", "us-west-2"},
		propagate: 300 * time.Millisecond, latency: 5 * time.Millisecond, state: map[string]global.RegionState{}, index: 10}
}

func (c *simCluster) config(region string) Config {
	cfg := DefaultConfig()
	cfg.Admin, cfg.Token, cfg.Region = "http://admin.sim", simToken, region
	cfg.Controllers = map[string]string{}
	for _, r := range c.regions {
		cfg.Controllers[r] = "http://" + r + ".sim"
	}
	cfg.HTTP = &http.Client{Transport: c}
	return cfg
}

// seenDown reports whether the controller of viewer sees region down at now.
func (c *simCluster) seenDown(viewer, region string, now time.Time) bool {
	st := global.RegionActive
	for _, ch := range c.changes {
		if ch.region == region && !ch.at.Add(c.propagate).After(now) {
			st = ch.state
		}
	}
	if viewer == c.stuck && region == c.stuck {
		return false
	}
	return st != global.RegionActive
}

func simResponse(req *http.Request, status int, hdr http.Header, v any) *http.Response {
	b, _ := json.Marshal(v)
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr.Set("Content-Type", "application/json")
	return &http.Response{StatusCode: status, Header: hdr, Body: io.NopCloser(strings.NewReader(string(b))), Request: req}
}

func simError(req *http.Request, status int, code, msg string) *http.Response {
	var e global.ErrorBody
	e.Error.Code, e.Error.Message = code, msg
	return simResponse(req, status, nil, e)
}

func (c *simCluster) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	select {
	case <-time.After(c.latency):
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if req.URL.Host == "admin.sim" {
		return c.admin(req, body, now), nil
	}
	origin := strings.TrimSuffix(req.URL.Host, ".sim")
	if origin == c.broken {
		return simError(req, http.StatusBadGateway, "upstream_failed", "pod unreachable"), nil
	}
	p := Probe{Origin: origin, Tenant: req.Header.Get("X-Tenant-Id"), DataClass: req.Header.Get("X-Data-Class")}
	out := simOutcome(c.pol, p, func(r string) bool { return c.seenDown(origin, r, now) })
	status, rest, _ := strings.Cut(out, " ")
	switch status {
	case "200":
		return simResponse(req, http.StatusOK, http.Header{"X-Meridian-Region": {rest}}, map[string]any{"object": "chat.completion"}), nil
	case "451":
		return simError(req, 451, rest, "denied"), nil
	}
	return simError(req, http.StatusServiceUnavailable, rest, "no healthy region"), nil
}

func (c *simCluster) admin(req *http.Request, body []byte, now time.Time) *http.Response {
	if req.Header.Get("Authorization") != "Bearer "+simToken {
		return simError(req, http.StatusUnauthorized, global.CodeUnauthorized, "missing or invalid bearer token")
	}
	switch req.Method + " " + req.URL.Path {
	case "GET /v1/global/policy":
		sum := sha256.Sum256(c.doc)
		return simResponse(req, http.StatusOK, nil, global.PolicyVersion{Version: 1, Index: 5, Name: "policy.yaml", SHA256: hex.EncodeToString(sum[:]), Document: c.doc})
	case "GET /v1/global/failover":
		var fs global.FailoverStatus
		for _, r := range c.regions {
			st := c.state[r]
			fs.Regions = append(fs.Regions, global.RegionView{RegionStatus: global.RegionStatus{Region: r, State: st},
				Routable: st == global.RegionActive, Controllers: []string{"ctl-" + r}})
		}
		return simResponse(req, http.StatusOK, nil, fs)
	case "POST /v1/global/failover/trigger", "POST /v1/global/failover/recover":
		var fr global.FailoverRequest
		if err := json.Unmarshal(body, &fr); err != nil || !slices.Contains(c.regions, fr.Region) {
			return simError(req, http.StatusBadRequest, global.CodeInvalid, fmt.Sprintf("bad request %q", body))
		}
		st := global.RegionActive
		if strings.HasSuffix(req.URL.Path, "/trigger") {
			st = global.RegionFailed
			if fr.Drain {
				st = global.RegionDraining
			}
			c.triggers++
		} else {
			c.recovers++
			if c.recoverFails {
				return simError(req, http.StatusServiceUnavailable, global.CodeNoLeader, "no raft leader")
			}
		}
		c.index++
		c.state[fr.Region] = st
		c.changes = append(c.changes, simChange{at: now, region: fr.Region, state: st})
		if st != global.RegionActive && c.onTrigger != nil {
			c.onTrigger()
		}
		return simResponse(req, http.StatusOK, nil, global.Result{Index: c.index, Changed: true,
			Region: &global.RegionStatus{Region: fr.Region, State: st, Since: now, Index: c.index}})
	}
	return simError(req, http.StatusNotFound, global.CodeNotFound, "no such endpoint")
}

func (c *simCluster) counts() (triggers, recovers int, st global.RegionState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.triggers, c.recovers, c.state["us-west-2"]
}

func hasEvent(rep *Report, kind string) bool {
	return slices.ContainsFunc(rep.Timeline, func(e Event) bool { return e.Kind == kind })
}

func TestDrillSimulated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		rep, err := Run(t.Context(), c.config("us-west-2"))
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Passed || rep.Errors != 0 || rep.Violations != 0 || rep.Affected != 2 {
			t.Fatalf("passed %v, %d errors, %d violations, %d affected; checks %+v", rep.Passed, rep.Errors, rep.Violations, rep.Affected, rep.Checks)
		}
		t.Logf("moved %v, back %v, %d requests", rep.Moved.D(), rep.Back.D(), rep.Requests)
		// Controllers learn of a change 300 ms after it; a probe sees it at
		// its next request (every 100 ms, 5 ms each way of latency).
		for _, f := range []struct {
			name string
			got  *Millis
		}{{"moved", rep.Moved}, {"back", rep.Back}} {
			if f.got == nil || f.got.D() < 290*time.Millisecond || f.got.D() > 420*time.Millisecond {
				t.Errorf("%s %v, want about 300ms plus up to one interval", f.name, f.got)
			}
		}
		if tr, rc, st := c.counts(); tr != 1 || rc != 1 || st != global.RegionActive {
			t.Fatalf("%d triggers, %d recovers, state %s", tr, rc, st)
		}
		if len(rep.Notes) != 0 {
			t.Fatalf("notes %q", rep.Notes)
		}
		// The region stayed moved for Hold before the recovery.
		var moved, recoverSent time.Time
		for _, e := range rep.Timeline {
			switch e.Kind {
			case EventMoved:
				moved = e.At
			case EventRecoverSent:
				recoverSent = e.At
			}
		}
		if d := recoverSent.Sub(moved); d < DefaultConfig().Hold {
			t.Fatalf("recovered %v after the traffic moved, want at least Hold", d)
		}
	})
}

func TestDrillSimulatedDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		cfg := c.config("us-west-2")
		cfg.Drain = true
		var st global.RegionState
		c.onTrigger = func() { st = c.state["us-west-2"] }
		// A context that is never done (as the CLI's can be).
		rep, err := Run(context.Background(), cfg)
		if err != nil || !rep.Passed || rep.Mode != "drain" || st != global.RegionDraining {
			t.Fatalf("drain drill: %v, passed %v, mode %s, state while out %s", err, rep != nil && rep.Passed, rep.Mode, st)
		}
	})
}

// A policy applied during the drill is noted: the drill judged against the
// policy at the start.
func TestDrillSimulatedPolicyChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		c.onTrigger = func() { c.doc = append(slices.Clip(c.doc), "\n# changed\n"...) }
		rep, err := Run(t.Context(), c.config("us-west-2"))
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "the residency policy changed during the drill (now v1@5)") {
			t.Fatalf("notes %q", rep.Notes)
		}
	})
}

// A controller that ignores the failover: the drill gives up after
// MovedTimeout, recovers the region anyway and fails on the move only.
func TestDrillSimulatedNeverMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		c.stuck = "us-west-2"
		cfg := c.config("us-west-2")
		cfg.MovedTimeout = 10 * time.Second
		rep, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Passed || !slices.Equal(failedChecks(rep), []string{"traffic moved"}) || rep.Moved != nil || !hasEvent(rep, EventMovedTimeout) {
			t.Fatalf("passed %v, failed checks %v, moved %v", rep.Passed, failedChecks(rep), rep.Moved)
		}
		if tr, rc, st := c.counts(); tr != 1 || rc != 1 || st != global.RegionActive {
			t.Fatalf("%d triggers, %d recovers, state %s", tr, rc, st)
		}
		var gaveUp, trigger time.Time
		for _, e := range rep.Timeline {
			switch e.Kind {
			case EventMovedTimeout:
				gaveUp = e.At
			case EventTriggerReturned:
				trigger = e.At
			}
		}
		if d := gaveUp.Sub(trigger); d != cfg.MovedTimeout {
			t.Fatalf("gave up %v after the trigger returned, want %v", d, cfg.MovedTimeout)
		}
	})
}

func TestDrillSimulatedRecoverFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		c.recoverFails = true
		rep, err := Run(t.Context(), c.config("us-west-2"))
		if !errors.Is(err, ErrNotRecovered) || rep == nil || rep.Recovered || rep.Passed {
			t.Fatalf("err %v, report %v", err, rep)
		}
		if !strings.Contains(err.Error(), "meridian failover recover --region us-west-2") {
			t.Fatalf("the error does not tell the operator what to do: %v", err)
		}
		if _, rc, st := c.counts(); rc < 1 || st != global.RegionFailed {
			t.Fatalf("%d recover calls, state %s", rc, st)
		}
	})
}

// An operator's Ctrl-C after the trigger: the drill still recovers the
// region before returning.
func TestDrillSimulatedCancelledRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c.onTrigger = cancel
		rep, err := Run(ctx, c.config("us-west-2"))
		if !errors.Is(err, context.Canceled) || rep == nil || rep.Aborted != "cancelled" || !rep.Recovered || rep.Passed {
			t.Fatalf("err %v, report %+v", err, rep)
		}
		if tr, rc, st := c.counts(); tr != 1 || rc != 1 || st != global.RegionActive {
			t.Fatalf("%d triggers, %d recovers, state %s", tr, rc, st)
		}
	})
}

func TestDrillSimulatedRefusesToStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		c.state["us-west-2"] = global.RegionFailed
		if _, err := Run(t.Context(), c.config("us-west-2")); !errors.Is(err, ErrRegionNotActive) {
			t.Fatalf("failed region: %v", err)
		}
		if _, err := Run(t.Context(), c.config("ap-south-1")); !errors.Is(err, ErrRegionNotActive) || !strings.Contains(err.Error(), "does not know ap-south-1") {
			t.Fatalf("unknown region: %v", err)
		}
		cfg := c.config("eu-west-1")
		cfg.Token = "wrong"
		if _, err := Run(t.Context(), cfg); !errors.Is(err, global.ErrUnauthorized) {
			t.Fatalf("bad token: %v", err)
		}
		// An unhealthy baseline: us-east-1's controller answers 502.
		c.broken = "us-east-1"
		rep, err := Run(t.Context(), c.config("eu-west-1"))
		if !errors.Is(err, ErrBaseline) || rep == nil || !strings.HasPrefix(rep.Aborted, "baseline unhealthy: probe us-east-1:") {
			t.Fatalf("unhealthy baseline: %v %+v", err, rep)
		}
		if tr, _, _ := c.counts(); tr != 0 {
			t.Fatalf("%d triggers", tr)
		}
	})
}

func TestDrillConfigValidate(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		c.Admin, c.Token, c.Region = "http://127.0.0.1:8081", "t", "us-west-2"
		c.Controllers = map[string]string{"us-west-2": "http://127.0.0.1:8080"}
		return c
	}
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	for field, mut := range map[string]func(*Config){
		"Admin":                  func(c *Config) { c.Admin = "" },
		"Admin: \"ftp":           func(c *Config) { c.Admin = "ftp://x" },
		"Token":                  func(c *Config) { c.Token = "" },
		"Controllers:":           func(c *Config) { c.Controllers = nil },
		"Controllers[us-west-2]": func(c *Config) { c.Controllers["us-west-2"] = "127.0.0.1:8080" },
		"Region":                 func(c *Config) { c.Region = "" },
		"Probes: \"eu-west-1":    func(c *Config) { c.Probes = []Probe{{Origin: "eu-west-1", DataClass: "phi"}} },
		"Probes: none":           func(c *Config) { c.DefaultProbes = false },
		"Model":                  func(c *Config) { c.Model = "" },
		"Interval":               func(c *Config) { c.Interval = 0 },
		"ProbeTimeout":           func(c *Config) { c.ProbeTimeout = -time.Second },
		"Hold":                   func(c *Config) { c.Hold = -1 },
		"BaselineRounds":         func(c *Config) { c.BaselineRounds = 0 },
		"MovedTimeout":           func(c *Config) { c.MovedTimeout = time.Second },
		"BackTimeout":            func(c *Config) { c.BackTimeout = time.Second },
		"AdminTimeout":           func(c *Config) { c.AdminTimeout = 0 },
	} {
		c := good()
		mut(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: got %v", field, err)
		}
	}
}

func TestParseProbe(t *testing.T) {
	for in, want := range map[string]Probe{
		"us-east-1:acme:public": {"us-east-1", "acme", "public"},
		"eu-west-1::phi":        {"eu-west-1", "", "phi"},
		" us-west-2 : t : ":     {"us-west-2", "t", ""},
	} {
		got, err := ParseProbe(in)
		if err != nil || got != want {
			t.Errorf("ParseProbe(%q) = %+v, %v", in, got, err)
		}
		if again, err := ParseProbe(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q: %+v %v", in, again, err)
		}
	}
	for _, bad := range []string{"", "us-east-1", "us-east-1:a", ":a:b", "a:b:c:d"} {
		if _, err := ParseProbe(bad); err == nil {
			t.Errorf("ParseProbe(%q) accepted", bad)
		}
	}
	c := DefaultConfig()
	c.Controllers = map[string]string{"b": "", "a": ""}
	c.Probes = []Probe{{"a", ProbeTenant, "public"}, {"a", "x", "y"}}
	got := c.probes()
	if len(got) != 7 || got[0] != (Probe{"a", ProbeTenant, "public"}) || got[6] != (Probe{"a", "x", "y"}) {
		t.Fatalf("probes %v", got)
	}
}
