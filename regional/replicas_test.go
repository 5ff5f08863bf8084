package regional

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
)

// replica is the route state of one controller of a region, with its side
// of the exchange.
type replica struct {
	reg   *route.Registry
	dec   *route.Decider
	share *replicaShare
}

func newReplica(t *testing.T, clock func() time.Time, pods ...string) replica {
	t.Helper()
	idx, err := index.New(index.Config{PodCapacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	for _, p := range pods {
		if _, _, err := reg.Upsert(route.PodInfo{Name: p, Endpoint: "http://" + p, Profile: "h100"}); err != nil {
			t.Fatal(err)
		}
	}
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	dec, err := route.NewDecider(route.DefaultConfig(), idx, reg, model, clock)
	if err != nil {
		t.Fatal(err)
	}
	share, err := newReplicaShare(reg, dec.Sessions(), func() int { return len(pods) }, clock, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return replica{reg: reg, dec: dec, share: share}
}

func inFlight(t *testing.T, r replica, pod string) int64 {
	t.Helper()
	p, ok := r.reg.Get(pod)
	if !ok {
		t.Fatalf("no pod %s", pod)
	}
	return p.InFlight()
}

// One replica's requests count on the other's pods after an exchange; a
// late report changes nothing; a restarted replica's first report
// replaces its last one; a replica that is gone counts no more; and the
// sessions one replica placed are pinned at the other.
func TestReplicaShareLoadsAndPins(t *testing.T) {
	clock := time.Unix(1000, 0)
	now := func() time.Time { return clock }
	a, b := newReplica(t, now, "p1", "p2"), newReplica(t, now, "p1", "p2")

	var tickets []*route.Ticket
	for i := range 3 {
		req := &route.Request{PromptTokens: 100, SessionID: fmt.Sprintf("s%d", i), RequestID: fmt.Sprint(i)}
		d, err := a.dec.Decide(req)
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, a.dec.Admit(d))
	}
	own := map[string]int64{}
	for _, p := range a.reg.Pods() {
		own[p.Name], _ = p.OwnLoad()
	}
	first, reliable := a.share.ReplicaState()
	if !reliable {
		t.Error("a report carrying pins is not sent reliably")
	}
	b.share.MergeReplicaState("a", first)
	for pod, n := range own {
		if got := inFlight(t, b, pod); got != n {
			t.Errorf("b sees %d in flight on %s, a has %d", got, pod, n)
		}
	}
	for i := range 3 {
		pa, _, _ := a.dec.Sessions().Pinned(fmt.Sprintf("s%d", i), clock)
		pb, _, ok := b.dec.Sessions().Pinned(fmt.Sprintf("s%d", i), clock)
		if !ok || pb != pa {
			t.Errorf("session s%d: pinned to %q at a, %q (%v) at b", i, pa, pb, ok)
		}
	}

	for _, tk := range tickets {
		tk.Done(clock)
	}
	second, reliable := a.share.ReplicaState()
	if reliable {
		t.Error("a report without pins is sent reliably")
	}
	b.share.MergeReplicaState("a", second)
	b.share.MergeReplicaState("a", first) // late: ignored
	for _, pod := range []string{"p1", "p2"} {
		if got := inFlight(t, b, pod); got != 0 {
			t.Errorf("after a's requests ended, b sees %d in flight on %s", got, pod)
		}
	}

	// a restarts (a new epoch, seq from 1): its first report counts.
	a2 := newReplica(t, func() time.Time { return clock.Add(time.Second) }, "p1", "p2")
	d, err := a2.dec.Decide(&route.Request{PromptTokens: 100, RequestID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	tk := a2.dec.Admit(d)
	defer tk.Done(clock)
	st, _ := a2.share.ReplicaState()
	b.share.MergeReplicaState("a", st)
	if got := inFlight(t, b, d.PodName); got != 1 {
		t.Errorf("the restarted replica's request: b sees %d on %s", got, d.PodName)
	}
	b.share.ReplicaGone("a")
	if got := inFlight(t, b, d.PodName); got != 0 {
		t.Errorf("after a is gone b sees %d on %s", got, d.PodName)
	}
}

// Every truncation and corruption of a report is refused, never applied
// in part, and never panics.
func TestReplicaReportMalformed(t *testing.T) {
	clock := time.Unix(1000, 0)
	now := func() time.Time { return clock }
	a := newReplica(t, now, "p1", "p2")
	d, err := a.dec.Decide(&route.Request{PromptTokens: 100, SessionID: "s", RequestID: "1"})
	if err != nil {
		t.Fatal(err)
	}
	tk := a.dec.Admit(d)
	defer tk.Done(clock)
	good, _ := a.share.ReplicaState()
	if _, err := decodeReplicaReport(good); err != nil {
		t.Fatalf("a good report: %v", err)
	}
	for n := range len(good) {
		if _, err := decodeReplicaReport(good[:n]); err == nil {
			t.Errorf("a report truncated to %d of %d bytes decoded", n, len(good))
		}
	}
	for i := range good {
		bad := append([]byte(nil), good...)
		bad[i] ^= 0xff
		_, _ = decodeReplicaReport(bad) // must not panic
	}
	if _, err := decodeReplicaReport(append(append([]byte(nil), good...), 0)); err == nil {
		t.Error("a report with a trailing byte decoded")
	}
}

// Two replicas that place a session at once on different pods (both asked
// by /v1/route, say) pin it to the same pod after one exchange of reports,
// the later placement's; before stamps each took the other's pod and they
// stayed crossed, each sending the session's next turn elsewhere.
func TestReplicaSharePinsConverge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := newReplica(t, func() time.Time { return t0 }, "p1", "p2")
	b := newReplica(t, func() time.Time { return t0 }, "p1", "p2")
	a.dec.Sessions().Note("s", "p1", t0)
	b.dec.Sessions().Note("s", "p2", t0.Add(time.Millisecond))
	sa, _ := a.share.ReplicaState()
	sb, _ := b.share.ReplicaState()
	a.share.MergeReplicaState("b", sb)
	b.share.MergeReplicaState("a", sa)
	pa, _, _ := a.dec.Sessions().Pinned("s", t0)
	pb, _, _ := b.dec.Sessions().Pinned("s", t0)
	if pa != "p2" || pb != "p2" {
		t.Errorf("after the exchange a pins s to %q, b to %q; want both p2", pa, pb)
	}
}

// A version 2 report's pins (no stamps) still apply.
func TestReplicaReportVersion2Pins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := newReplica(t, func() time.Time { return t0 }, "p1", "p2")
	a.dec.Sessions().Note("s", "p1", t0)
	v2 := []byte{2, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0, 1} // epoch, seq 1, no pods, one pin
	v2 = binary.LittleEndian.AppendUint64(v2, route.SessionKey("s"))
	v2 = append(v2, 2, 'p', '2', 2) // pod p2; 2 pods serving
	if rep, err := decodeReplicaReport(v2); err != nil || len(rep.pins) != 1 || rep.pins[0].Stamp != 0 {
		t.Fatalf("a version 2 report: %+v, %v", rep, err)
	}
	a.share.MergeReplicaState("old", v2)
	if p, _, _ := a.dec.Sessions().Pinned("s", t0); p != "p2" {
		t.Errorf("after a version 2 pin: %q, want p2", p)
	}
}
