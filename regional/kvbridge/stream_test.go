package kvbridge

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// simEngine is a naive engine for the state machine's tests: payloads name
// their incarnation and seq ("i<inc>s<seq>"); a ring of the last size
// batches (0: unbounded) answers replays as vLLM does.
type simEngine struct {
	inc  int
	seq  uint64
	size int
	ring []replayed
	down bool // replay socket unreachable
}

func (e *simEngine) publish() replayed {
	r := replayed{seq: e.seq, payload: fmt.Appendf(nil, "i%ds%d", e.inc, e.seq)}
	e.seq++
	e.ring = append(e.ring, r)
	if e.size > 0 && len(e.ring) > e.size {
		e.ring = e.ring[1:]
	}
	return r
}

func (e *simEngine) restart() {
	e.inc++
	e.seq = 0
	e.ring = nil
}

func (e *simEngine) holds(seq uint64) bool {
	return len(e.ring) > 0 && e.ring[0].seq <= seq && seq < e.seq
}

func (e *simEngine) replay(from, upto uint64) (replayResult, bool) {
	if e.down {
		return replayResult{}, false
	}
	var res replayResult
	for _, r := range e.ring {
		if r.seq < from {
			continue
		}
		if !res.any {
			res.any, res.first = true, r.seq
		}
		if r.seq < upto {
			res.batches = append(res.batches, r)
		}
	}
	return res, true
}

// render writes actions as "M(why)" and payloads, for compact assertions.
func render(acts []action) string {
	var parts []string
	for _, a := range acts {
		if a.kind == actMarker {
			parts = append(parts, "M("+a.why+")")
			continue
		}
		s := string(a.payload)
		if a.replayed {
			s += "r"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func TestStreamScenarios(t *testing.T) {
	type step struct {
		gen     uint64
		deliver bool // deliver the next published batch (else drop it)
		restart bool // engine restarts before publishing
		want    string
	}
	for _, c := range []struct {
		name   string
		size   int
		noRing bool
		pre    int // batches published before the bridge connects
		steps  []step
		check  func(t *testing.T, total tally)
	}{
		{name: "join at seq 0", steps: []step{{1, true, false, "M(join) i0s0"}, {1, true, false, "i0s1"}}},
		{name: "join with the whole history", pre: 3, steps: []step{{1, true, false, "M(join) i0s0r i0s1r i0s2r i0s3"}},
			check: func(t *testing.T, tl tally) {
				if tl.JoinsFull != 1 || tl.GapsDetected != 0 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "partial join forwards from the live batch", pre: 5, size: 2, steps: []step{{1, true, false, "i0s5"}, {1, true, false, "i0s6"}},
			check: func(t *testing.T, tl tally) {
				if tl.JoinsPartial != 1 || tl.BatchesLost != 0 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "gap repaired", steps: []step{{1, true, false, "M(join) i0s0"}, {1, false, false, ""}, {1, false, false, ""},
			{1, true, false, "i0s1r i0s2r i0s3"}},
			check: func(t *testing.T, tl tally) {
				if tl.GapsDetected != 1 || tl.GapsRecovered != 1 || tl.Replayed != 2 || tl.Forwarded != 4 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "gap beyond the buffer", size: 2, steps: []step{{1, true, false, "M(join) i0s0"}, {1, false, false, ""}, {1, false, false, ""},
			{1, false, false, ""}, {1, true, false, "i0s3r i0s4"}},
			check: func(t *testing.T, tl tally) {
				if tl.GapsLost != 1 || tl.BatchesLost != 2 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "gap without replay socket", noRing: true, steps: []step{{1, true, false, "M(join) i0s0"}, {1, false, false, ""},
			{1, true, false, "i0s2"}},
			check: func(t *testing.T, tl tally) {
				if tl.GapsLost != 1 || tl.BatchesLost != 1 || tl.NoReplay != 1 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "reconnect, same engine, gap repaired", steps: []step{{1, true, false, "M(join) i0s0"}, {1, false, false, ""},
			{2, true, false, "i0s1r i0s2"}, {2, true, false, "i0s3"}},
			check: func(t *testing.T, tl tally) {
				if tl.Restarts != 0 || tl.GapsRecovered != 1 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "restart seen as seq going back on a new connection", steps: []step{{1, true, false, "M(join) i0s0"},
			{1, true, false, "i0s1"}, {1, true, false, "i0s2"}, {2, false, true, ""}, {2, true, false, "M(restart) i1s0r i1s1"}},
			check: func(t *testing.T, tl tally) {
				if tl.Restarts != 1 {
					t.Errorf("tally %+v", tl)
				}
			}},
		{name: "restart seen by the batch at the last seq", steps: []step{{1, true, false, "M(join) i0s0"},
			{1, true, false, "i0s1"}, {2, false, true, ""}, {2, false, false, ""}, {2, false, false, ""},
			{2, true, false, "M(restart) i1s0r i1s1r i1s2r i1s3"}}},
		{name: "restart on the same connection", steps: []step{{1, true, false, "M(join) i0s0"}, {1, true, false, "i0s1"},
			{1, true, true, "M(restart) i1s0"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &simEngine{size: c.size}
			var st stream
			var total tally
			for range c.pre {
				e.publish()
			}
			replay := e.replay
			if c.noRing {
				replay = nil
			}
			for i, s := range c.steps {
				if s.restart {
					e.restart()
				}
				r := e.publish()
				if !s.deliver {
					continue
				}
				got := render(st.handle(nil, &total, s.gen, r.seq, r.payload, replay))
				if got != s.want {
					t.Fatalf("step %d: got %q, want %q", i, got, s.want)
				}
			}
			if c.check != nil {
				c.check(t, total)
			}
		})
	}
}

// The state machine against a naive engine over a lossy, reconnecting link:
// it never forwards a batch twice, never goes back in seq within an
// incarnation, never mixes incarnations without a marker unless the restart
// was undetectable, and counts exactly what it could not forward; with an
// unbounded buffer that always answers (and a restart it could see), the
// consumer ends with exactly the engine's history.
func TestStreamProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		unbounded := rapid.Bool().Draw(t, "unbounded")
		e := &simEngine{}
		if !unbounded {
			e.size = rapid.IntRange(1, 4).Draw(t, "ring")
		}
		pre := rapid.IntRange(0, 5).Draw(t, "pre")
		for range pre {
			e.publish()
		}
		var st stream
		var total tally
		gen := uint64(1)
		type fwd struct {
			inc int
			seq uint64
		}
		var consumer []fwd // since the last marker
		seen := map[fwd]bool{}
		published := uint64(pre) // of the current incarnation
		undetectable := false    // the current incarnation's restart could not be seen
		joined := false
		joinSeq := uint64(0)
		restarts := 0
		pendingRestart := false // the engine restarted since the stream's last batch
		deliver := func(r replayed) {
			if pendingRestart && st.seen {
				var seeable bool
				if gen != st.gen { // on a new connection: seq back, or the batch at `last` differs
					seeable = r.seq <= st.last || (!e.down && e.holds(st.last))
				} else { // on the same connection: seq back
					seeable = r.seq <= st.live
				}
				undetectable = undetectable || !seeable
			}
			pendingRestart = false
			acts := st.handle(nil, &total, gen, r.seq, r.payload, e.replay)
			if !joined {
				joined = true
				joinSeq = r.seq
			}
			for _, a := range acts {
				if a.kind == actMarker {
					consumer = consumer[:0]
					continue
				}
				var f fwd
				if _, err := fmt.Sscanf(string(a.payload), "i%ds%d", &f.inc, &f.seq); err != nil || f.seq != a.seq {
					t.Fatalf("payload %q at seq %d", a.payload, a.seq)
				}
				if seen[f] {
					t.Fatalf("forwarded %+v twice", f)
				}
				seen[f] = true
				if n := len(consumer); n > 0 {
					p := consumer[n-1]
					if p.inc == f.inc && p.seq >= f.seq {
						t.Fatalf("seq went back within incarnation %d: %d after %d", f.inc, f.seq, p.seq)
					}
					if p.inc != f.inc && !undetectable {
						t.Fatalf("incarnation %d followed %d without a marker", f.inc, p.inc)
					}
				}
				consumer = append(consumer, f)
			}
		}
		steps := rapid.IntRange(1, 80).Draw(t, "steps")
		for range steps {
			e.down = !unbounded && rapid.IntRange(0, 9).Draw(t, "replay_down") == 0
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 5:
				published++
				deliver(e.publish())
			case op < 8:
				published++
				e.publish() // dropped on the way
			case op < 9:
				gen++ // reconnect
			default:
				e.restart()
				restarts++
				if rapid.IntRange(0, 3).Draw(t, "same_connection") > 0 {
					gen++ // a restart breaks the connection, unless the publisher only restarted its count
				}
				published = 0
				undetectable = false
				pendingRestart = true
			}
		}
		// A last batch arrives, so every gap is noticed.
		e.down = false
		published++
		deliver(e.publish())

		if unbounded && !undetectable {
			var want []fwd
			for s := range e.seq {
				want = append(want, fwd{e.inc, s})
			}
			if !slices.Equal(consumer, want) {
				t.Fatalf("consumer holds %v, engine published %v", consumer, want)
			}
		}
		if restarts == 0 {
			if total.Restarts != 0 {
				t.Fatalf("%d restarts detected, none happened", total.Restarts)
			}
			// One incarnation: every batch since the join is forwarded or
			// counted lost, exactly once.
			start := uint64(0)
			if total.JoinsPartial > 0 {
				start = joinSeq
			}
			if got := total.Forwarded + total.BatchesLost; got != published-start {
				t.Fatalf("forwarded %d (of which replayed %d) + lost %d != %d published since seq %d",
					total.Forwarded, total.Replayed, total.BatchesLost, published-start, start)
			}
		}
	})
}
