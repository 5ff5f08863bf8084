package audit

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
)

func adminAction(action string) AdminAction {
	return AdminAction{Action: action, Actor: "spiffe://meridian/client/alice", Auth: AuthCertificate, RequestID: "rid-1",
		Region: "eu-west-1", PolicyVersion: "v3@17", Args: map[string]string{"state": "failed", "reason": "maintenance window"}}
}

func adminRecords(t *testing.T, l *Log) []Record {
	t.Helper()
	recs, err := Collect(must(l.Query(context.Background(), Query{Kinds: []Kind{KindAdminAction}})))
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestAdminRecords: an applied action is one record written before the
// action runs; a refused one is one refused record; one that fails after
// its record is followed by a failed record of the same decision id. The
// records chain with the routing decisions, a checkpoint anchors them,
// Verify passes, and an edit of the actor is detected.
func TestAdminRecords(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, testConfig(dir, "ctl-a"), Deps{})
	adm := Admin{Log: l, Origin: "us-east-1"}
	ctx := context.Background()
	mustAppend(t, l, testEntry(0)) // a routing decision first: one chain for both

	ran := false
	err := adm.Run(ctx, adminAction("failover_trigger"), func(context.Context) error {
		// The record is durable before the action takes effect.
		recs := adminRecords(t, l)
		if len(recs) != 1 || !strings.Contains(string(recs[0].Cost), `"outcome":"applied"`) {
			t.Errorf("records when the action runs: %+v", recs)
		}
		ran = true
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("run: %v (ran %v)", err, ran)
	}
	cause := errors.New("taking eu-west-1 out of service strands traffic")
	if err := adm.Refuse(ctx, adminAction("failover_trigger"), cause); err != cause {
		t.Fatalf("refuse returned %v", err)
	}
	failure := errors.New("no raft leader reachable")
	if err := adm.Run(ctx, adminAction("policy_apply"), func(context.Context) error { return failure }); err != failure {
		t.Fatalf("failed run returned %v", err)
	}

	recs := adminRecords(t, l)
	if len(recs) != 4 {
		t.Fatalf("%d admin records, want 4", len(recs))
	}
	want := []struct{ action, outcome, err string }{
		{"failover_trigger", OutcomeApplied, ""},
		{"failover_trigger", OutcomeRefused, cause.Error()},
		{"policy_apply", OutcomeApplied, ""},
		{"policy_apply", OutcomeFailed, failure.Error()},
	}
	for i, w := range want {
		r := recs[i]
		d, ok := r.Admin()
		if !ok || d.Action != w.action || d.Outcome != w.outcome || d.Error != w.err || d.Actor != "spiffe://meridian/client/alice" ||
			d.Auth != AuthCertificate || d.Args["state"] != "failed" || r.Origin != "us-east-1" || r.Region != "eu-west-1" ||
			r.PolicyVersion != "v3@17" || r.RequestID != "rid-1" || r.Controller != "ctl-a" || r.Seq != uint64(i+2) {
			t.Errorf("record %d: %+v detail %+v, want %+v", i, r, d, w)
		}
	}
	if recs[0].DecisionID == recs[1].DecisionID || recs[2].DecisionID != recs[3].DecisionID {
		t.Errorf("decision ids %s %s %s %s: one per action, shared by a failed record", recs[0].DecisionID, recs[1].DecisionID, recs[2].DecisionID, recs[3].DecisionID)
	}
	text := string(recs[3].AppendText(nil))
	for _, s := range []string{"admin_action us-east-1 -> eu-west-1", "action=policy_apply", "actor=spiffe://meridian/client/alice",
		"auth=certificate", "outcome=failed", `reason="maintenance window"`, `error="no raft leader reachable"`, "policy=v3@17"} {
		if !strings.Contains(text, s) {
			t.Errorf("text %q lacks %q", text, s)
		}
	}

	cp := l.Checkpoint()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if cp.LastSeq != 5 {
		t.Fatalf("checkpoint through seq %d, want 5", cp.LastSeq)
	}
	rep, err := Verify(dir, []Checkpoint{cp})
	if err != nil || !rep.OK() || rep.Chains[0].Anchored != 5 {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	segPath := controllerDir(dir, "ctl-a") + "/" + SegmentName(1)
	lines := readLines(t, segPath)
	lines[1] = strings.Replace(lines[1], "client/alice", "client/mallory", 1)
	writeLines(t, segPath, lines)
	rep, err = Verify(dir, []Checkpoint{cp})
	if err != nil || rep.OK() || rep.Problems[0].Kind != ProblemEdited || rep.Problems[0].Seq != 2 {
		t.Fatalf("verify after editing the actor: %v %+v", err, rep)
	}
}

// TestAdminFailsClosed: with the log's disk full, or the log closed, the
// action does not run and the error says it was not recorded; a refusal
// stays a refusal and says it was not recorded.
func TestAdminFailsClosed(t *testing.T) {
	ffs := &faultFS{}
	l := openTest(t, testConfig(t.TempDir(), "ctl-a"), Deps{FS: ffs})
	adm := Admin{Log: l, Origin: "us-east-1"}
	ctx := context.Background()
	run := func() (bool, error) {
		ran := false
		err := adm.Run(ctx, adminAction("policy_apply"), func(context.Context) error { ran = true; return nil })
		return ran, err
	}

	ffs.set(func(f *faultFS) { f.write = syscall.ENOSPC })
	ran, err := run()
	var nr *NotRecordedError
	if ran || !errors.As(err, &nr) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "policy_apply refused: its audit record could not be written") {
		t.Fatalf("disk full: ran %v, err %v", ran, err)
	}
	cause := errors.New("invalid policy")
	if err := adm.Refuse(ctx, adminAction("policy_apply"), cause); !errors.Is(err, cause) || !strings.Contains(err.Error(), "could not be recorded") {
		t.Fatalf("refusal on a full disk: %v", err)
	}
	ffs.set(func(f *faultFS) { f.write = nil })
	if ran, err := run(); !ran || err != nil {
		t.Fatalf("disk free again: ran %v, err %v", ran, err)
	}

	l.Close()
	ran, err = run()
	if ran || !errors.As(err, &nr) || !errors.Is(err, ErrClosed) {
		t.Fatalf("closed log: ran %v, err %v", ran, err)
	}
	// Only the one action carried out is on record.
	recs, err := NaiveQuery(controllerDir(l.cfg.Dir, "ctl-a"), Query{}, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("records: %v %+v", err, recs)
	}
}

// TestAdminEntryChecked: an admin record without an actor, with an unknown
// auth or outcome, or refused without a reason, is refused by Append.
func TestAdminEntryChecked(t *testing.T) {
	l := openTest(t, testConfig(t.TempDir(), "ctl-a"), Deps{})
	for name, cost := range map[string]string{
		"no actor":        `{"action":"policy_apply","auth":"token","outcome":"applied"}`,
		"unknown auth":    `{"action":"policy_apply","actor":"x","auth":"guess","outcome":"applied"}`,
		"unknown outcome": `{"action":"policy_apply","actor":"x","auth":"token","outcome":"maybe"}`,
		"refused, no why": `{"action":"policy_apply","actor":"x","auth":"token","outcome":"refused"}`,
		"no detail":       ``,
	} {
		err := l.Append(context.Background(), Entry{Kind: KindAdminAction, DecisionID: "d", Origin: "us-east-1", Cost: []byte(cost)})
		var ee *EntryError
		if !errors.As(err, &ee) || ee.Field != "cost" {
			t.Errorf("%s: %v", name, err)
		}
	}
	var zero Admin
	ran := false
	if err := zero.Run(context.Background(), AdminAction{}, func(context.Context) error { ran = true; return nil }); err != nil || !ran || zero.Enabled() {
		t.Fatalf("zero Admin: %v %v", err, ran)
	}
}
