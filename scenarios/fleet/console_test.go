package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/console"
)

// TestConsoleShowsTheFleet: a controller's console, on its admin listener
// over TLS, shows what happened in a real three-region fleet: its pods,
// the other regions, Raft and gossip health, the EU PHI that crossed to
// eu-west-1 and the embargoed tenant's denial by rule, the failover and
// recovery of us-west-2, and the traffic in its series. Its first requests
// are also the fleet's smoke test (it was TestFleetSmoke, on a fleet of its
// own): public data entering us-east-1 is served there, EU PHI entering it
// is forwarded to and served in eu-west-1, the embargoed tenant gets 451.
func TestConsoleShowsTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{})
	east := f.Region("us-east-1").Controller
	con := east.Console()
	if con == nil {
		t.Fatal("a controller with an admin listener has no console")
	}
	// Readings are taken on the console's own ticker too; these two
	// bracket the traffic below, whatever the ticker did.
	if err := con.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	us := east.URL()
	if r := chat(t, f.HTTP, us, map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}, "hello"); r.status != 200 || r.region != "us-east-1" {
		t.Fatalf("public request from us-east-1: %+v", r)
	}
	if r := chat(t, f.HTTP, us, map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}, "patient"); r.status != 200 || r.region != "eu-west-1" || r.to != "eu-west-1" {
		t.Fatalf("EU PHI entering in us-east-1 must be served in eu-west-1: %+v", r)
	}
	if r := chat(t, f.HTTP, us, map[string]string{regional.HeaderTenant: "embargoed-x", regional.HeaderDataClass: "public"}, "x"); r.status != 451 {
		t.Fatalf("embargoed: %+v", r)
	}
	admin := global.NewClient(f.Region("eu-west-1").Controller.AdminURL(), f.AdminToken, f.HTTP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := admin.Trigger(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "console test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Recover(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "console test"}); err != nil {
		t.Fatal(err)
	}
	if err := con.Sample(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}

	get := func(path, token string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, east.AdminURL()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := f.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, b
	}
	if !strings.HasPrefix(east.AdminURL(), "https://") {
		t.Errorf("admin listener %s: not TLS", east.AdminURL())
	}
	if code, page := get("/ui", ""); code != 200 || !strings.Contains(string(page), "Meridian console") {
		t.Fatalf("page: %d", code)
	}
	if code, _ := get("/ui/api/state", ""); code != http.StatusUnauthorized {
		t.Fatalf("state without the admin token: %d", code)
	}
	state := func() console.State {
		code, b := get("/ui/api/state", f.AdminToken)
		if code != 200 {
			t.Fatalf("state: %d %s", code, b)
		}
		var s console.State
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Region state changes reach the console when this controller applies
	// them: wait for the recovery.
	eventually(t, "the console shows us-west-2's failover and recovery", func() bool {
		fs := con.State().Failovers
		return len(fs) >= 2 && fs[0].Region == "us-west-2" && fs[0].To == "active"
	})
	s := state()

	if s.Controller != east.ID() || s.Region != "us-east-1" || !s.Ready || s.PolicyVersion == "" {
		t.Errorf("header: %s %s ready %v policy %q", s.Controller, s.Region, s.Ready, s.PolicyVersion)
	}
	if len(s.Pods) != 2 {
		t.Errorf("pods %+v", s.Pods)
	}
	var names []string
	for _, r := range s.Regions {
		names = append(names, r.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"eu-west-1", "us-east-1", "us-west-2"}) {
		t.Errorf("regions %v", names)
	}
	if s.Raft == nil || s.Raft.Leader == "" || len(s.Raft.Members) != 3 || s.Gossip == nil || s.Gossip.Isolated {
		t.Errorf("raft %+v gossip %+v", s.Raft, s.Gossip)
	}
	if s.Residency.CrossingsByRule["eu-health-phi"] < 1 || s.Residency.DenialsByRule["embargoed-tenants"] < 1 {
		t.Errorf("residency %+v", s.Residency)
	}
	kinds := map[string]bool{}
	for _, d := range s.Decisions {
		kinds[d.Kind] = true
		if d.Kind == "cross_region" && (d.Region != "eu-west-1" || d.PolicyVersion == "" || d.DecisionID == "") {
			t.Errorf("crossing %+v", d)
		}
	}
	if !kinds["cross_region"] || !kinds["residency_denied"] {
		t.Errorf("decisions %+v", s.Decisions)
	}
	if fs := s.Failovers; fs[1].Region != "us-west-2" || fs[1].From != "active" || fs[1].To != "failed" || fs[0].From != "failed" || fs[0].Reason != "console test" {
		t.Errorf("failovers %+v", fs)
	}
	if n := len(s.Series); n < 1 {
		t.Fatal("no point in the series")
	}
	var answered float64
	for _, p := range s.Series {
		answered += p.ReqPerS
	}
	if answered <= 0 || s.Totals.Requests < 3 || s.Totals.CrossRegion < 1 {
		t.Errorf("series %+v totals %+v", s.Series, s.Totals)
	}
}
