package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/regional/summary"
)

func TestSightingsWire(t *testing.T) {
	m := sightingsMsg{From: "ctl-a", Region: "us-east-1", Seen: []Sighting{
		{Region: "eu-west-1", Generation: 7, Pods: 2, Age: 1500 * time.Millisecond, Live: true},
		{Region: "us-west-2", Pods: -1},
		{Region: strings.Repeat("r", summary.MaxRegionLen), Generation: 1, Pods: 0, Age: maxReportedAge},
	}}
	b := m.encode()
	got, err := decodeSightings(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.From != m.From || got.Region != m.Region || len(got.Seen) != len(m.Seen) {
		t.Fatalf("round trip: %+v", got)
	}
	for i := range m.Seen {
		if got.Seen[i] != m.Seen[i] {
			t.Errorf("sighting %d: %+v, want %+v", i, got.Seen[i], m.Seen[i])
		}
	}
	// Every truncation, and every corruption of the fields it checks, is
	// an error, never a panic or a sighting made up.
	for n := msgHeaderLen; n < len(b); n++ {
		if _, err := decodeSightings(b[:n]); !errors.Is(err, errWire) {
			t.Errorf("truncated to %d bytes: %v", n, err)
		}
	}
	bad := map[string][]byte{
		"trailing": append(bytes.Clone(b), 0),
		"count":    sightingsMsg{From: "a", Region: "r", Seen: make([]Sighting, maxSightings+1)}.encode(),
	}
	flags := bytes.Clone(b)
	flags[len(flags)-1] = 0x80
	bad["flags"] = flags
	age := sightingsMsg{From: "a", Region: "r", Seen: []Sighting{{Region: "x"}}}.encode()
	copy(age[len(age)-9:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	bad["age"] = age
	for name, b := range bad {
		if _, err := decodeSightings(b); !errors.Is(err, errWire) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestSightingsReachTheCutOff: a is cut off from c, b is not. a's own
// sighting of c goes stale, and a still learns from b's what c reports,
// however many summaries c publishes meanwhile; after the heal a sees c
// again itself.
func TestSightingsReachTheCutOff(t *testing.T) {
	key := newKey(t)
	part := gossiptest.NewPartition()
	cfg := func(name, region string) Config {
		c := testConfig(t, name, region, key)
		c.WrapTransport = part.Wrap(name)
		return c
	}
	a := open(t, cfg("a", "us-east-1"))
	cfgB := cfg("b", "us-west-2")
	cfgB.Join = []string{a.Addr()}
	b := open(t, cfgB)
	cfgC := cfg("c", "eu-west-1")
	cfgC.Join = []string{a.Addr()}
	c := open(t, cfgC)
	for i, n := range []*Node{a, b, c} {
		if err := n.Publish(buildSummary(t, n.cfg.Region, 1, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	// sighting returns what observer's sighting of region says, in a's view.
	sighting := func(observer, region string) (Sighting, bool) {
		for _, s := range a.View().Sightings {
			if s.Observer == observer && s.Region == region {
				return s, true
			}
		}
		return Sighting{}, false
	}
	sees := func(observer string, gen uint64) error {
		s, ok := sighting(observer, "eu-west-1")
		if !ok || s.Generation != gen || s.Pods != 2 {
			return fmt.Errorf("%s's sighting of eu-west-1 in a's view: %+v (found %v), want generation %d", observer, s, ok, gen)
		}
		return nil
	}
	waitFor(t, 15*time.Second, "a holds its own and b's sightings of c's first summary", func() error {
		return errors.Join(sees("a", 1), sees("b", 1))
	})
	if _, ok := sighting("c", "eu-west-1"); ok {
		t.Fatal("c reports on its own region")
	}
	if s, ok := sighting("b", "us-east-1"); !ok || s.ObserverRegion != "us-west-2" || !s.Live {
		t.Fatalf("b's sighting of us-east-1: %+v", s)
	}

	part.Cut([]string{"a"}, []string{"c"})
	for gen := uint64(2); gen <= 4; gen++ {
		if err := c.Publish(buildSummary(t, "eu-west-1", gen, 100)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "b's sighting of c's new summary reaches a", func() error { return sees("b", gen) })
	}
	if err := sees("a", 1); err != nil {
		t.Fatalf("a's own sighting of c moved on across the cut: %v", err)
	}
	own, _ := sighting("a", "eu-west-1")
	via, _ := sighting("b", "eu-west-1")
	now := time.Now()
	if own.SummaryAge(now) <= via.SummaryAge(now) {
		t.Fatalf("a's own copy of c's report (%v old) is no older than b's (%v)", own.SummaryAge(now), via.SummaryAge(now))
	}
	if got := counter(t, a.m.sightingMsgs.WithLabelValues("received")); got == 0 {
		t.Fatal("a counted no sightings received")
	}

	part.Heal()
	if err := c.Publish(buildSummary(t, "eu-west-1", 5, 100)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "a sees c itself again", func() error { return sees("a", 5) })
}
