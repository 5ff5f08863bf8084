package regional

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// TestRecoveringRegionServesWhatOnlyItMay: after an automatic failover,
// a region recovering (healthy again, in its hold-down) still serves the
// traffic that no routable region may serve, entering here or forwarded
// in; the hold-down only keeps away traffic that has a choice. A region
// failed by hand serves nothing.
func TestRecoveringRegionServesWhatOnlyItMay(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{Region: func(int) string { return "eu-west-1" }, Configure: func(_ int, cfg *global.Config) {
		cfg.PolicyValidator, cfg.PolicyCompiler = PolicyValidator, PolicyCompiler
	}})
	node := c.Nodes[0].Node
	ctl, err := NewGlobalControl(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := node.ApplyPolicy(ctx, "example.yaml", doc, "test", global.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	set := func(st global.RegionState, auto bool) {
		t.Helper()
		if _, err := node.SetRegionState(ctx, global.RegionChange{Region: "eu-west-1", State: st, Automatic: auto, Force: true, Reason: "test"},
			global.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f := newServerFixture(t, []http.HandlerFunc{okJSON}, nil)
	f.srv.SetTopology(Topology{Region: "eu-west-1", Control: ctl, HopToken: "hop-token-of-thirty-two-bytes-xx"})
	phi := []string{HeaderTenant, "eu-health", HeaderDataClass, "phi"}
	hop := append([]string{HeaderHop, "us-east-1", HeaderHopAuth, "hop-token-of-thirty-two-bytes-xx"}, phi...)

	set(global.RegionFailed, true)
	set(global.RegionRecovering, true)
	for name, hdr := range map[string][]string{"entering here": phi, "forwarded in": hop} {
		if resp, b := post(t, f.url+"/v1/chat/completions", chatBody, hdr...); resp.StatusCode != http.StatusOK {
			t.Errorf("EU PHI %s, eu-west-1 recovering: %d %s", name, resp.StatusCode, b)
		}
	}

	set(global.RegionFailed, false) // by an operator
	for name, hdr := range map[string][]string{"entering here": phi, "forwarded in": hop} {
		if resp, b := post(t, f.url+"/v1/chat/completions", chatBody, hdr...); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("EU PHI %s, eu-west-1 failed by an operator: %d %s", name, resp.StatusCode, b)
		}
	}
}
