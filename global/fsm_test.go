package global

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/global/audit"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// tf applies commands to an fsm at increasing indexes.
type tf struct {
	t     testing.TB
	f     *fsm
	index uint64
	seq   int
}

func newTF(t testing.TB) *tf { return &tf{t: t, f: newFSM(nil)} }

func (x *tf) cmd(c *command) *command {
	x.seq++
	if c.V == 0 {
		c.V = commandVersion
	}
	if c.RequestID == "" {
		c.RequestID = fmt.Sprintf("rid-%d", x.seq)
	}
	if c.At == 0 {
		c.At = t0.Add(time.Duration(x.seq) * time.Second).UnixNano()
	}
	return c
}

func (x *tf) apply(c *command) Result {
	x.t.Helper()
	b, err := encodeCommand(x.cmd(c))
	if err != nil {
		x.t.Fatal(err)
	}
	return x.applyRaw(b)
}

func (x *tf) applyRaw(b []byte) Result {
	x.index++
	r := x.f.Apply(&raft.Log{Index: x.index, Type: raft.LogCommand, Data: b})
	return *r.(*Result)
}

func (x *tf) state() *State { return x.f.state.Load() }

func policy(doc string) *command {
	return &command{Op: opPolicyApply, Policy: &policyCmd{Name: "p.yaml", Document: []byte(doc)}}
}

func region(r string, s RegionState) *command {
	return &command{Op: opRegionSet, Region: &regionCmd{Region: r, State: s}}
}

func member(id, r string) *command {
	return &command{Op: opMemberUpsert, Member: &Member{ID: id, Region: r, RaftAddr: "127.0.0.1:1", AdminAddr: "http://127.0.0.1:2"}}
}

func checkpoint(ctrl string, seq uint64, head string) *command {
	return &command{Op: opCheckpoint, Checkpoint: &Checkpoint{ControllerID: ctrl, Segment: "000001", Sequence: seq, HeadHash: head, Count: seq * 10, Time: t0}}
}

func stateBytes(t testing.TB, s *State) []byte {
	t.Helper()
	b, err := encodeSnapshot(s, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFSMPolicyVersions(t *testing.T) {
	x := newTF(t)
	if _, ok := x.state().Policy(); ok {
		t.Fatal("empty state has a policy")
	}
	for i := 1; i <= PolicyDocsKept+3; i++ {
		r := x.apply(policy(fmt.Sprintf("zones: v%d", i)))
		if r.Err != nil || !r.Changed || r.Policy.Version != uint64(i) || r.Policy.Index != x.index {
			t.Fatalf("apply %d: %+v", i, r)
		}
		if r.Policy.Document != nil {
			t.Fatal("result carries the document")
		}
	}
	p, _ := x.state().Policy()
	if p.Version != PolicyDocsKept+3 || string(p.Document) != fmt.Sprintf("zones: v%d", PolicyDocsKept+3) || p.Ref() != fmt.Sprintf("v%d@%d", p.Version, p.Index) {
		t.Fatalf("active %+v", p)
	}
	if len(p.SHA256) != 64 || p.Size != len(p.Document) || !p.AppliedAt.Equal(t0.Add(time.Duration(x.seq)*time.Second)) {
		t.Fatalf("metadata %+v", p)
	}
	h := x.state().PolicyHistory()
	if len(h) != PolicyDocsKept+3 {
		t.Fatalf("history has %d versions", len(h))
	}
	for _, v := range h {
		if v.Document != nil {
			t.Fatal("history carries documents")
		}
	}
	// The oldest versions keep metadata only; the latest PolicyDocsKept keep documents.
	if v, ok := x.state().PolicyVersion(1); !ok || v.Document != nil {
		t.Fatalf("version 1: %+v %v", v, ok)
	}
	if v, ok := x.state().PolicyVersion(4); !ok || string(v.Document) != "zones: v4" {
		t.Fatalf("version 4: %+v %v", v, ok)
	}
}

// TestFSMPolicyUnlessActive: a document identical to the active policy
// adds no version (the active version is the answer, Changed false), one
// that differs does, and an entry written without unless_active (before
// it existed) replays as it was applied: a version each time. Replicas
// reach the same state either way.
func TestFSMPolicyUnlessActive(t *testing.T) {
	x, y := newTF(t), newTF(t)
	idem := func(doc string) *command {
		c := policy(doc)
		c.Policy.UnlessActive = true
		return c
	}
	steps := []struct {
		cmd     *command
		version uint64
		changed bool
	}{
		{idem("zones: a"), 1, true},
		{idem("zones: a"), 1, false},
		{idem("zones: a"), 1, false},
		{idem("zones: b"), 2, true},
		{idem("zones: a"), 3, true}, // a again, but b is the active one
		{policy("zones: a"), 4, true},
		{idem("zones: a"), 4, false},
	}
	for i, st := range steps {
		r := x.apply(st.cmd)
		if r.Err != nil || r.Changed != st.changed || r.Policy == nil || r.Policy.Version != st.version || r.Policy.Document != nil {
			t.Fatalf("step %d: %+v, want version %d changed %v", i, r, st.version, st.changed)
		}
		y.apply(st.cmd)
	}
	if h := x.state().PolicyHistory(); len(h) != 4 {
		t.Fatalf("%d versions, want 4", len(h))
	}
	if !bytes.Equal(stateBytes(t, x.state()), stateBytes(t, y.state())) {
		t.Fatal("two replicas of the same log differ")
	}
}

func TestFSMPolicyHistoryBounded(t *testing.T) {
	x := newTF(t)
	for i := 1; i <= PolicyHistoryKept+5; i++ {
		x.apply(policy(fmt.Sprint(i)))
	}
	h := x.state().PolicyHistory()
	if len(h) != PolicyHistoryKept || h[0].Version != 6 || h[len(h)-1].Version != PolicyHistoryKept+5 {
		t.Fatalf("history: %d versions, first %d", len(h), h[0].Version)
	}
}

func TestFSMRegionStates(t *testing.T) {
	x := newTF(t)
	r := x.apply(region("eu-west-1", RegionFailed))
	if !errors.Is(r.Err, ErrUnknownRegion) || !strings.Contains(r.Err.Error(), "known: none") {
		t.Fatalf("unknown region: %+v", r.Err)
	}
	x.apply(member("a", "eu-west-1"))
	x.apply(member("b", "us-east-1"))
	st := x.state()
	if !st.Routable("eu-west-1") || st.RegionState("nowhere") != RegionActive {
		t.Fatal("regions without a state must be active")
	}
	c := region("eu-west-1", RegionFailed)
	c.Actor, c.Region.Reason = "operator:alice", "bad network"
	r = x.apply(c)
	if r.Err != nil || !r.Changed || r.Region.State != RegionFailed || r.Region.Actor != "operator:alice" || r.Region.Reason != "bad network" || r.Region.Index != x.index {
		t.Fatalf("fail: %+v", r)
	}
	if x.state().Routable("eu-west-1") || x.state().RegionState("eu-west-1") != RegionFailed {
		t.Fatal("failed region routable")
	}
	// Same state again: valid, unchanged, the first record stays.
	before := x.state()
	r = x.apply(region("eu-west-1", RegionFailed))
	if r.Err != nil || r.Changed || r.Region.Actor != "operator:alice" || x.state() != before {
		t.Fatalf("repeat: %+v", r)
	}
	// Compare-and-set.
	exp := RegionActive
	c = region("eu-west-1", RegionRecovering)
	c.Region.Expect = &exp
	if r = x.apply(c); !errors.Is(r.Err, ErrConflict) || x.state() != before {
		t.Fatalf("cas: %+v", r)
	}
	exp = RegionFailed
	c = region("eu-west-1", RegionRecovering)
	c.Region.Expect, c.Region.Automatic = &exp, true
	if r = x.apply(c); r.Err != nil || !r.Region.Automatic || x.state().Routable("eu-west-1") {
		t.Fatalf("cas ok: %+v", r)
	}
	// Force allows an unknown region.
	c = region("ap-south-1", RegionDraining)
	c.Region.Force = true
	if r = x.apply(c); r.Err != nil || x.state().RegionState("ap-south-1") != RegionDraining {
		t.Fatalf("force: %+v", r)
	}
	if got := strings.Join(x.state().KnownRegions(), ","); got != "ap-south-1,eu-west-1,us-east-1" {
		t.Fatalf("known regions %s", got)
	}
}

func TestFSMTargets(t *testing.T) {
	x := newTF(t)
	c := &command{Op: opTargetsSet, Targets: &targetsCmd{Region: "eu-west-1", Targets: []string{"eu-central-1", "eu-north-1"}}}
	if r := x.apply(c); r.Err != nil || !r.Changed {
		t.Fatalf("%+v", r)
	}
	if got := x.state().Targets("eu-west-1"); len(got) != 2 || got[0] != "eu-central-1" {
		t.Fatalf("targets %v", got)
	}
	// Targets make regions known.
	if r := x.apply(region("eu-north-1", RegionDraining)); r.Err != nil {
		t.Fatal(r.Err)
	}
	c = &command{Op: opTargetsSet, Targets: &targetsCmd{Region: "eu-west-1", Targets: []string{"eu-central-1", "eu-north-1"}}}
	if r := x.apply(c); r.Changed {
		t.Fatal("same targets changed the state")
	}
	c = &command{Op: opTargetsSet, Targets: &targetsCmd{Region: "eu-west-1"}}
	if r := x.apply(c); !r.Changed || x.state().Targets("eu-west-1") != nil {
		t.Fatal("clearing targets")
	}
}

func TestFSMCheckpoints(t *testing.T) {
	x := newTF(t)
	for i := uint64(1); i <= CheckpointsKept+2; i++ {
		if r := x.apply(checkpoint("ctrl-a", i, fmt.Sprintf("h%d", i))); r.Err != nil || r.Checkpoint.Index != x.index {
			t.Fatalf("checkpoint %d: %+v", i, r)
		}
	}
	cps := x.state().Checkpoints("ctrl-a")
	if len(cps) != CheckpointsKept || cps[0].Sequence != 3 || cps[len(cps)-1].Sequence != CheckpointsKept+2 {
		t.Fatalf("kept %d, first %d", len(cps), cps[0].Sequence)
	}
	before := x.state()
	if r := x.apply(checkpoint("ctrl-a", 5, "h5")); !errors.Is(r.Err, ErrConflict) || !strings.Contains(r.Err.Error(), "older") {
		t.Fatalf("regression: %+v", r.Err)
	}
	if r := x.apply(checkpoint("ctrl-a", CheckpointsKept+2, fmt.Sprintf("h%d", CheckpointsKept+2))); r.Err != nil || r.Changed {
		t.Fatalf("identical resend: %+v", r)
	}
	if r := x.apply(checkpoint("ctrl-a", CheckpointsKept+2, "forged")); !errors.Is(r.Err, ErrConflict) || !strings.Contains(r.Err.Error(), "differs") {
		t.Fatalf("different head for the same sequence: %+v", r.Err)
	}
	if x.state() != before {
		t.Fatal("rejected checkpoints changed the state")
	}
	x.apply(checkpoint("ctrl-b", 1, "x"))
	if got := x.state().CheckpointControllers(); len(got) != 2 || got[0] != "ctrl-a" {
		t.Fatalf("controllers %v", got)
	}
}

func TestFSMMembers(t *testing.T) {
	x := newTF(t)
	r := x.apply(member("a", "eu-west-1"))
	since := r.Member.Since
	if r.Err != nil || !r.Changed || since.IsZero() {
		t.Fatalf("%+v", r)
	}
	if r = x.apply(member("a", "eu-west-1")); r.Changed {
		t.Fatal("unchanged member changed the state")
	}
	c := member("a", "eu-west-1")
	c.Member.AdminAddr = "http://127.0.0.1:3"
	if r = x.apply(c); !r.Changed || !r.Member.Since.Equal(since) {
		t.Fatalf("update keeps since: %+v", r)
	}
	if r = x.apply(&command{Op: opMemberRemove, Member: &Member{ID: "a"}}); !r.Changed || len(x.state().Members()) != 0 {
		t.Fatalf("remove: %+v", r)
	}
	if r = x.apply(&command{Op: opMemberRemove, Member: &Member{ID: "a"}}); r.Changed || r.Err != nil {
		t.Fatalf("remove twice: %+v", r)
	}
}

func TestFSMIdempotent(t *testing.T) {
	x := newTF(t)
	x.apply(member("a", "eu-west-1"))
	c := x.cmd(policy("zones: {}"))
	b, _ := encodeCommand(c)
	first := x.applyRaw(b)
	before := x.state()
	again := x.applyRaw(b)
	if !again.Duplicate || again.Policy.Version != first.Policy.Version || again.Index != first.Index || x.state() != before {
		t.Fatalf("duplicate: %+v vs %+v", again, first)
	}
	// Same request id, different body: still the first result (the id names the write).
	c2 := *c
	c2.Policy = &policyCmd{Name: "other", Document: []byte("other")}
	b2, _ := encodeCommand(&c2)
	if r := x.applyRaw(b2); !r.Duplicate || r.Policy.Version != 1 || x.state() != before {
		t.Fatalf("same id other body: %+v", r)
	}
	// A rejection is remembered too.
	bad := x.cmd(region("nowhere", RegionFailed))
	bb, _ := encodeCommand(bad)
	r1 := x.applyRaw(bb)
	x.apply(member("b", "nowhere")) // the region becomes known
	r2 := x.applyRaw(bb)
	if r1.Err == nil || !r2.Duplicate || r2.Err == nil || r2.Err.Code != CodeUnknownRegion {
		t.Fatalf("rejection remembered: %+v %+v", r1, r2)
	}
}

func TestFSMDedupWindowEviction(t *testing.T) {
	x := newTF(t)
	x.f.dedup.init(4)
	c := x.cmd(policy("a"))
	b, _ := encodeCommand(c)
	x.applyRaw(b)
	for i := 0; i < 3; i++ {
		x.apply(policy("filler"))
	}
	if r := x.applyRaw(b); !r.Duplicate {
		t.Fatal("within the window: not a duplicate")
	}
	x.apply(policy("filler")) // evicts the first id
	if r := x.applyRaw(b); r.Duplicate || r.Policy.Version != 6 {
		t.Fatalf("after eviction: %+v", r)
	}
}

func TestFSMRejectsBadCommands(t *testing.T) {
	long := strings.Repeat("x", maxReasonLen+1)
	cases := []struct {
		name string
		raw  string
		cmd  func() *command
		want string
	}{
		{name: "not json", raw: "{not json", want: "decode command"},
		{name: "wrong type", raw: `{"v":"one"}`, want: "decode command"},
		{name: "future version", cmd: func() *command { c := policy("x"); c.V = 2; return c }, want: "version 2 is not supported"},
		{name: "unknown op", cmd: func() *command { c := policy("x"); c.Op = "policy.delete"; return c }, want: `unknown command "policy.delete"`},
		{name: "no request id", raw: `{"v":1,"op":"policy.apply","at":1,"policy":{"document":"eA=="}}`, want: "request id"},
		{name: "control char in id", cmd: func() *command { c := policy("x"); c.RequestID = "a\nb"; return c }, want: "request id"},
		{name: "no time", cmd: func() *command { c := policy("x"); c.At = -1; return c }, want: "time must be set"},
		{name: "two bodies", cmd: func() *command { c := policy("x"); c.Region = &regionCmd{Region: "a"}; return c }, want: "exactly one body, has 2"},
		{name: "no body", cmd: func() *command { return &command{Op: opRegionSet} }, want: "exactly one body, has 0"},
		{name: "body for another op", cmd: func() *command { c := policy("x"); c.Op = opRegionSet; return c }, want: "region.set without a region"},
		{name: "empty policy", cmd: func() *command { return policy("") }, want: "is empty"},
		{name: "huge policy", cmd: func() *command { return policy(strings.Repeat("a", MaxPolicySize+1)) }, want: "more than the limit"},
		{name: "long reason", cmd: func() *command { c := region("a", RegionFailed); c.Region.Reason = long; return c }, want: "reason is"},
		{name: "bad region name", cmd: func() *command { return region("EU_West", RegionFailed) }, want: `region name "EU_West"`},
		{name: "region dash", cmd: func() *command { return region("-eu", RegionFailed) }, want: `region name "-eu"`},
		{name: "bad state", raw: `{"v":1,"op":"region.set","rid":"x","at":1,"region":{"region":"eu","state":"exploded"}}`, want: `unknown region state "exploded"`},
		{name: "self target", cmd: func() *command {
			return &command{Op: opTargetsSet, Targets: &targetsCmd{Region: "eu", Targets: []string{"eu"}}}
		}, want: "its own failover target"},
		{name: "duplicate target", cmd: func() *command {
			return &command{Op: opTargetsSet, Targets: &targetsCmd{Region: "eu", Targets: []string{"us", "us"}}}
		}, want: "listed twice"},
		{name: "checkpoint without hash", cmd: func() *command { c := checkpoint("a", 1, ""); return c }, want: "head hash"},
		{name: "checkpoint with index", cmd: func() *command { c := checkpoint("a", 1, "h"); c.Checkpoint.Index = 7; return c }, want: "assigned by the cluster"},
		{name: "checkpoint bad controller", cmd: func() *command { return checkpoint("a b", 1, "h") }, want: "controller id"},
		{name: "member without address", cmd: func() *command { c := member("a", "eu"); c.Member.AdminAddr = ""; return c }, want: "admin address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newTF(t)
			before := x.state()
			var r Result
			if tc.raw != "" {
				r = x.applyRaw([]byte(tc.raw))
			} else {
				c := x.cmd(tc.cmd())
				b, err := encodeCommand(c)
				if err != nil {
					t.Fatal(err)
				}
				r = x.applyRaw(b)
			}
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", r.Err, tc.want)
			}
			if !errors.Is(r.Err, ErrInvalid) {
				t.Fatalf("%v is not ErrInvalid", r.Err)
			}
			if x.state() != before || r.Changed {
				t.Fatal("a rejected command changed the state")
			}
		})
	}
}

// memSink is an in-memory raft.SnapshotSink.
type memSink struct {
	bytes.Buffer
	cancelled, closed bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

// fataler is what testing.TB and *rapid.T share.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func snapshotRestore(t fataler, from *fsm, compile func([]byte) (any, error)) *fsm {
	t.Helper()
	snap, err := from.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v", err)
	}
	snap.Release()
	to := newFSM(compile)
	to.dedup.init(len(from.dedup.ring))
	if err := to.Restore(ioNopCloser{&sink.Buffer}); err != nil {
		t.Fatal(err)
	}
	return to
}

type ioNopCloser struct{ *bytes.Buffer }

func (ioNopCloser) Close() error { return nil }

func TestSnapshotRestore(t *testing.T) {
	x := newTF(t)
	x.apply(member("a", "eu-west-1"))
	x.apply(policy("zones: 1"))
	x.apply(region("eu-west-1", RegionDraining))
	x.apply(checkpoint("a", 1, "h1"))
	compiled := 0
	y := snapshotRestore(t, x.f, func(doc []byte) (any, error) { compiled++; return string(doc), nil })
	if !bytes.Equal(stateBytes(t, x.state()), stateBytes(t, y.state.Load())) {
		t.Fatal("restored state differs")
	}
	if v, err := y.state.Load().CompiledPolicy(); v != "zones: 1" || err != nil || compiled != 1 {
		t.Fatalf("compiled policy after restore: %v %v (%d compiles)", v, err, compiled)
	}
	// Restore discards previous state.
	z := newTF(t)
	z.apply(member("zz", "ap-south-1"))
	if err := z.f.Restore(ioNopCloser{bytes.NewBufferString(`{"v":1,"index":0}`)}); err != nil {
		t.Fatal(err)
	}
	if len(z.state().Members()) != 0 {
		t.Fatal("restore kept old members")
	}
}

// TestAppliedIndex: the machine's applied index moves after the state holds
// a command (changing it or not), wakes waiters, and survives a snapshot.
func TestAppliedIndex(t *testing.T) {
	x := newTF(t)
	never := make(chan struct{})
	if !x.f.waitApplied(never, 0) {
		t.Fatal("index 0 is applied from the start")
	}
	woke := make(chan bool)
	go func() { woke <- x.f.waitApplied(never, 2) }()
	x.apply(member("a", "eu-west-1"))
	select {
	case <-woke:
		t.Fatal("a waiter for index 2 returned at index 1")
	case <-time.After(20 * time.Millisecond):
	}
	if r := x.apply(member("a", "eu-west-1")); r.Changed { // changes nothing: still applied
		t.Fatal("an unchanged member changed the state")
	}
	if !<-woke || x.f.applied.Load() != 2 || x.state().Index() != 1 {
		t.Fatalf("applied %d, state index %d", x.f.applied.Load(), x.state().Index())
	}
	done := make(chan struct{})
	close(done)
	if x.f.waitApplied(done, 3) {
		t.Fatal("a waiter for an index not applied returned true")
	}
	y := snapshotRestore(t, x.f, nil)
	if y.applied.Load() != 2 {
		t.Fatalf("restored applied index %d, want 2", y.applied.Load())
	}
	// A snapshot of a controller that did not record the applied index reads
	// as the state index.
	z := newTF(t)
	if err := z.f.Restore(ioNopCloser{bytes.NewBufferString(`{"v":1,"index":7}`)}); err != nil {
		t.Fatal(err)
	}
	if z.f.applied.Load() != 7 {
		t.Fatalf("applied index %d after restoring a snapshot without one, want 7", z.f.applied.Load())
	}
}

func TestRestoreRejectsBadSnapshots(t *testing.T) {
	for name, snap := range map[string]string{
		"future version": `{"v":2}`,
		"not json":       `{"v":1,`,
		"wrong types":    `{"v":1,"regions":[{"region":"a","state":"exploded"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			x := newTF(t)
			x.apply(member("a", "eu"))
			before := x.state()
			if err := x.f.Restore(ioNopCloser{bytes.NewBufferString(snap)}); err == nil {
				t.Fatal("bad snapshot restored")
			}
			if x.state() != before {
				t.Fatal("a failed restore changed the state")
			}
		})
	}
}

// idPolicy is a compiled policy with an ID, like *residency.Policy.
type idPolicy string

func (p idPolicy) ID() string { return "id:" + string(p) }

func TestPolicyVersionString(t *testing.T) {
	compile := func(doc []byte) (any, error) {
		if string(doc) == "bad" {
			return nil, errors.New("boom")
		}
		return idPolicy(doc), nil
	}
	x := &tf{t: t, f: newFSM(compile)}
	if v := x.state().PolicyVersionString(); v != "" {
		t.Fatalf("no policy: %q", v)
	}
	x.apply(member("a", "eu-west-1"))
	x.apply(policy("zones: 1"))
	x.apply(region("eu-west-1", RegionDraining)) // carries the version string over
	if v := x.state().PolicyVersionString(); v != "v1@2/id:zones: 1" {
		t.Fatalf("version string %q", v)
	}
	if n := testing.AllocsPerRun(100, func() { _ = x.state().PolicyVersionString() }); n != 0 {
		t.Fatalf("reading the version string allocates %v times", n)
	}
	if v := snapshotRestore(t, x.f, compile).state.Load().PolicyVersionString(); v != "v1@2/id:zones: 1" {
		t.Fatalf("restored version string %q", v)
	}
	x.apply(policy("bad"))
	if v := x.state().PolicyVersionString(); v != "v2@4" {
		t.Fatalf("a policy that does not compile: %q", v)
	}
	y := newTF(t) // no compiler
	y.apply(policy("zones: 1"))
	if v := y.state().PolicyVersionString(); v != "v1@1" {
		t.Fatalf("without a compiler: %q", v)
	}
}

func TestCompileErrorKeepsCommitting(t *testing.T) {
	f := newFSM(func(doc []byte) (any, error) {
		if string(doc) == "bad" {
			return nil, errors.New("boom")
		}
		return string(doc), nil
	})
	x := &tf{t: t, f: f}
	x.apply(policy("good"))
	x.apply(policy("bad"))
	v, err := x.state().CompiledPolicy()
	if v != nil || err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("compile error: %v %v", v, err)
	}
	if p, _ := x.state().Policy(); p.Version != 2 {
		t.Fatal("the document is committed even when this node cannot compile it")
	}
}

// genCommand draws a command (valid or not) over a small alphabet so that
// conflicts, repeats and regressions happen often.
func genCommand(t *rapid.T, seq int) *command {
	regions := []string{"eu-west-1", "us-east-1", "ap-south-1", "bad_region"}
	rid := fmt.Sprintf("r%d", rapid.IntRange(0, seq+3).Draw(t, "rid"))
	at := t0.Add(time.Duration(rapid.IntRange(0, 1000).Draw(t, "at")) * time.Second).UnixNano()
	c := &command{V: commandVersion, RequestID: rid, At: at, Actor: rapid.SampledFrom([]string{"", "op:a", "auto:n1"}).Draw(t, "actor")}
	switch rapid.IntRange(0, 5).Draw(t, "op") {
	case 0:
		c.Op = opPolicyApply
		c.Policy = &policyCmd{Name: "p.yaml", Document: []byte(rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "doc"))}
	case 1:
		c.Op = opRegionSet
		rc := &regionCmd{Region: rapid.SampledFrom(regions).Draw(t, "region"), State: RegionState(rapid.IntRange(0, 3).Draw(t, "state")),
			Force: rapid.Bool().Draw(t, "force"), Automatic: rapid.Bool().Draw(t, "auto")}
		if rapid.Bool().Draw(t, "cas") {
			e := RegionState(rapid.IntRange(0, 3).Draw(t, "expect"))
			rc.Expect = &e
		}
		c.Region = rc
	case 2:
		c.Op = opTargetsSet
		c.Targets = &targetsCmd{Region: rapid.SampledFrom(regions).Draw(t, "region"),
			Targets: rapid.SliceOfNDistinct(rapid.SampledFrom(regions[:3]), 0, 2, rapid.ID[string]).Draw(t, "targets")}
	case 3:
		c.Op = opCheckpoint
		c.Checkpoint = &Checkpoint{ControllerID: rapid.SampledFrom([]string{"c1", "c2"}).Draw(t, "ctrl"), Segment: "s",
			Sequence: uint64(rapid.IntRange(0, 80).Draw(t, "seq")), HeadHash: rapid.SampledFrom([]string{"h1", "h2"}).Draw(t, "head"), Time: t0}
	case 4:
		c.Op = opMemberUpsert
		c.Member = &Member{ID: rapid.SampledFrom([]string{"n1", "n2", "n3"}).Draw(t, "id"), Region: rapid.SampledFrom(regions).Draw(t, "region"),
			RaftAddr: "127.0.0.1:1", AdminAddr: rapid.SampledFrom([]string{"http://a", "http://b"}).Draw(t, "admin")}
	case 5:
		c.Op = opMemberRemove
		c.Member = &Member{ID: rapid.SampledFrom([]string{"n1", "n2", "n3"}).Draw(t, "id")}
	}
	return c
}

// TestFSMProperties: for a random command log, (1) re-applying a command
// whose request id was applied is a no-op returning the first result, (2) a
// snapshot/restore at any point gives the same state, and the restored
// machine then evolves exactly like the original, (3) region states and the
// policy version agree with a naive model that replays the accepted commands.
func TestFSMProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		window := rapid.SampledFrom([]int{4, 16, DedupWindow}).Draw(rt, "window")
		a := newFSM(nil)
		a.dedup.init(window)
		var b *fsm
		n := rapid.IntRange(1, 120).Draw(rt, "n")
		cut := rapid.IntRange(0, n).Draw(rt, "cut")
		model := map[string]RegionState{}
		policies := uint64(0)
		seen := map[string]Result{}
		var index uint64
		for i := 0; i < n; i++ {
			if i == cut {
				b = snapshotRestore(rt, a, nil)
				if !bytes.Equal(snapBytes(rt, a), snapBytes(rt, b)) {
					rt.Fatal("snapshot/restore changed the state or the dedup window")
				}
			}
			c := genCommand(rt, i)
			data, err := encodeCommand(c)
			if err != nil {
				rt.Fatal(err)
			}
			index++
			before := a.state.Load()
			_, dupExpected := a.dedup.get(c.RequestID)
			res := *a.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(*Result)
			if b != nil {
				rb := *b.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(*Result)
				if !sameResult(rb, res) {
					rt.Fatalf("restored machine answered %+v, original %+v", rb, res)
				}
			}
			if dupExpected {
				if !res.Duplicate || a.state.Load() != before {
					rt.Fatalf("re-applying request id %s changed the state or was not a duplicate", c.RequestID)
				}
				first := seen[c.RequestID]
				res.Duplicate = false
				if !sameResult(res, first) {
					rt.Fatalf("duplicate answered %+v, first %+v", res, first)
				}
				continue
			}
			seen[c.RequestID] = res
			if res.Err != nil || !res.Changed {
				if a.state.Load() != before {
					rt.Fatal("a rejected or unchanged command changed the state")
				}
				continue
			}
			switch c.Op {
			case opRegionSet:
				model[c.Region.Region] = c.Region.State
			case opPolicyApply:
				policies++
			}
		}
		if b == nil {
			b = snapshotRestore(rt, a, nil)
		}
		if !bytes.Equal(snapBytes(rt, a), snapBytes(rt, b)) {
			rt.Fatal("original and restored machines diverged")
		}
		st := a.state.Load()
		for r, s := range model {
			if st.RegionState(r) != s {
				rt.Fatalf("region %s is %s, model says %s", r, st.RegionState(r), s)
			}
		}
		if p, ok := st.Policy(); policies > 0 && (!ok || p.Version != policies) || policies == 0 && ok {
			rt.Fatalf("policy version %d, model %d", p.Version, policies)
		}
	})
}

func snapBytes(t fataler, f *fsm) []byte {
	b, err := encodeSnapshot(f.state.Load(), f.applied.Load(), f.dedup.entries())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameResult(a, b Result) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func TestAuditCheckpointConversion(t *testing.T) {
	a := audit.Checkpoint{Controller: "ctl-a", Segment: "00000000000000000011.jsonl", LastSeq: 17,
		Head: strings.Repeat("ab", 32), Count: 7, Time: t0}
	g := CheckpointFromAudit(a)
	if g.ControllerID != a.Controller || g.Segment != a.Segment || g.Sequence != a.LastSeq || g.HeadHash != a.Head ||
		g.Count != a.Count || !g.Time.Equal(a.Time) || g.Index != 0 {
		t.Fatalf("from audit: %+v", g)
	}
	g.Index = 42 // Raft's, not the audit log's
	if back := g.AuditCheckpoint(); back != a {
		t.Fatalf("round trip: %+v, want %+v", back, a)
	}
}
