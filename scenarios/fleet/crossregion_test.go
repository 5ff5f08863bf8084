package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

func startFleet(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg.Dir = t.TempDir()
	if cfg.Logger == nil {
		// The controllers' log, shown when the test fails: what the
		// replicas saw is most of what a flake leaves to go on.
		var buf syncBuffer
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("controllers' log (warnings, then the last %d lines):\n%s", logTail, failureLog(buf.Bytes()))
			}
		})
	}
	f, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.Close(cctx); err != nil {
			t.Errorf("fleet close: %v", err)
		}
	})
	return f
}

type answer struct {
	status     int
	region     string // where it was served
	forwarded  string
	decisionID string
	cached     int
	prompt     int
	body       string
}

// logTail is how many of the controllers' last log lines a failed fleet
// test prints.
const logTail = 300

// failureLog is the warnings and errors of a log (at most 200, the last),
// then its last logTail lines.
func failureLog(b []byte) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	tail := lines[max(0, len(lines)-logTail):]
	var warn []string
	for _, l := range lines[:len(lines)-len(tail)] {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			warn = append(warn, l)
		}
	}
	warn = warn[max(0, len(warn)-200):]
	return strings.Join(warn, "\n") + "\n---- last lines ----\n" + strings.Join(tail, "\n")
}

// ask sends a non-streaming chat request with the given headers.
func ask(t *testing.T, hc *http.Client, url, path string, hdr map[string]string, msgs ...string) answer {
	t.Helper()
	var m []map[string]string
	for i, c := range msgs {
		role := "user"
		if i == 0 && len(msgs) > 1 {
			role = "system"
		}
		m = append(m, map[string]string{"role": role, "content": c})
	}
	body, _ := json.Marshal(map[string]any{"model": "meridian/sim-70b", "max_tokens": 2, "messages": m})
	req, _ := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, region: resp.Header.Get("X-Meridian-Region"), forwarded: resp.Header.Get("X-Meridian-Forwarded-To"),
		decisionID: resp.Header.Get(regional.HeaderDecisionID), body: string(b)}
	var u struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &u) == nil {
		a.cached, a.prompt = u.Usage.PromptTokensDetails.CachedTokens, u.Usage.PromptTokens
	}
	return a
}

func text(rng *rand.Rand, words int) string {
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which his her their has have had not but were one all also they can more other these some when time would into two only first new about been may who over such after most then used world city year state people between during under")
	var b strings.Builder
	for i := 0; i < words; i++ {
		b.WriteString(vocab[rng.IntN(len(vocab))])
		b.WriteByte(' ')
		if rng.IntN(8) == 0 {
			fmt.Fprintf(&b, "%d ", rng.IntN(100000))
		}
	}
	return b.String()
}

// routeOf asks a controller where it would send a request (/v1/route).
func routeOf(t *testing.T, hc *http.Client, url string, hdr map[string]string, msgs ...string) regional.RouteResponse {
	t.Helper()
	a := ask(t, hc, url, "/v1/route", hdr, msgs...)
	var rr regional.RouteResponse
	if a.status != 200 || json.Unmarshal([]byte(a.body), &rr) != nil {
		t.Fatalf("route: %d %s", a.status, a.body)
	}
	return rr
}

// Issue acceptance: a long prefix warm in a remote region is forwarded when
// the expected saving exceeds the RTT, and kept home when it does not.
func TestCrossRegionForwardsOnlyWhenItPays(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	// No speculation: us-west-2's /v1/route below must say what its index
	// holds (what its summary is built from), not what a pod just computed.
	f := startFleet(t, Config{Controller: func(_ string, c *regional.Config) { c.Decision.SpeculationTTL = 0 }})
	east, west := f.Region("us-east-1").Controller.URL(), f.Region("us-west-2").Controller.URL()
	pub := map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}
	rng := rand.New(rand.NewPCG(1, 2))
	long := "Long shared context. " + text(rng, 6000) // ~7k tokens
	short := "Short context. " + text(rng, 150)       // ~200 tokens

	// Warm both in us-west-2 (public data from the us zone may be served in either us region).
	for _, sys := range []string{long, short} {
		if a := ask(t, f.HTTP, west, "/v1/chat/completions", pub, sys, "first question"); a.status != 200 || a.region != "us-west-2" {
			t.Fatalf("warming us-west-2: %+v", a)
		}
	}
	// us-east-1 learns of it through us-west-2's summary; then the long
	// prompt goes there (saving ~7k tokens of prefill, 2.5 s, against 65 ms).
	// Wait for the summary itself, not for a /v1/route answer, so that no
	// decision at all is made at us-east-1 before the ones below.
	eventually(t, "us-west-2 indexes the long prefix", func() bool {
		rr := routeOf(t, f.HTTP, west, pub, long, "second question")
		return rr.Decision != nil && rr.MatchedBlocks*rr.BlockSize >= 6000
	})
	indexed := time.Now()
	eventually(t, "us-east-1 holds a us-west-2 summary built since", func() bool {
		rv, ok := f.Region("us-east-1").Controller.Gossip().View().Region("us-west-2")
		return ok && rv.Summary != nil && rv.Summary.BuiltAt.After(indexed)
	})
	// /v1/route is a dry run: however often it answers "us-west-2", it
	// writes no audit record and does not count toward the remote-share
	// guardrail (it used to, and the request that followed a few such
	// answers was then held at home by the share cap), nor does a denial.
	eastAudit := f.Region("us-east-1").Controller.Audit()
	before := eastAudit.Checkpoint().LastSeq
	for i := range 4 {
		if rr := routeOf(t, f.HTTP, east, pub, long, fmt.Sprintf("question %d", i)); rr.Region != "us-west-2" || !rr.Remote {
			t.Fatalf("route %d: %s (remote %v), cost %s", i, rr.Region, rr.Remote, rr.Cost)
		}
	}
	if a := ask(t, f.HTTP, east, "/v1/route", map[string]string{regional.HeaderTenant: "embargoed-1"}, "hello"); a.status != http.StatusUnavailableForLegalReasons {
		t.Fatalf("embargoed route: %d %s", a.status, a.body)
	}
	if after := eastAudit.Checkpoint().LastSeq; after != before {
		t.Fatalf("/v1/route wrote %d audit records", after-before)
	}
	a := ask(t, f.HTTP, east, "/v1/chat/completions", pub, long, "third question")
	if a.status != 200 || a.forwarded != "us-west-2" || a.region != "us-west-2" || a.cached < 6000 {
		t.Fatalf("long warm prefix not forwarded to us-west-2 or not a hit there: %+v", a)
	}
	if after := eastAudit.Checkpoint().LastSeq; after != before+1 {
		t.Fatalf("the forwarded request wrote %d audit records, want 1", after-before)
	}
	// The short one stays home: ~200 tokens of prefill (72 ms) does not beat
	// 65 ms of RTT plus the forwarding margin.
	rr := routeOf(t, f.HTTP, east, pub, short, "another question")
	if rr.Region != "us-east-1" || rr.Remote {
		t.Fatalf("short warm prefix forwarded: %+v", rr)
	}
	if a := ask(t, f.HTTP, east, "/v1/chat/completions", pub, short, "another question"); a.status != 200 || a.region != "us-east-1" || a.forwarded != "" {
		t.Fatalf("short prompt not served at home: %+v", a)
	}

	// A model no region serves: 404 model_not_found, decided at home from
	// the pods and the summaries; nothing forwarded, nothing recorded.
	before = eastAudit.Checkpoint().LastSeq
	body, _ := json.Marshal(map[string]any{"model": "gpt-9", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	for _, path := range []string{"/v1/chat/completions", "/v1/route"} {
		req, _ := http.NewRequest(http.MethodPost, east+path, bytes.NewReader(body))
		req.Header.Set(regional.HeaderTenant, "eu-health")
		req.Header.Set(regional.HeaderDataClass, "phi")
		resp, err := f.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"code":"model_not_found"`) || resp.Header.Get("X-Meridian-Forwarded-To") != "" {
			t.Fatalf("unknown model on %s: %d %s", path, resp.StatusCode, b)
		}
	}
	if after := eastAudit.Checkpoint().LastSeq; after != before {
		t.Fatalf("an unknown model wrote %d audit records", after-before)
	}
}

// Issue acceptance: on a randomized run (tenants, data classes, origins,
// warm prefixes in every region, a region failed half way) no request is
// ever served outside the regions the policy allows; every cross-region
// decision is in the audit log exactly once; verify finds the log intact,
// and finds an edit.
func TestResidencyAndAuditOnRandomizedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{})
	pol := f.Policy
	rng := rand.New(rand.NewPCG(7, 7))
	contexts := make([]string, 6)
	for i := range contexts {
		contexts[i] = fmt.Sprintf("Context %d. ", i) + text(rng, 3000)
	}
	// Tenants come from authentication (here a trusted gateway on
	// loopback, which must name one); "EU-Health" checks they compare
	// case-insensitively.
	tenants := []string{"acme", "eu-health", "EU-Health", "embargoed-7", "globex"}
	classes := []string{"phi", "pii", "public", "internal", "", "secret"}
	forwarded := map[string]string{} // decision id -> region
	denied := 0
	for i := 0; i < 150; i++ {
		if i == 75 {
			// Fail eu-west-1 half way: EU PHI must then be refused, never
			// served elsewhere.
			c := global.NewClient(f.Region("us-east-1").Controller.AdminURL(), f.AdminToken, f.HTTP)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			// The cluster refuses, naming the traffic left with nowhere to
			// go, unless forced.
			_, err := c.Trigger(ctx, global.FailoverRequest{Region: "eu-west-1", Reason: "randomized test"})
			var api *global.APIError
			if !errors.As(err, &api) || api.Code != global.CodeStrandsTraffic || !strings.Contains(api.Message, "rule eu-health-phi (tenant eu-health, data class phi)") {
				t.Fatalf("emptying the EU zone without force: %v", err)
			}
			_, err = c.Trigger(ctx, global.FailoverRequest{Region: "eu-west-1", Reason: "randomized test", Force: true})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "every controller sees eu-west-1 failed", func() bool { return f.nowhereRoutable("eu-west-1") })
		}
		origin := f.Regions[rng.IntN(len(f.Regions))]
		hdr := map[string]string{regional.HeaderTenant: tenants[rng.IntN(len(tenants))], regional.HeaderDataClass: classes[rng.IntN(len(classes))]}
		a := ask(t, f.HTTP, origin.Controller.URL(), "/v1/chat/completions", hdr, contexts[rng.IntN(len(contexts))], text(rng, 20))
		attrs := residency.Attributes{Tenant: hdr[regional.HeaderTenant], DataClass: hdr[regional.HeaderDataClass], OriginRegion: origin.Name}
		want := pol.Evaluate(attrs)
		if attrs.DataClass == "" {
			// No data class: the strictest treatment, the origin zone only.
			want = pol.EvaluateUnclassified(attrs)
		}
		switch a.status {
		case 200:
			if !want.Allows(a.region) {
				t.Fatalf("request %d (%v from %s) served in %s, outside %v", i, hdr, origin.Name, a.region, want.Regions())
			}
			if i >= 75 && a.region == "eu-west-1" {
				t.Fatalf("request %d served in failed eu-west-1", i)
			}
			if a.forwarded != "" {
				if a.forwarded == origin.Name || a.forwarded != a.region {
					t.Fatalf("request %d: forwarded %q, served %q, origin %s", i, a.forwarded, a.region, origin.Name)
				}
				forwarded[a.decisionID] = a.region
			}
		case 451:
			denied++
			if !want.Allowed.Empty() {
				t.Fatalf("request %d (%v from %s) denied though %v allowed: %s", i, hdr, origin.Name, want.Regions(), a.body)
			}
		case 503:
			// Only when every allowed region is unavailable (eu-west-1 failed
			// and the request may be served only there).
			if i < 75 || !strings.Contains(a.body, "residency_no_healthy_region") || want.Regions()[0] != "eu-west-1" || len(want.Regions()) != 1 {
				t.Fatalf("request %d (%v from %s): 503 %s", i, hdr, origin.Name, a.body)
			}
		default:
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	t.Logf("%d cross-region requests, %d denied", len(forwarded), denied)
	if len(forwarded) == 0 || denied == 0 {
		t.Fatalf("the run exercised no forwarding (%d) or no denial (%d)", len(forwarded), denied)
	}

	// Every cross-region decision exactly once.
	dir := f.AuditDir()
	seen := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := &audit.DirSource{Dir: dir}
	cur, err := src.Query(ctx, audit.Query{Kinds: []audit.Kind{audit.KindCrossRegion}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := cur.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[rec.DecisionID]++
		if want, ok := forwarded[rec.DecisionID]; !ok || want != rec.Region || rec.PolicyVersion == "" || len(rec.Cost) < 10 {
			t.Fatalf("audit record %s (to %s) does not match a forwarded request: %+v", rec.DecisionID, rec.Region, rec)
		}
	}
	_ = cur.Close()
	for id := range forwarded {
		if seen[id] != 1 {
			t.Fatalf("decision %s recorded %d times", id, seen[id])
		}
	}

	// Intact against the Raft checkpoints; an edit is found.
	for _, r := range f.Regions {
		_ = r.Controller.Audit().Close() // seal and checkpoint
	}
	var cps []audit.Checkpoint
	st := f.Region("us-east-1").Controller.Global().State()
	for _, ctl := range st.CheckpointControllers() {
		for _, c := range st.Checkpoints(ctl) {
			cps = append(cps, c.AuditCheckpoint())
		}
	}
	rep, err := audit.Verify(dir, cps)
	if err != nil || len(rep.Problems) > 0 {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	// Edit one byte of the first record, whatever its kind (a random run
	// may have left no cross-region record in this controller's log).
	seg := firstSegment(t, filepath.Join(dir, "ctl-us-east-1"))
	b, _ := os.ReadFile(seg)
	at := bytes.Index(b, []byte(`"origin":"`))
	if at < 0 {
		t.Fatalf("no record in %s", seg)
	}
	at += len(`"origin":"`)
	b[at] ^= 0x20 // flip the case of the origin's first letter
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = audit.Verify(dir, cps)
	if err != nil || len(rep.Problems) == 0 {
		t.Fatalf("an edited record went unnoticed: %v %+v", err, rep)
	}
	t.Logf("verify after an edit: %+v", rep.Problems[0])
}

func firstSegment(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".jsonl") {
			return filepath.Join(dir, e.Name())
		}
	}
	t.Fatalf("no segment in %s", dir)
	return ""
}

// Issue acceptance: from `failover trigger` returning to every controller
// routing away from the region (target under 1 s on loopback), and back.
func TestFailoverMovesTrafficFast(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{})
	c := global.NewClient(f.Region("eu-west-1").Controller.AdminURL(), f.AdminToken, f.HTTP)
	west := f.Region("us-west-2").Controller
	pub := map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Trigger(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Watch every controller's state change notification, not a poll.
	for _, r := range f.Regions {
		n := r.Controller.Global()
		for {
			ch := n.StateChanged()
			if !n.State().Routable("us-west-2") {
				break
			}
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s never saw the failover", r.Name)
			}
		}
	}
	moved := time.Since(start)
	// The failed region's own controller sends its traffic to an allowed region.
	a := ask(t, f.HTTP, west.URL(), "/v1/chat/completions", pub, "hello from the west")
	if a.status != 200 || a.region != "us-east-1" {
		t.Fatalf("traffic entering failed us-west-2: %+v", a)
	}
	t.Logf("failover seen by every controller %v after trigger returned", moved)
	if moved > time.Second {
		t.Errorf("failover took %v to reach every controller, target 1s", moved)
	}
	if _, err := c.Recover(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "us-west-2 routable again", func() bool { return west.Global().State().Routable("us-west-2") })
	if a := ask(t, f.HTTP, west.URL(), "/v1/chat/completions", pub, "hello again"); a.status != 200 || a.region != "us-west-2" {
		t.Fatalf("after recovery: %+v", a)
	}
}

// eventually polls cond (every 20 ms, up to 30 s): the conditions are
// things the system makes happen (a summary published, a commit applied).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		<-tick.C
	}
}

// nowhereRoutable reports whether every controller sees region as not
// routable.
func (f *Fleet) nowhereRoutable(region string) bool {
	for _, r := range f.Regions {
		if r.Controller.Global().State().Routable(region) {
			return false
		}
	}
	return true
}

// Issue acceptance (automatic failover): when a region's healthy pod count
// falls below the threshold the leader fails it, traffic entering it goes
// to an allowed region, and once healthy again it recovers after the
// hold-down.
func TestAutomaticFailoverOnPodLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{Controller: func(region string, c *regional.Config) {
		c.AutoFailover = regional.AutoFailoverConfig{Enabled: true, Interval: 200 * time.Millisecond, MinHealthyPods: 1,
			Grace: 500 * time.Millisecond, HoldDown: time.Second}
	}})
	west := f.Region("us-west-2")
	pub := map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}
	for _, e := range west.Engines {
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "us-west-2 failed automatically", func() bool { return f.nowhereRoutable("us-west-2") })
	if s := west.Controller.Global().State().RegionState("us-west-2").String(); s != "failed" {
		t.Fatalf("us-west-2 is %s", s)
	}
	if a := ask(t, f.HTTP, west.Controller.URL(), "/v1/chat/completions", pub, "hello"); a.status != 200 || a.region != "us-east-1" {
		t.Fatalf("traffic entering us-west-2 while failed: %+v", a)
	}
	// Pods come back: recovering, then active after the hold-down.
	for i := range west.Engines {
		cfg := west.Engines[i].Config()
		cfg.Addr, cfg.Epoch, cfg.Registry = "127.0.0.1:0", 0, nil
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		west.Engines[i] = e
	}
	eventually(t, "us-west-2 back to active", func() bool {
		return west.Controller.Global().State().RegionState("us-west-2").String() == "active"
	})
	if a := ask(t, f.HTTP, west.Controller.URL(), "/v1/chat/completions", pub, "hello again"); a.status != 200 || a.region != "us-west-2" {
		t.Fatalf("after recovery: %+v", a)
	}
}

// Issue acceptance (failures): when a region's last pods die (killed: no
// PodDown, their ports refuse connections), the very first request that
// may be served elsewhere is: each refusing pod is ejected at once and the
// request spills to the next allowed region, recorded as a fallback; the
// region's /readyz then counts no pod.
func TestSpillWhenEveryPodRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{})
	west := f.Region("us-west-2")
	for _, e := range west.Engines {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := e.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	url := west.Controller.URL()
	audit := west.Controller.Audit()
	before := audit.Checkpoint().LastSeq
	pub := map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}
	a := ask(t, f.HTTP, url, "/v1/chat/completions", pub, "You are terse.", "where am I served?")
	if a.status != 200 || a.region != "us-east-1" || a.forwarded != "us-east-1" {
		t.Fatalf("first request after the pods died: %+v", a)
	}
	if after := audit.Checkpoint().LastSeq; after != before+1 {
		t.Fatalf("%d audit records for the spill, want 1 (the fallback)", after-before)
	}
	resp, err := f.HTTP.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"pods":0`) {
		t.Fatalf("readyz after every pod died: %s", b)
	}
	// What only us-west-2's pods could serve (nothing else is allowed) has
	// nowhere to go: a clear 502, never a crossing the policy forbids.
	for _, e := range f.Region("us-east-1").Engines {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = e.Kill(ctx)
		cancel()
	}
	a = ask(t, f.HTTP, url, "/v1/chat/completions", pub, "You are terse.", "and now?")
	if a.status == 200 {
		t.Fatalf("served with every allowed pod dead: %+v", a)
	}

	// The failover status shows each controller's liveness next to its
	// region's state: us-west-2 is still active (nobody failed it over),
	// but its controller is gone.
	east := f.Region("us-east-1").Controller
	if err := west.Controller.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "us-east-1 sees us-west-2's controller gone", func() bool {
		for _, r := range east.Global().Status().Regions {
			if r.Region == "us-west-2" {
				l := r.Liveness["ctl-us-west-2"]
				return l == "dead" || l == "suspect"
			}
		}
		return false
	})
	for _, r := range east.Global().Status().Regions {
		if r.Region == "us-east-1" && r.Liveness["ctl-us-east-1"] != "alive" {
			t.Fatalf("the answering controller's own liveness: %+v", r)
		}
	}
}
