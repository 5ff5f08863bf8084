package regional

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
	"github.com/meridian-llm/meridian/residency"
)

// TestGlobalControlView: until a policy is committed the view serves the
// fallback; after, the committed policy with its decision version, and the
// region states of the same committed state.
func TestGlobalControlView(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{Region: func(int) string { return "eu-west-1" }, Configure: func(_ int, cfg *global.Config) {
		cfg.PolicyValidator, cfg.PolicyCompiler = PolicyValidator, PolicyCompiler
	}})
	node := c.Nodes[0].Node
	ctl, err := NewGlobalControl(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := ctl.View()
	if v.Err != nil || v.Policy == nil || !strings.HasPrefix(v.Version, "default/") || !v.Routable("eu-west-1") || v.RegionState("eu-west-1") != "active" {
		t.Fatalf("before any policy: %+v", v)
	}

	doc, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pv, err := node.ApplyPolicy(ctx, "example.yaml", doc, "test", global.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Trigger(ctx, "eu-west-1", "test", global.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := residency.Parse("example.yaml", doc)
	if err != nil {
		t.Fatal(err)
	}
	v = ctl.View()
	if v.Err != nil || v.Policy == nil || v.Policy.ID() != want.ID() || v.Version != pv.Ref()+"/"+want.ID() {
		t.Fatalf("after applying %s: version %q, err %v; want %q", pv.Ref(), v.Version, v.Err, pv.Ref()+"/"+want.ID())
	}
	if v.Routable("eu-west-1") || v.RegionState("eu-west-1") != "failed" || !v.Routable("us-east-1") {
		t.Fatalf("after failing eu-west-1 over: routable %v, state %q", v.Routable("eu-west-1"), v.RegionState("eu-west-1"))
	}
}

// TestStaticControlView: a view keeps the region states it was read with.
func TestStaticControlView(t *testing.T) {
	sc, err := NewStaticControl(nil)
	if err != nil {
		t.Fatal(err)
	}
	before := sc.View()
	sc.SetState("us-west-2", "draining")
	after := sc.View()
	if !before.Routable("us-west-2") || after.Routable("us-west-2") || after.RegionState("us-west-2") != "draining" ||
		!strings.HasPrefix(after.Version, "static/") || after.Policy == nil {
		t.Fatalf("before %+v after %+v", before, after)
	}
}
