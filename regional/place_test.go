package regional

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
	if got := shares.Share("us-west-2", f.clock); got != 1 {
		t.Fatalf("share %v", got)
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
