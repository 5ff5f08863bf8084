package kvbridge

import "github.com/cespare/xxhash/v2"

// streamKey names one publisher's sequence: vLLM numbers the batches of each
// data-parallel rank from 0 per process start.
type streamKey struct {
	pod   string
	topic string
	rank  int64
}

// replayFunc asks the stream's engine for its buffered batches with seq >=
// from and returns those with seq < upto, in the order sent. ok is false
// when there is no replay socket or the exchange failed.
type replayFunc func(from, upto uint64) (res replayResult, ok bool)

// replayResult is an engine's answer to a replay request.
type replayResult struct {
	batches []replayed // seq in [from, upto), in the order received
	first   uint64     // seq of the first batch sent (even if >= upto)
	any     bool       // whether any batch was sent before the end marker
}

type replayed struct {
	seq     uint64
	payload []byte
}

type actionKind uint8

const (
	actForward actionKind = iota // produce the batch
	actMarker                    // produce an AllBlocksCleared for the stream's rank first
)

// action is what the state machine asks the producer to do, in order.
type action struct {
	kind     actionKind
	seq      uint64
	payload  []byte
	replayed bool   // came from the replay socket
	why      string // marker: "restart" or "join"
}

// tally counts what one or more calls to handle did.
type tally struct {
	Forwarded uint64 // batches forwarded (live and replayed)
	Replayed  uint64 // ... of which came from a replay
	Counts
}

func (t *tally) add(o tally) {
	t.Forwarded += o.Forwarded
	t.Replayed += o.Replayed
	t.Counts.add(o.Counts)
}

// stream is the gap, duplicate and restart logic of one stream: a state
// machine fed the live batches in the order one connection delivers them,
// with the connection's generation (a new one after every reconnect), and a
// replay function. It does no I/O of its own.
//
// The rules (see the package doc for why):
//   - first sight of a stream at seq s: if the engine's replay buffer still
//     holds seq 0, the whole history is forwarded after a marker (the
//     consumer may hold state from an earlier bridge or incarnation);
//     otherwise forwarding starts at s (a partial join);
//   - on one connection seqs only grow: s == last+1 is next; s > last+1 is
//     a gap, filled from the replay buffer with the batches [last+1, s) only,
//     so replayed and live batches never overlap (a batch a replay answer
//     repeats is dropped as a duplicate);
//   - a seq lower than the previous one on the same connection, or not above
//     the last forwarded on a new connection, is a restart of the engine;
//   - on a new connection with s > last, the replay buffer is asked from
//     `last`: the batch it holds at `last` must be byte-identical to the one
//     forwarded, or the engine restarted (its new incarnation has already
//     passed `last`); if the buffer no longer holds `last` the bridge cannot
//     tell and assumes the same incarnation;
//   - on a restart a marker is forwarded, then the new incarnation's history
//     from seq 0 as far as the buffer holds it;
//   - a batch the replay buffer no longer holds is counted lost.
type stream struct {
	seen   bool
	gen    uint64 // connection generation last seen
	live   uint64 // highest seq received live on gen
	last   uint64 // seq of the last batch forwarded
	digest uint64 // payload digest of the last batch forwarded
	total  tally
}

func digestOf(payload []byte) uint64 { return xxhash.Sum64(payload) }

// handle takes one live batch and appends what to produce to dst.
func (s *stream) handle(dst []action, t *tally, gen, seq uint64, payload []byte, replay replayFunc) []action {
	var cur tally
	defer func() {
		s.total.add(cur)
		t.add(cur)
	}()
	switch {
	case !s.seen:
		s.seen, s.gen, s.live = true, gen, seq
		return s.join(dst, &cur, seq, payload, replay)
	case gen != s.gen:
		s.gen, s.live = gen, seq
		if seq <= s.last {
			return s.restart(dst, &cur, seq, payload, replay)
		}
		return s.reconnected(dst, &cur, seq, payload, replay)
	case seq <= s.live:
		s.live = seq
		return s.restart(dst, &cur, seq, payload, replay)
	}
	// On one connection, last == live here: replays only ever fetch the
	// hole below the live batch in hand, so live and replayed batches never
	// overlap.
	s.live = seq
	if seq == s.last+1 {
		return s.forward(dst, &cur, seq, payload, false)
	}
	res, ok := s.ask(&cur, s.last+1, seq, replay)
	return s.repair(dst, &cur, s.last+1, seq, payload, res, ok)
}

// join handles the first batch of a stream.
func (s *stream) join(dst []action, t *tally, seq uint64, payload []byte, replay replayFunc) []action {
	if seq == 0 {
		t.JoinsFull++
		dst = append(dst, action{kind: actMarker, why: "join"})
		return s.forward(dst, t, seq, payload, false)
	}
	res, ok := s.ask(t, 0, seq, replay)
	if !ok || !res.any || res.first != 0 {
		// The history is incomplete: replaying part of it would make the
		// consumer see seqs go back (and clear the pod) for nothing better.
		t.JoinsPartial++
		return s.forward(dst, t, seq, payload, false)
	}
	t.JoinsFull++
	dst = append(dst, action{kind: actMarker, why: "join"})
	dst, lost := s.fill(dst, t, 0, seq, res)
	s.countGap(t, lost, false)
	return s.forward(dst, t, seq, payload, false)
}

// reconnected handles the first batch on a new connection when its seq is
// above the last forwarded.
func (s *stream) reconnected(dst []action, t *tally, seq uint64, payload []byte, replay replayFunc) []action {
	res, ok := s.ask(t, s.last, seq, replay)
	if ok && res.any && res.first == s.last && len(res.batches) > 0 && res.batches[0].seq == s.last &&
		digestOf(res.batches[0].payload) != s.digest {
		return s.restart(dst, t, seq, payload, replay)
	}
	return s.repair(dst, t, s.last+1, seq, payload, res, ok)
}

// repair forwards [from, seq) from res (a gap when non-empty), then the
// live batch.
func (s *stream) repair(dst []action, t *tally, from, seq uint64, payload []byte, res replayResult, ok bool) []action {
	if seq > from {
		var lost uint64
		if ok {
			dst, lost = s.fill(dst, t, from, seq, res)
		} else {
			lost = seq - from
		}
		s.countGap(t, lost, true)
	}
	return s.forward(dst, t, seq, payload, false)
}

// restart forwards a marker, the new incarnation's history before seq and
// the live batch.
func (s *stream) restart(dst []action, t *tally, seq uint64, payload []byte, replay replayFunc) []action {
	t.Restarts++
	s.last, s.digest = 0, 0
	dst = append(dst, action{kind: actMarker, why: "restart"})
	if seq == 0 {
		return s.forward(dst, t, seq, payload, false)
	}
	res, ok := s.ask(t, 0, seq, replay)
	return s.repair(dst, t, 0, seq, payload, res, ok)
}

func (s *stream) ask(t *tally, from, upto uint64, replay replayFunc) (replayResult, bool) {
	if replay == nil {
		t.NoReplay++
		return replayResult{}, false
	}
	t.ReplayRequests++
	res, ok := replay(from, upto)
	if !ok {
		t.ReplayFailures++
	}
	return res, ok
}

// fill forwards the replayed batches with seq in [from, upto), in order,
// and returns how many seqs of that range the engine did not provide.
func (s *stream) fill(dst []action, t *tally, from, upto uint64, res replayResult) ([]action, uint64) {
	next := from
	var lost uint64
	for _, r := range res.batches {
		if r.seq >= from && r.seq < next {
			t.Duplicates++ // sent twice in one answer
		}
		if r.seq < next || r.seq >= upto {
			continue
		}
		lost += r.seq - next
		dst = s.forward(dst, t, r.seq, r.payload, true)
		next = r.seq + 1
	}
	if next < upto {
		lost += upto - next
	}
	return dst, lost
}

// countGap records a run of seqs not received live, repaired but for lost.
func (s *stream) countGap(t *tally, lost uint64, always bool) {
	if !always && lost == 0 {
		return
	}
	t.GapsDetected++
	if lost == 0 {
		t.GapsRecovered++
		return
	}
	t.GapsLost++
	t.BatchesLost += lost
}

func (s *stream) forward(dst []action, t *tally, seq uint64, payload []byte, fromReplay bool) []action {
	s.last, s.digest = seq, digestOf(payload)
	t.Forwarded++
	if fromReplay {
		t.Replayed++
	}
	return append(dst, action{kind: actForward, seq: seq, payload: payload, replayed: fromReplay})
}
