package regional

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/gorgo"
)

// staticRemotes is a RemoteSource of fixed forward addresses and no
// candidates: enough for a server to count as connected to other regions.
type staticRemotes map[string][]string

func (s staticRemotes) Candidates(time.Time, string, []uint64, int, func(string) bool, *gorgo.Model, []gorgo.Candidate) []gorgo.Candidate {
	return nil
}
func (s staticRemotes) ForwardAddrs(region string) []string { return s[region] }
func (s staticRemotes) Serves(string) (bool, bool)          { return true, true }

// A replica that sees no pod while the region's other replicas see some is
// not ready (it would refuse with "no pod serves this region" what they
// serve), even though other regions could take its traffic; a region where
// no replica sees a pod stays ready when other regions can serve. The
// other replica's count travels in its real report.
func TestReadyNeedsThePodsTheOtherReplicasSee(t *testing.T) {
	f := newServerFixture(t, nil, nil)
	f.srv.SetTopology(Topology{Region: "r", Remotes: staticRemotes{"other": {"http://127.0.0.1:1"}}})
	clock := f.clock.Now
	here, err := newReplicaShare(f.reg, f.dec.Sessions(), func() int { n, _ := f.srv.servingPods(); return n }, clock,
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ready := func(step string, want int, note string) {
		t.Helper()
		resp, b := get(t, f.url+"/readyz")
		if resp.StatusCode != want || !strings.Contains(string(b), note) {
			t.Fatalf("%s: readyz %d %s, want %d with %q", step, resp.StatusCode, b, want, note)
		}
	}
	ready("no replica sees a pod, other regions can serve", http.StatusOK, `"pods":0`)

	peer := newReplica(t, clock, "p1", "p2", "p3")
	st, _ := peer.share.ReplicaState()
	here.MergeReplicaState("peer", st)
	ready("the other replica sees 3 pods", http.StatusServiceUnavailable, "the region's other replicas see 3 pods; this one sees none yet")

	f.clock.Add(peerReportFresh + time.Second)
	ready("the other replica's report is stale", http.StatusOK, `"ready":true`)

	gone := newReplica(t, func() time.Time { return f.clock.Now().Add(time.Second) }) // restarted, sees none
	st, _ = gone.share.ReplicaState()
	here.MergeReplicaState("peer", st)
	ready("no replica sees a pod again", http.StatusOK, `"ready":true`)
}

// A version 1 report (a replica not yet upgraded) is still read, and says
// nothing of the pods its sender sees.
func TestReplicaReportVersion1(t *testing.T) {
	clock := func() time.Time { return time.Unix(1000, 0) }
	a, b := newReplica(t, clock, "p1"), newReplica(t, clock, "p1")
	v1 := []byte{1, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0, 0} // epoch 7<<56, seq 1, no pods, no pins
	a.share.MergeReplicaState("old", v1)
	reps := a.reg.PeerReports()
	if len(reps) != 1 || reps[0].Serving != -1 {
		t.Fatalf("reports after a version 1 report: %+v", reps)
	}
	st, _ := b.share.ReplicaState()
	if rep, err := decodeReplicaReport(st); err != nil || rep.serving != 1 {
		t.Fatalf("a current report: serving %d, %v", rep.serving, err)
	}
}

// A replica just started that sees no pod waits for its live replicas'
// first reports before it calls itself ready: until one arrives it cannot
// tell a region without pods from pods it has not read yet. Once a replica
// said it sees none, or peerReportFresh after the start (a replica that
// never reports must not hold it for ever), it is ready.
func TestReadyWaitsForTheReplicasFirstReports(t *testing.T) {
	f := newServerFixture(t, nil, nil)
	f.srv.SetTopology(Topology{Region: "r", Remotes: staticRemotes{"other": {"http://127.0.0.1:1"}},
		Replicas: func() []string { return []string{"peer"} }})
	clock := f.clock.Now
	here, err := newReplicaShare(f.reg, f.dec.Sessions(), func() int { n, _ := f.srv.servingPods(); return n }, clock,
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ready := func(step string, want int, note string) {
		t.Helper()
		resp, b := get(t, f.url+"/readyz")
		if resp.StatusCode != want || !strings.Contains(string(b), note) {
			t.Fatalf("%s: readyz %d %s, want %d with %q", step, resp.StatusCode, b, want, note)
		}
	}
	ready("no report from the live replica yet", http.StatusServiceUnavailable, "has not heard yet which pods replica peer sees")
	if behind, _ := f.srv.behindPeers(); !behind {
		t.Fatal("forward address would be advertised before the replica's first report")
	}

	none := newReplica(t, clock) // the region has no pod
	st, _ := none.share.ReplicaState()
	here.MergeReplicaState("peer", st)
	ready("the replica sees no pod either", http.StatusOK, `"ready":true`)

	g := newServerFixture(t, nil, nil)
	g.srv.SetTopology(Topology{Region: "r", Remotes: staticRemotes{"other": {"http://127.0.0.1:1"}},
		Replicas: func() []string { return []string{"silent"} }})
	resp, b := get(t, g.url+"/readyz")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("silent replica, just started: readyz %d %s", resp.StatusCode, b)
	}
	g.clock.Add(peerReportFresh + time.Second)
	if resp, b := get(t, g.url+"/readyz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a replica silent since the start held this one past peerReportFresh: readyz %d %s", resp.StatusCode, b)
	}
}

// A replica just started knows its region's other controllers from the
// Raft members before gossip has told it which live peers are replicas of
// its region: with neither their reports nor their digests yet, it sees
// no pod and is not ready (found by a rolling restart under load: one
// replica, ready with an empty registry, refused a pinned request 503
// "no pod serves this region" while its replica served).
func TestAReplicaJustStartedCountsItsRegionsRaftMembers(t *testing.T) {
	members := []global.Member{
		{ID: "ctl-eu-1", Region: "eu"}, {ID: "ctl-eu-2", Region: "eu"}, {ID: "ctl-us-1", Region: "us"},
	}
	if got := regionReplicas(nil, members, "eu", "ctl-eu-1"); !slices.Equal(got, []string{"ctl-eu-2"}) {
		t.Fatalf("no gossip digests yet: replicas %v, want [ctl-eu-2]", got)
	}
	if got := regionReplicas([]string{"ctl-eu-3", "ctl-eu-2"}, members, "eu", "ctl-eu-1"); !slices.Equal(got, []string{"ctl-eu-2", "ctl-eu-3"}) {
		t.Fatalf("gossip and raft: replicas %v, want [ctl-eu-2 ctl-eu-3]", got)
	}
	if got := regionReplicas(nil, members[:1], "eu", "ctl-eu-1"); len(got) != 0 {
		t.Fatalf("alone in its region: replicas %v", got)
	}

	f := newServerFixture(t, nil, nil)
	f.srv.SetTopology(Topology{Region: "eu", Remotes: staticRemotes{"us": {"http://127.0.0.1:1"}},
		Replicas: func() []string { return regionReplicas(nil, members, "eu", "ctl-eu-1") }})
	resp, b := get(t, f.url+"/readyz")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "replica ctl-eu-2 sees") {
		t.Fatalf("just started, no pod, replica known only from raft: readyz %d %s", resp.StatusCode, b)
	}
}

// A request that reaches a replica which has not read its region's pods
// yet, while its replicas serve them (a load balancer that sends to every
// replica when it believes none ready), is refused 503 replica_not_ready
// with Retry-After, saying another replica can serve it: not 503
// residency_no_healthy_region, which says no region can.
func TestAReplicaNotReadyRefusesSayingSo(t *testing.T) {
	f := newServerFixture(t, nil, nil)
	f.srv.SetTopology(Topology{Region: "r", Remotes: staticRemotes{"other": {"http://127.0.0.1:1"}},
		Replicas: func() []string { return []string{"peer"} }})
	resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"code":"replica_not_ready"`) ||
		!strings.Contains(string(b), "has not heard yet which pods replica peer sees") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("replica without pods, its replica unheard: %d %s (Retry-After %q)", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}

	g := newServerFixture(t, nil, nil) // a replica alone in its region: no pod is no pod
	g.srv.SetTopology(Topology{Region: "r", Remotes: staticRemotes{"other": {"http://127.0.0.1:1"}}})
	resp, b = post(t, g.url+"/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(b), "replica_not_ready") {
		t.Fatalf("replica alone, no pod: %d %s", resp.StatusCode, b)
	}
	t.Logf("alone: %d %s", resp.StatusCode, b)
}
