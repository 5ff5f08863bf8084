package route

import (
	"errors"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

func TestPlace(t *testing.T) {
	f := newFixture(t, 2, nil)
	c := chain(1, 1400) // ~90k tokens at 64 per block
	r := req(c)
	r.SessionID = "s"
	remote := func(cached int, rtt float64) gorgo.Candidate {
		return gorgo.Candidate{Region: "us-west-2", Remote: true, Profile: "h100", PromptTokens: r.PromptTokens,
			CachedTokens: cached, RTTMs: rtt, SummaryAge: time.Second}
	}
	shares := gorgo.NewShareTracker(time.Minute)

	// Cold at home, warm 65 ms away: the saved prefill beats the RTT.
	pl, err := f.dec.Place(r, "us-east-1", true, []gorgo.Candidate{remote(r.PromptTokens-100, 65)}, shares)
	if err != nil || !pl.Remote || pl.Region != "us-west-2" || pl.Reason != gorgo.ReasonRemoteSaves || pl.Local == nil {
		t.Fatalf("warm remote not chosen: %+v %v", pl, err)
	}
	if _, n, _ := f.dec.Sessions().Pinned("s", f.clock); n != 0 {
		t.Fatalf("session still counted in flight locally after forwarding: %d", n)
	}
	if got := shares.Share("us-west-2", f.clock); got != 0 {
		t.Fatalf("share %v after Place alone: a placement counts only once recorded", got)
	}
	pl.Record(shares, f.clock)
	if got := shares.Share("us-west-2", f.clock); got != 1 {
		t.Fatalf("share %v after Record", got)
	}
	// Warm at home too: stay.
	_ = f.idx.Register(f.pod(t, "pod-0").ID, index.TierGPU, c)
	pl, err = f.dec.Place(r, "us-east-1", true, []gorgo.Candidate{remote(r.PromptTokens-100, 65)}, nil)
	if err != nil || pl.Remote || pl.Region != "us-east-1" || pl.Local.PodName != "pod-0" {
		t.Fatalf("warm home not kept: %+v %v", pl, err)
	}
	// This region may not serve (residency or failover): the remote one, even if cold.
	pl, err = f.dec.Place(r, "us-east-1", false, []gorgo.Candidate{remote(0, 220)}, nil)
	if err != nil || !pl.Remote || pl.Local != nil || pl.Reason != gorgo.ReasonRemoteOnly {
		t.Fatalf("remote only: %+v %v", pl, err)
	}
	// Nowhere to go.
	if _, err := f.dec.Place(r, "us-east-1", false, nil, nil); !errors.Is(err, ErrNoRegion) {
		t.Fatalf("no region: %v", err)
	}
	f.reg.Remove("pod-0")
	f.reg.Remove("pod-1")
	if _, err := f.dec.Place(r, "us-east-1", true, nil, nil); !errors.Is(err, ErrNoRegion) {
		t.Fatalf("no pod, no remote: %v", err)
	}
}

// TestSessionAccountingFollowsTickets: deciding and placing change no
// session accounting, whatever they conclude; only an admitted request
// counts, until its ticket is done. (Decide used to begin the session and
// every caller had to end it; POST /v1/route ended a forwarded decision's
// session twice, taking an in-flight request off the count.)
func TestSessionAccountingFollowsTickets(t *testing.T) {
	f := newFixture(t, 2, nil)
	c := chain(3, 1400)
	r := req(c)
	r.SessionID = "s"
	inflight := func() int {
		_, n, _ := f.dec.Sessions().Pinned("s", f.clock)
		return n
	}
	d1, err := f.dec.Decide(r)
	if err != nil {
		t.Fatal(err)
	}
	if n := inflight(); n != 0 {
		t.Fatalf("after Decide: %d in flight, want 0", n)
	}
	t1 := f.dec.Admit(d1)
	d2, _ := f.dec.Decide(r)
	t2 := f.dec.Admit(d2)
	if pod, n, _ := f.dec.Sessions().Pinned("s", f.clock); n != 2 || pod != d1.PodName {
		t.Fatalf("two admitted: pinned %s with %d in flight, want %s with 2", pod, n, d1.PodName)
	}
	remote := gorgo.Candidate{Region: "us-west-2", Remote: true, Profile: "h100", PromptTokens: r.PromptTokens,
		CachedTokens: r.PromptTokens - 100, RTTMs: 65, SummaryAge: time.Second}
	for _, remotes := range [][]gorgo.Candidate{{remote}, nil} {
		pl, err := f.dec.Place(r, "us-east-1", true, remotes, nil)
		if err != nil || pl.Remote != (remotes != nil) {
			t.Fatalf("place: %+v %v", pl, err)
		}
		if n := inflight(); n != 2 {
			t.Fatalf("after a placement (remote %v): %d in flight, want 2", pl.Remote, n)
		}
	}
	t1.Done(f.clock)
	t1.Done(f.clock) // a second Done changes nothing
	if n := inflight(); n != 1 {
		t.Fatalf("after one done: %d in flight, want 1", n)
	}
	t2.Done(f.clock)
	if n := inflight(); n != 0 {
		t.Fatalf("after both done: %d in flight", n)
	}
}

// A remote candidate pays the running scorer's charge on its requests in
// flight, as a local pod does, in the placement's copy only; with the
// scorer off it pays nothing.
func TestPlaceChargesRemoteRunning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		weight float64
		want   float64
	}{{"on", 1, 2 * 40}, {"off", 0, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 1, func(c *Config) { c.Weights["running"] = tc.weight })
			r := req(chain(5, 10))
			remotes := []gorgo.Candidate{{Region: "us-west-2", Remote: true, Profile: "h100", PromptTokens: r.PromptTokens,
				Running: 40, RTTMs: 65, SummaryAge: time.Second, ExtraMs: 1}}
			pl, err := f.dec.Place(r, "us-east-1", true, remotes, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := pl.Candidates[1].ExtraMs; got != 1+tc.want {
				t.Fatalf("remote ExtraMs %v, want %v", got, 1+tc.want)
			}
			if remotes[0].ExtraMs != 1 {
				t.Fatalf("the caller's candidate changed: %+v", remotes[0])
			}
		})
	}
}
