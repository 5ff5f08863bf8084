package sim

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// codingSource is the coding-agent workload, closed loop: each of Sessions
// users runs agent sessions back to back. A session's prompt is a shared
// 12,000-token agent prompt (tools, instructions), 40,000 to 80,000 tokens
// of repository context, then its history; each turn appends a tool result
// or user message of 300 to 3,000 tokens and sends the whole history (so
// ~100k input tokens), answered in 300 to 700 tokens that join the history.
// The next turn follows the answer after a tool think time of 20 ms to 5 s
// (log-uniform). A quarter of the sessions are "thick": on 30% of their
// turns they fan out 2 to 4 concurrent sub-agent requests (the history plus
// a task of 200 to 1,000 tokens each) and continue when all have answered.
// A session ends after 8 to 30 turns or past 160,000 tokens; the user starts
// the next one 1 to 10 s later. No turn starts after Duration. The content
// of every session depends only on the seed and the user, never on timing.
type codingSource struct {
	cfg   *Config
	users int
	dur   time.Duration
	ids   int64
}

func newCodingSource(cfg *Config, f *fleetSpec) *codingSource {
	users := cfg.Workload.Sessions
	if users == 0 {
		users = codingSessionsFor(cfg.Workload.load(), f)
	}
	return &codingSource{cfg: cfg, users: users, dur: cfg.Workload.Duration}
}

func (s *codingSource) horizon() time.Duration { return s.dur }

type codingUser struct {
	src     *codingSource
	idx     int
	rng     *rand.Rand
	attrs   *attributes
	n       int // sessions started
	session string
	key     uint64
	hist    []segment
	turns   int
	thick   bool
	waiting int       // answers outstanding in this turn
	outs    []segment // answers of this turn, joined to the history when all are in
}

func (s *codingSource) start(w *world) {
	attrs := newAttributes(s.cfg)
	for i := range s.users {
		u := &codingUser{src: s, idx: i, rng: rand.New(rand.NewPCG(s.cfg.Seed, 0xc0de<<32|uint64(i))), attrs: attrs}
		at := time.Duration(u.rng.Int64N(int64(10 * time.Second)))
		w.at(at, func() { u.newSession(w) })
	}
}

func (u *codingUser) newSession(w *world) {
	if w.now >= u.src.dur {
		return
	}
	u.n++
	u.session = fmt.Sprintf("s%d.%d", u.idx, u.n)
	u.key = mix64(uint64(u.idx)<<32 | uint64(u.n))
	u.hist = append(u.hist[:0], segment{id: 5 << 40, n: 12000}, segment{id: 6<<40 | u.key&(1<<40-1), n: 40000 + u.rng.IntN(40001)})
	u.turns = 8 + u.rng.IntN(23)
	u.thick = u.rng.Float64() < 0.25
	u.turn(w)
}

func (u *codingUser) segID() uint64 { return 7<<40 ^ mix64(u.key^uint64(u.rng.Uint32())) }

func (u *codingUser) turn(w *world) {
	if w.now >= u.src.dur {
		return
	}
	u.hist = append(u.hist, segment{id: u.segID(), n: 300 + u.rng.IntN(2701)})
	k := 1
	if u.thick && u.rng.Float64() < 0.3 {
		k = 2 + u.rng.IntN(3)
	}
	u.waiting, u.outs = k, u.outs[:0]
	for range k {
		segs := u.hist
		if k > 1 {
			segs = append(segs[:len(segs):len(segs)], segment{id: u.segID(), n: 200 + u.rng.IntN(801)})
		}
		out := 300 + u.rng.IntN(401)
		u.outs = append(u.outs, segment{id: u.segID(), n: out})
		u.src.ids++
		r := &request{id: u.src.ids, at: w.now, session: u.session, input: total(segs), output: out,
			chain: chainOf(segs, u.src.cfg.Fleet.BlockSize, nil)}
		u.attrs.assign(r, u.key)
		u.attrs.roamed(r, uint64(r.id)<<1)
		r.next = func(w *world, at time.Duration) { u.answered(w, at) }
		w.arrive(r)
	}
}

func (u *codingUser) answered(w *world, at time.Duration) {
	u.waiting--
	if u.waiting > 0 {
		return
	}
	u.hist = append(u.hist, u.outs...)
	u.turns--
	think := logUniform(u.rng, 20*time.Millisecond, 5*time.Second)
	if u.turns <= 0 || total(u.hist) > 160000 {
		w.at(at+time.Second+time.Duration(u.rng.Int64N(int64(9*time.Second))), func() { u.newSession(w) })
		return
	}
	w.at(at+think, func() { u.turn(w) })
}
