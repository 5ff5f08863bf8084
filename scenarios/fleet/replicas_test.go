package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/residency"
)

// outcome is one request of the load generator as its client saw it.
type outcome struct {
	entry    string // replica the balancer sent it to (the last tried)
	servedBy string // X-Meridian-Controller: whose pod answered
	region   string // X-Meridian-Region
	status   int
	err      string // transport failure, cut stream, or unexpected status
	start    time.Time
	end      time.Time
	tenant   string
	class    string
	origin   string
}

func (o outcome) failed() bool { return o.err != "" }

// loadgen sends streamed multi-turn chat sessions through a Balancer from
// every region, as clients behind each region's load balancer would, and
// records every request.
type loadgen struct {
	b      *Balancer
	policy *residency.Policy
	mu     sync.Mutex
	out    []outcome
	stop   chan struct{}
	wg     sync.WaitGroup
}

// loadWorkloads: who sends from where. EU PHI entering in the US must be
// served in eu-west-1 (a crossing); public traffic from the EU may be
// served in the US; the rest stays in its origin zone.
var loadWorkloads = []struct{ tenant, class, origin string }{
	{"acme", "internal", "us-east-1"},
	{"acme", "internal", "us-west-2"},
	{"eu-health", "phi", "us-east-1"},
	{"eu-health", "phi", "eu-west-1"},
	{"globex", "public", "eu-west-1"},
	{"initech", "pii", "us-west-2"},
}

func startLoad(f *Fleet, workers int) *loadgen {
	g := &loadgen{b: f.NewBalancer(f.HTTP), policy: f.Policy, stop: make(chan struct{})}
	for w := range workers {
		g.wg.Go(func() { g.worker(w) })
	}
	return g
}

func (g *loadgen) worker(w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	system := "You are a helpful assistant with shared instructions. " + text(rng, 300)
	for s := 0; ; s++ {
		wl := loadWorkloads[(w+s)%len(loadWorkloads)]
		session := fmt.Sprintf("w%d-s%d", w, s)
		msgs := []map[string]string{{"role": "system", "content": system}}
		for turn := 0; turn < 3; turn++ {
			select {
			case <-g.stop:
				return
			default:
			}
			msgs = append(msgs, map[string]string{"role": "user", "content": text(rng, 40)})
			o := g.chat(wl.tenant, wl.class, wl.origin, session, msgs)
			g.mu.Lock()
			g.out = append(g.out, o)
			g.mu.Unlock()
			if o.failed() {
				break
			}
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"})
		}
	}
}

// chat sends one streamed request and reads it to its end.
func (g *loadgen) chat(tenant, class, origin, session string, msgs []map[string]string) outcome {
	o := outcome{tenant: tenant, class: class, origin: origin, start: time.Now()}
	defer func() { o.end = time.Now() }()
	body, _ := json.Marshal(map[string]any{"model": "meridian/sim-70b", "max_tokens": 8, "stream": true, "messages": msgs})
	resp, rep, err := g.b.Do(origin, func(base string) (*http.Request, error) {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set(regional.HeaderTenant, tenant)
		req.Header.Set(regional.HeaderDataClass, class)
		req.Header.Set(regional.HeaderSession, session)
		return req, nil
	})
	if rep != nil {
		o.entry = rep.ID
	}
	if err != nil {
		o.err = "transport: " + err.Error()
		o.end = time.Now()
		return o
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	o.servedBy, o.region = resp.Header.Get(regional.HeaderController), resp.Header.Get("X-Meridian-Region")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		o.err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		o.end = time.Now()
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			done = true
		}
	}
	switch {
	case sc.Err() != nil:
		o.err = "stream: " + sc.Err().Error()
	case !done:
		o.err = "stream cut before [DONE]"
	}
	o.end = time.Now()
	return o
}

// halt stops the workers (the requests in flight finish) and the balancer.
func (g *loadgen) halt() {
	close(g.stop)
	g.wg.Wait()
	g.b.Close()
}

// since returns the outcomes of requests that ended at or after t.
func (g *loadgen) since(t time.Time) []outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []outcome
	for _, o := range g.out {
		if !o.end.Before(t) {
			out = append(out, o)
		}
	}
	return out
}

// waitServed waits until at least n requests that started after t have
// succeeded.
func (g *loadgen) waitServed(t *testing.T, after time.Time, n int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok := 0
		for _, o := range g.since(after) {
			if !o.failed() && o.start.After(after) {
				ok++
			}
		}
		if ok >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests served within %v", ok, n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// violations returns the answers served in a region the policy forbids
// for their tenant, data class and origin.
func (g *loadgen) violations() []outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []outcome
	for _, o := range g.out {
		if o.status != http.StatusOK {
			continue
		}
		d := g.policy.Evaluate(residency.Attributes{Tenant: o.tenant, DataClass: o.class, OriginRegion: o.origin})
		if o.region == "" || !d.Allows(o.region) {
			out = append(out, o)
		}
	}
	return out
}

// inFlightOn reports whether o was in flight on the replica id when it
// was killed at kill: sent to it, or answered by one of its pods, before
// the kill, and not finished before it.
func inFlightOn(o outcome, id string, kill time.Time) bool {
	return (o.entry == id || o.servedBy == id) && o.start.Before(kill) && !o.end.Before(kill)
}

// checkKill fails the test for any failure in [from, to) other than a
// request in flight on the killed replica, and returns how many were.
func checkKill(t *testing.T, g *loadgen, from time.Time, id string, kill time.Time) (lost, served int) {
	t.Helper()
	for _, o := range g.since(from) {
		switch {
		case !o.failed():
			served++
		case inFlightOn(o, id, kill):
			lost++
		default:
			t.Errorf("request failed that was not in flight on %s at its kill: %+v", id, o)
		}
	}
	return lost, served
}

func leaderReplica(f *Fleet) *Replica {
	for _, r := range f.Regions {
		for _, rep := range r.Replicas {
			if c := rep.Controller(); c != nil && c.Global().IsLeader() {
				return rep
			}
		}
	}
	return nil
}

// Issue 13 acceptance: 3 regions x 2 replicas (engine simulators, kfake,
// real Raft and gossip), under load from every region through a balancer
// over each region's replicas. Killing a replica fails only the requests in
// flight on it; a rolling restart of every replica, one at a time, fails
// none; killing the replica that leads Raft elects another leader while
// serving goes on; no answer is ever served where the policy forbids.
func TestReplicasSurviveKillsAndRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region, multi-replica")
	}
	f := startFleet(t, Config{Replicas: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var all []*Replica
	for _, r := range f.Regions {
		all = append(all, r.Replicas...)
	}
	g := startLoad(f, 8)
	halted := false
	defer func() {
		if !halted {
			g.halt()
		}
	}()
	began := time.Now()
	g.waitServed(t, began, 20, time.Minute)

	// A replica that does not lead Raft, killed under load, then started
	// again (its index rebuilt from the topic before it is ready).
	var victim *Replica
	for _, rep := range all {
		if rep != leaderReplica(f) && rep.Region == "us-east-1" {
			victim = rep
			break
		}
	}
	phase := time.Now()
	kill := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	g.waitServed(t, kill, 20, time.Minute)
	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g.waitServed(t, time.Now(), 10, time.Minute)
	lost, served := checkKill(t, g, phase, victim.ID, kill)
	t.Logf("kill %s: %d requests in flight on it failed, %d served", victim.ID, lost, served)

	// A rolling restart: every replica stopped gracefully and started
	// again, one at a time, under load. No request fails.
	phase = time.Now()
	for _, rep := range all {
		if err := rep.Stop(ctx); err != nil {
			t.Fatalf("stop %s: %v", rep.ID, err)
		}
		if err := rep.Start(ctx); err != nil {
			t.Fatal(err)
		}
		g.waitServed(t, time.Now(), 5, time.Minute)
	}
	rolled := g.since(phase)
	failed := 0
	for _, o := range rolled {
		if o.failed() {
			failed++
			t.Errorf("request failed during the rolling restart: %+v", o)
		}
	}
	t.Logf("rolling restart of %d replicas: %d requests, %d failed", len(all), len(rolled), failed)

	// The replica that leads Raft, killed: another is elected (measured
	// from the kill to a leader known to every running controller), and
	// requests are served meanwhile.
	leader := leaderReplica(f)
	if leader == nil {
		t.Fatal("no raft leader")
	}
	phase = time.Now()
	kill = time.Now()
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	var elected time.Duration
	for elected == 0 {
		agreed, id := true, ""
		for _, c := range f.Controllers() {
			l := c.Global().Leader()
			if l == "" || l == leader.ID || (id != "" && l != id) {
				agreed = false
				break
			}
			id = l
		}
		if agreed {
			elected = time.Since(kill)
			break
		}
		if time.Since(kill) > time.Minute {
			t.Fatal("no new raft leader within a minute of killing the leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	servedDuring := 0
	for _, o := range g.since(kill) {
		if !o.failed() && o.end.Before(kill.Add(elected)) {
			servedDuring++
		}
	}
	t.Logf("raft leader %s killed: new leader in %v; %d requests served meanwhile", leader.ID, elected.Round(time.Millisecond), servedDuring)
	// The 5 s target is measured and logged; the bound here is generous
	// (a loaded test machine), a hang would not pass it.
	if elected > 30*time.Second {
		t.Errorf("new leader after %v", elected)
	}
	g.waitServed(t, kill, 20, time.Minute)
	if err := leader.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g.waitServed(t, time.Now(), 10, time.Minute)
	lost, served = checkKill(t, g, phase, leader.ID, kill)
	t.Logf("kill of the raft leader %s: %d requests in flight on it failed, %d served", leader.ID, lost, served)

	g.halt()
	halted = true
	if v := g.violations(); len(v) > 0 {
		t.Errorf("%d answers served where the policy forbids, e.g. %+v", len(v), v[0])
	}
	t.Logf("in all: %d requests, 0 residency violations", len(g.since(began)))
}
