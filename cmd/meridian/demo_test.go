package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/scenarios/demo"
)

// demoBuffer is a bytes.Buffer safe for the command writing and the test
// reading.
type demoBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *demoBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *demoBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var demoRegionLine = regexp.MustCompile(`^(us-east-1|us-west-2|eu-west-1)=(https://127\.0\.0\.1:[0-9]+)$`)

// meridian demo --no-traffic prints exactly one region=URL line per
// controller on stdout (everything else on stderr), serves until
// interrupted, and exits 0.
func TestDemoNoTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-region system")
	}
	app := newApp()
	var out, errw demoBuffer
	app.Writer, app.ErrWriter = &out, &errw
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(ctx, []string{"meridian", "demo", "--no-traffic", "--status-addr", "127.0.0.1:0", "--dir", t.TempDir()})
	}()
	deadline := time.Now().Add(4 * time.Minute) // past the demo's own 3-minute start bound
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), "apikey.embargoed-9=") {
		select {
		case err := <-done:
			t.Fatalf("demo ended early: %v\nstderr: %s", err, errw.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no region lines; stdout %q stderr %q", out.String(), errw.String())
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	var hc *http.Client
	seen := map[string]bool{}
	for _, l := range lines {
		if ca, ok := strings.CutPrefix(l, "ca="); ok {
			pem, err := os.ReadFile(ca)
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(pem)
			hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
			continue
		}
		if strings.HasPrefix(l, "raft.") || strings.HasPrefix(l, "apikey.") {
			continue
		}
		m := demoRegionLine.FindStringSubmatch(l)
		if m == nil || hc == nil {
			t.Fatalf("stdout line %q is not region=URL (after the ca= line)", l)
		}
		seen[m[1]] = true
		resp, err := hc.Get(m[2] + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s/healthz: %d", m[2], resp.StatusCode)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("regions %v", seen)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo: %v\nstderr: %s", err, errw.String())
	}
	if strings.Count(out.String(), "\n") != len(lines) {
		t.Fatalf("stdout holds more than the no-traffic lines: %q", out.String())
	}
	if !strings.Contains(errw.String(), "meridian audit verify --dir") {
		t.Fatalf("no summary on stderr: %s", errw.String())
	}
}

func TestDemoUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--sessions", "0"},
		{"--failover-region", "mars-1"},
		{"--duration", "10s", "--failover-after", "9s"},
		{"--time-scale", "0"},
		{"--replicas", "0"},
		{"--status-addr", "7700"},
		{"extra"},
	} {
		app := newApp()
		var out, errw demoBuffer
		app.Writer, app.ErrWriter = &out, &errw
		err := app.Run(append([]string{"meridian", "demo"}, args...))
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("demo %v: %v, want a usage error (exit 2)", args, err)
		}
	}
}

func TestFitFailover(t *testing.T) {
	for _, tc := range []struct {
		name              string
		duration          time.Duration
		afterSet, forSet  bool
		after, dur        time.Duration // given
		wantAfter, wantFo time.Duration
	}{
		{"default fits", 90 * time.Second, false, false, 60 * time.Second, 15 * time.Second, 60 * time.Second, 15 * time.Second},
		{"until interrupted", 0, false, false, 60 * time.Second, 15 * time.Second, 60 * time.Second, 15 * time.Second},
		{"short run", 30 * time.Second, false, false, 60 * time.Second, 15 * time.Second, 11200 * time.Millisecond, 7500 * time.Millisecond},
		{"short run, --failover-for", 30 * time.Second, false, true, 60 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second},
		{"--failover-after given", 30 * time.Second, true, false, 60 * time.Second, 15 * time.Second, 60 * time.Second, 15 * time.Second},
		{"no failover", 30 * time.Second, false, false, -1, 15 * time.Second, -1, 15 * time.Second},
	} {
		cfg := demo.DefaultConfig()
		cfg.Duration, cfg.FailoverAfter, cfg.FailoverFor = tc.duration, tc.after, tc.dur
		fitFailover(&cfg, tc.afterSet, tc.forSet)
		fitReplicaKill(&cfg, false, false)
		if cfg.FailoverAfter != tc.wantAfter || cfg.FailoverFor != tc.wantFo {
			t.Errorf("%s: failover after %v for %v, want %v for %v", tc.name, cfg.FailoverAfter, cfg.FailoverFor, tc.wantAfter, tc.wantFo)
		}
		if tc.duration > 0 && cfg.FailoverAfter >= 0 && !tc.afterSet {
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
	}
}

// The default replica kill moves into a shorter run (after a fifth of it,
// down at most a sixth), and the run validates.
func TestFitReplicaKill(t *testing.T) {
	for _, tc := range []struct {
		name               string
		duration           time.Duration
		afterSet           bool
		wantAfter, wantFor time.Duration
	}{
		{"default fits", 90 * time.Second, false, 40 * time.Second, 10 * time.Second},
		{"until interrupted", 0, false, 40 * time.Second, 10 * time.Second},
		{"short run", 30 * time.Second, false, 6 * time.Second, 5 * time.Second},
		{"--replica-kill-after given", 30 * time.Second, true, 40 * time.Second, 10 * time.Second},
	} {
		cfg := demo.DefaultConfig()
		cfg.Duration = tc.duration
		fitFailover(&cfg, false, false)
		fitReplicaKill(&cfg, tc.afterSet, false)
		if cfg.ReplicaKillAfter != tc.wantAfter || cfg.ReplicaDownFor != tc.wantFor {
			t.Errorf("%s: kill after %v, down %v; want %v, %v", tc.name, cfg.ReplicaKillAfter, cfg.ReplicaDownFor, tc.wantAfter, tc.wantFor)
		}
		if !tc.afterSet {
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
	}
}

// TestDemoOutcome: a clean run exits 0; one that reported an unexpected
// error exits 1; a residency violation or an audit log that does not verify
// exits 3, whatever else happened.
func TestDemoOutcome(t *testing.T) {
	for _, c := range []struct {
		res  demo.Result
		want int
	}{
		{demo.Result{Requests: 10, AuditVerified: true}, 0},
		{demo.Result{Requests: 10, Errors: 1, AuditVerified: true}, 1},
		{demo.Result{Requests: 10, ResidencyViolations: 1, AuditVerified: true}, 3},
		{demo.Result{Requests: 10, Errors: 2}, 3},
	} {
		if got := exitCode(demoOutcome(c.res)); got != c.want {
			t.Errorf("%+v: exit %d, want %d", c.res, got, c.want)
		}
	}
}
