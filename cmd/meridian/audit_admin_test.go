package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// nodeSink anchors an audit log's checkpoints in a Raft node, as the
// controller does.
type nodeSink struct{ node *global.Node }

func (s *nodeSink) PublishCheckpoint(ctx context.Context, cp audit.Checkpoint) error {
	_, err := s.node.AppendCheckpoint(ctx, global.CheckpointFromAudit(cp), global.WriteOptions{Actor: "audit:" + cp.Controller})
	return err
}

// TestAuditAdminActionsCLI: a failover through `meridian failover` is an
// admin_action record that `meridian audit query --kind admin_action`
// shows with its actor and outcome (a refused one too), and `meridian
// audit verify` checks against the checkpoint in Raft; with the audit log
// closed, `meridian failover` fails saying the action was not recorded.
func TestAuditAdminActionsCLI(t *testing.T) {
	root := t.TempDir()
	var log *audit.Log
	sink := &nodeSink{}
	c := globaltest.NewCluster(t, 1, globaltest.Options{Configure: func(i int, cfg *global.Config) {
		acfg := audit.DefaultConfig()
		acfg.Dir, acfg.ControllerID, acfg.HMACKey = root, cfg.NodeID, auditTestKey
		l, err := audit.Open(acfg, audit.Deps{Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		log, cfg.Audit = l, l
	}})
	sink.node = c.Nodes[0].Node
	admin := []string{"--admin", c.Nodes[0].URL(), "--token", c.Token}
	run := func(args ...string) (string, int, error) {
		t.Helper()
		return runCLI(t, newApp(), args...)
	}
	if out, code, err := run(append(append([]string{"failover", "trigger"}, admin...), "--region", "region-0", "--reason", "drill", "--actor", "operator:alice")...); code != 0 {
		t.Fatalf("trigger: %d %v %s", code, err, out)
	}
	if _, code, _ := run(append(append([]string{"failover", "recover"}, admin...), "--region", "Mars")...); code != 1 {
		t.Fatalf("recover of an invalid region: exit %d", code)
	}
	if err := log.Close(); err != nil { // its last checkpoint goes to Raft
		t.Fatal(err)
	}

	out, code, err := run("audit", "query", "--dir", root, "--kind", "admin_action")
	var lines []string // the records; the count goes to stderr, merged here
	var trigger, refused string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(l, " records") {
			continue
		}
		lines = append(lines, l)
		switch {
		case strings.Contains(l, "action=failover_trigger"):
			trigger = l
		case strings.Contains(l, "action=failover_recover"):
			refused = l
		case !strings.Contains(l, " admin_action "):
			t.Errorf("a record of another kind: %s", l)
		}
	}
	if code != 0 || !strings.Contains(trigger, "node-0#") || !strings.Contains(trigger, "admin_action region-0 -> region-0 action=failover_trigger actor=admin-token auth=token outcome=applied") ||
		!strings.Contains(trigger, "claimed_actor=operator:alice") || !strings.Contains(trigger, "reason=drill") ||
		!strings.Contains(refused, "outcome=refused") || !strings.Contains(refused, `region name \"Mars\"`) {
		t.Fatalf("audit query --kind admin_action: exit %d %v\n%s", code, err, out)
	}
	out, code, _ = run("audit", "query", "--dir", root, "--kind", "admin_action", "--json")
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(l, " records") {
			continue
		}
		var r audit.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("json line %s: %v", l, err)
		}
		if d, ok := r.Admin(); code != 0 || !ok || d.Actor == "" || d.Outcome == "" {
			t.Fatalf("json line %s: %+v", l, d)
		}
	}
	out, code, err = run(append([]string{"audit", "verify", "--dir", root}, admin...)...)
	if code != 0 || !strings.Contains(out, "controller node-0: 1 segments") || !strings.Contains(out, "0 problems") {
		t.Fatalf("audit verify: exit %d %v\n%s", code, err, out)
	}
	rep, err := audit.Verify(filepath.Join(root, "node-0"), nil)
	if err != nil || rep.Chains[0].Records != uint64(len(lines)) || !strings.Contains(out, fmt.Sprintf("anchored through seq %d", len(lines))) {
		t.Fatalf("records: %v %+v, query showed %d; verify:\n%s", err, rep, len(lines), out)
	}

	_, code, err = run(append(append([]string{"failover", "trigger"}, admin...), "--region", "region-0")...)
	if code != 1 || err == nil || !strings.Contains(err.Error(), "its audit record could not be written, so nothing was changed") ||
		!strings.Contains(err.Error(), "(audit_unavailable)") {
		t.Fatalf("trigger with the audit log closed: exit %d %v", code, err)
	}
}
