package regional

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// TestIngestPodLeases: a pod whose announcement carries a TTL and that is
// neither announced again nor heard from within it lapses (no candidate,
// slot and blocks kept), is restored by an announcement, and after a
// further TTL lapsed is removed from the registry and the index. A pod that
// stops announcing but answers scrapes stays; a static pod never expires.
func TestIngestPodLeases(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	now := time.Unix(1000, 0)
	g.now = func() time.Time { return now }
	const ttl = 30 * time.Second
	offset := int64(0)
	announce := func(e *testEngine) {
		up := e.podUp().(*kvevents.PodUp)
		up.TTL = ttl
		g.Apply(Message{Key: []byte(e.name), Headers: e.headers(), Value: e.batch(up), Offset: offset})
		offset++
	}
	quiet, talks := newTestEngine("pod-quiet", 1), newTestEngine("pod-talks", 1)
	announce(quiet)
	announce(talks)
	pq, _ := reg.Get("pod-quiet")
	pt, _ := reg.Get("pod-talks")
	lapsed := func() float64 { return testutil.ToFloat64(g.m.podExpiry.WithLabelValues("lapsed")) }

	now = now.Add(ttl - time.Second)
	g.ExpirePods()
	if pq.Lapsed() || pt.Lapsed() {
		t.Fatal("a pod lapsed within its TTL")
	}
	// From now on pod-talks answers every scrape.
	expire := func() { pt.Contact(now); g.ExpirePods() }
	now = now.Add(2 * time.Second)
	expire()
	if !pq.Lapsed() || pt.Lapsed() || lapsed() != 1 {
		t.Fatalf("after the TTL: quiet lapsed %v (want true), talks lapsed %v (want false), %v counted", pq.Lapsed(), pt.Lapsed(), lapsed())
	}
	if pq.Serving(now) || !idx.Alive(pq.ID) {
		t.Fatal("a lapsed pod must keep its slot but not serve")
	}

	announce(quiet) // it comes back: restored at once
	if pq.Lapsed() {
		t.Fatal("an announcement did not restore the lapsed pod")
	}
	now = now.Add(ttl + time.Second)
	expire()
	if !pq.Lapsed() {
		t.Fatal("the pod did not lapse again")
	}
	now = now.Add(ttl - time.Second)
	expire()
	if _, ok := reg.Get("pod-quiet"); !ok {
		t.Fatal("removed before a further TTL lapsed")
	}
	now = now.Add(2 * time.Second)
	expire()
	if _, ok := reg.Get("pod-quiet"); ok || idx.Alive(pq.ID) {
		t.Fatal("a pod lapsed for a further TTL was not removed from the registry and the index")
	}
	if got := testutil.ToFloat64(g.m.podExpiry.WithLabelValues("removed")); got != 1 {
		t.Fatalf("%v removals counted, want 1", got)
	}
	if _, ok := reg.Get("pod-talks"); !ok {
		t.Fatal("the pod that answers was removed")
	}
}
