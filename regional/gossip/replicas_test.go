package gossip

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is a ReplicaExchange that sends a fixed payload and records
// what it receives.
type recorder struct {
	name     string
	reliable bool
	payload  []byte
	mu       sync.Mutex
	got      map[string][]byte
	gone     []string
}

func (r *recorder) ReplicaState() ([]byte, bool) { return r.payload, r.reliable }

func (r *recorder) MergeReplicaState(from string, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[from] = append([]byte(nil), payload...)
}

func (r *recorder) ReplicaGone(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = append(r.gone, id)
}

func (r *recorder) from(id string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.got[id]
	return b, ok
}

// The controllers of one region exchange their replica state, small
// payloads over UDP and large or reliable ones over TCP; a controller of
// another region gets none of it; a replica that leaves is reported gone.
func TestReplicaExchangeStaysInTheRegion(t *testing.T) {
	key := newKey(t)
	big := bytes.Repeat([]byte("x"), 5000) // over one packet: TCP
	recs := map[string]*recorder{
		"a1": {name: "a1", payload: []byte("from a1"), got: map[string][]byte{}},
		"a2": {name: "a2", payload: big, got: map[string][]byte{}},
		"a3": {name: "a3", payload: []byte("pins from a3"), reliable: true, got: map[string][]byte{}},
		"b1": {name: "b1", payload: []byte("from b1"), got: map[string][]byte{}},
	}
	var nodes []*Node
	for _, name := range []string{"a1", "a2", "a3", "b1"} {
		region := "region-a"
		if name == "b1" {
			region = "region-b"
		}
		cfg := testConfig(t, name, region, key)
		cfg.Replicas, cfg.ReplicaInterval = recs[name], 20*time.Millisecond
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		nodes = append(nodes, open(t, cfg))
	}
	waitFor(t, 10*time.Second, "replica states exchanged", func() error {
		for _, to := range []string{"a1", "a2", "a3"} {
			for _, from := range []string{"a1", "a2", "a3"} {
				if from == to {
					continue
				}
				b, ok := recs[to].from(from)
				if !ok || !bytes.Equal(b, recs[from].payload) {
					return fmt.Errorf("%s has nothing (or not the payload) of %s", to, from)
				}
			}
		}
		return nil
	})
	for _, r := range []*recorder{recs["a1"], recs["b1"]} {
		if _, ok := r.from(map[string]string{"a1": "b1", "b1": "a1"}[r.name]); ok {
			t.Errorf("%s got a replica state from another region", r.name)
		}
	}
	if err := nodes[2].Close(); err != nil { // a3 leaves
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a3 reported gone", func() error {
		for _, to := range []string{"a1", "a2"} {
			recs[to].mu.Lock()
			gone := slices.Contains(recs[to].gone, "a3")
			recs[to].mu.Unlock()
			if !gone {
				return fmt.Errorf("%s does not know a3 left", to)
			}
		}
		return nil
	})
	recs["b1"].mu.Lock()
	defer recs["b1"].mu.Unlock()
	if len(recs["b1"].gone) > 0 {
		t.Errorf("b1 was told of another region's replicas: %v", recs["b1"].gone)
	}
}

// One controller of a region publishes its summary: the first by name of
// those publishing; the next takes over once the first stops. A
// controller's forward address reaches the other regions' views when it
// is set, and goes when it is withdrawn.
func TestOnePublisherPerRegion(t *testing.T) {
	key := newKey(t)
	var nodes []*Node
	for _, name := range []string{"a1", "a2", "b1"} {
		region := "region-a"
		if name == "b1" {
			region = "region-b"
		}
		cfg := testConfig(t, name, region, key)
		cfg.ForwardAddr = ""
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		nodes = append(nodes, open(t, cfg))
	}
	a1, a2, b1 := nodes[0], nodes[1], nodes[2]
	const within = 2 * time.Second
	if !a1.PublishesForRegion(within) || !a2.PublishesForRegion(within) {
		t.Fatal("before anyone publishes, each may")
	}
	if err := a1.Publish(buildSummary(t, "region-a", 1, 100)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a2 to see a1 publishing", func() error {
		if a2.PublishesForRegion(within) {
			return fmt.Errorf("a2 still publishes")
		}
		return nil
	})
	if !a1.PublishesForRegion(within) {
		t.Error("a1, first by name, does not publish")
	}

	if err := a2.SetForwardAddr("https://a2.example:8443"); err != nil {
		t.Fatal(err)
	}
	forward := func() string {
		rv, ok := b1.View().Region("region-a")
		if !ok {
			return ""
		}
		for _, c := range rv.Controllers {
			if c.Name == "a2" {
				return c.ForwardAddr
			}
		}
		return ""
	}
	waitFor(t, 10*time.Second, "a2's forward address at b1", func() error {
		if forward() != "https://a2.example:8443" {
			return fmt.Errorf("b1 sees %q", forward())
		}
		return nil
	})
	if err := a2.SetForwardAddr(""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a2's forward address withdrawn at b1", func() error {
		if forward() != "" {
			return fmt.Errorf("b1 sees %q", forward())
		}
		return nil
	})

	if err := a1.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a2 to take over", func() error {
		if !a2.PublishesForRegion(within) {
			return fmt.Errorf("a2 does not publish after a1 left")
		}
		return nil
	})
}
