package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// fallbackPolicy is the example policy with one more rule: acme's public
// data may be served in either zone, wherever it enters.
func fallbackPolicy(t *testing.T) []byte {
	t.Helper()
	anchor := "  - name: public-from-eu\n"
	if !strings.Contains(string(ExamplePolicy), anchor) {
		t.Fatalf("the example policy has no rule public-from-eu")
	}
	return []byte(strings.Replace(string(ExamplePolicy), anchor, `  - name: acme-public-anywhere
    match: {tenant: acme, data_class: public}
    allow: [us, eu]

`+anchor, 1))
}

// records returns the records of a controller's audit log with the given
// decision id, in order.
func records(t *testing.T, c *regional.Controller, decisionID string) []audit.Record {
	t.Helper()
	all, err := audit.NaiveQuery(c.Audit().Dir(), audit.Query{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Record
	for _, r := range all {
		if r.DecisionID == decisionID {
			out = append(out, r)
		}
	}
	return out
}

// kinds lists "kind region" of each record.
func kinds(recs []audit.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Kind)+" "+r.Region)
	}
	return out
}

// Issue acceptance (faults, forwards fall back): a forward whose first
// region fails before answering goes to the next allowed region, within
// the request's budget, on the in-process fleet with real HTTP. acme's
// public data entering us-west-2 (failed over by an operator, so served
// elsewhere) is placed on eu-west-1, where its long prefix is warm. With
// eu-west-1's pods stalled (a first-byte timeout), then with its address
// refusing connections, the client gets its answer from us-east-1, the
// origin's audit log holds the crossing to eu-west-1 and the fallback to
// us-east-1 under the request's decision id, and us-east-1's holds the
// forwarded-in record. EU PHI entering us-west-2, which only eu-west-1 may
// serve, gets a clear error each time, never an answer from a US region.
func TestForwardFallsBackToTheNextAllowedRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	euAPI := ln.Addr().String()
	ln.Close()
	hole := newBlackhole(t, euAPI)
	f := startFleet(t, Config{
		Policy: fallbackPolicy(t),
		Controller: func(region string, c *regional.Config) {
			c.Decision.SpeculationTTL = 0 // decisions from what the indexes hold
			if region == "eu-west-1" {
				// Other regions forward to eu-west-1 through the proxy.
				c.Listen, c.PublicURL = euAPI, "https://"+hole.addr()
			}
		},
	})
	east, west, eu := f.Region("us-east-1").Controller, f.Region("us-west-2").Controller, f.Region("eu-west-1").Controller
	acme := map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}
	phi := map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}
	hc := *f.HTTP
	hc.Timeout = 60 * time.Second
	rng := rand.New(rand.NewPCG(3, 4))
	// Two long prefixes (~7k tokens each), one per fault: once a request
	// with one has fallen back to us-east-1, it is warm there too.
	longs := []string{"Long shared context. " + text(rng, 6000), "Another long context. " + text(rng, 6000)}

	// us-west-2 is failed over: what enters it is served elsewhere.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := global.NewClient(west.AdminURL(), f.AdminToken, f.HTTP).Trigger(ctx,
		global.FailoverRequest{Region: "us-west-2", Reason: "fallback test", Force: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every controller sees us-west-2 failed", func() bool { return f.nowhereRoutable("us-west-2") })

	// The long prefixes are warm in eu-west-1 only, and us-west-2 places
	// them there.
	var lastRoute regional.RouteResponse
	for i, long := range longs {
		if a := ask(t, &hc, eu.URL(), "/v1/chat/completions", acme, long, "first question"); a.status != 200 || a.region != "eu-west-1" {
			t.Fatalf("warming eu-west-1: %+v", a)
		}
		eventually(t, fmt.Sprintf("us-west-2 places long prefix %d on eu-west-1", i), func() bool {
			lastRoute = routeOf(t, &hc, west.URL(), acme, long, "another question")
			return lastRoute.Region == "eu-west-1" && lastRoute.Remote
		})
	}
	defer func() {
		if t.Failed() {
			t.Logf("last route: %s %s", lastRoute.Region, lastRoute.Cost)
		}
	}()

	fallback := func(fault, long, q string) {
		t.Helper()
		if rr := routeOf(t, &hc, west.URL(), acme, long, q); rr.Region != "eu-west-1" {
			t.Fatalf("%s: us-west-2 would place the request on %s, not eu-west-1: %s", fault, rr.Region, rr.Cost)
		}
		a := ask(t, &hc, west.URL(), "/v1/chat/completions", acme, long, q)
		if a.status != 200 || a.region != "us-east-1" {
			t.Fatalf("%s: acme's request entering us-west-2: %d from %q (forwarded to %q): %s", fault, a.status, a.region, a.forwarded, a.body)
		}
		got := kinds(records(t, west, a.decisionID))
		if want := []string{"cross_region eu-west-1", "fallback us-east-1"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Fatalf("%s: us-west-2's records of decision %s: %v, want %v", fault, a.decisionID, got, want)
		}
		for _, r := range records(t, west, a.decisionID) {
			var cost regional.CostExplanation
			if err := json.Unmarshal(r.Cost, &cost); err != nil || cost.Chosen != r.Region || len(cost.Candidates) < 2 {
				t.Fatalf("%s: %s record without its cost breakdown: %s (%v)", fault, r.Kind, r.Cost, err)
			}
		}
		if got := kinds(records(t, east, a.decisionID)); len(got) != 1 || got[0] != "forwarded_in us-east-1" {
			t.Fatalf("%s: us-east-1's records of decision %s: %v", fault, a.decisionID, got)
		}
		t.Logf("%s: served by us-east-1 after eu-west-1 failed; records %v", fault, got)

		// EU PHI has nowhere else to go: a clear error, never a US answer.
		p := ask(t, &hc, west.URL(), "/v1/chat/completions", phi, "EU patient record, "+q)
		if p.status == 200 || p.status < 500 || !strings.Contains(p.body, `"upstream_failed"`) || strings.HasPrefix(p.region, "us-") {
			t.Fatalf("%s: EU PHI entering us-west-2: %d from %q: %s", fault, p.status, p.region, p.body)
		}
		if strings.Contains(p.body, "127.0.0.1") || strings.Contains(p.body, "https://") {
			t.Fatalf("%s: the error names another region's controller's address: %s", fault, p.body)
		}
		if got := kinds(records(t, west, p.decisionID)); len(got) != 1 || got[0] != "cross_region eu-west-1" {
			t.Fatalf("%s: us-west-2's records of the EU PHI decision: %v, want only the crossing to eu-west-1", fault, got)
		}
		t.Logf("%s: EU PHI: %d %s", fault, p.status, strings.TrimSpace(p.body))
	}

	// 1. eu-west-1 takes the request and its pods never answer: the
	// forward's first-byte timeout (RTT and expected TTFT, well under the
	// 120 s cap) ends the try.
	before := counter(t, west, "meridian_router_upstream_errors_total", map[string]string{"kind": "first_byte_timeout"})
	for _, e := range f.Region("eu-west-1").Engines {
		if err := e.SetFaults(enginesim.Faults{StallRate: 1}); err != nil {
			t.Fatal(err)
		}
	}
	fallback("first-byte timeout", longs[0], "second question")
	if after := counter(t, west, "meridian_router_upstream_errors_total", map[string]string{"kind": "first_byte_timeout"}); after <= before {
		t.Fatal("no first-byte timeout counted at us-west-2")
	}
	for _, e := range f.Region("eu-west-1").Engines {
		if err := e.SetFaults(enginesim.Faults{}); err != nil {
			t.Fatal(err)
		}
	}

	// 2. Nothing listens at eu-west-1's address any more: refused.
	hole.refuse()
	fallback("connection refused", longs[1], "second question")
}
