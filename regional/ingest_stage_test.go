package regional

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
)

// sameIndex fails t unless the two ingesters' indexes hold the same blocks
// for the engines' pods: as many per pod, and the engines' chains matched
// alike.
func sameIndex(t *testing.T, what string, want, got *index.Index, wantReg, gotReg *route.Registry, engines []*testEngine) {
	t.Helper()
	ws, gs := want.Stats(), got.Stats()
	if ws.Blocks != gs.Blocks {
		t.Fatalf("%s: index holds %d blocks, the serial reference %d", what, gs.Blocks, ws.Blocks)
	}
	for _, e := range engines {
		wp, wok := wantReg.Get(e.name)
		gp, gok := gotReg.Get(e.name)
		if wok != gok {
			t.Fatalf("%s: pod %s registered %v, in the serial reference %v", what, e.name, gok, wok)
		}
		if !wok {
			continue
		}
		if w, g := ws.PodBlocks[wp.ID.Slot()], gs.PodBlocks[gp.ID.Slot()]; w != g {
			t.Fatalf("%s: pod %s holds %d blocks, in the serial reference %d", what, e.name, g, w)
		}
		for _, c := range e.expected() {
			blocks := func(x *index.Index, id index.PodID) int {
				for _, m := range x.Lookup(c, nil) {
					if m.Pod == id {
						return m.Blocks
					}
				}
				return 0
			}
			if w, g := blocks(want, wp.ID), blocks(got, gp.ID); w != g {
				t.Fatalf("%s: pod %s matches %d blocks of a chain, the serial reference %d", what, e.name, g, w)
			}
		}
	}
}

// The consumer's index stage lags the re-keyer: a pod cleared meanwhile
// (an engine restart seen by the re-keyer, or a rewritten partition found
// by the probe's goroutine) must not get back, from the writes still
// queued, blocks its re-keyer forgot. For random lags and clears, the
// index ends up as the serial reference (Apply, the writes applied as each
// message is re-keyed) has it.
func TestIngestStageDropsWritesQueuedBeforeAClear(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		msgs, engines := workload(seed, 3)
		rng := rand.New(rand.NewPCG(seed, 7))
		ref, refIdx, refReg, _, _ := newTestIngester(t)
		g, idx, reg, _, _ := newTestIngester(t)
		var queue []*indexJob
		clears := 0
		for _, m := range msgs {
			ref.Apply(m)
			j := &indexJob{}
			g.apply(m, -1, nil, j)
			queue = append(queue, j)
			if rng.IntN(5) == 0 { // the probe finds a partition rewritten
				name := fmt.Sprintf("pod-%d", rng.IntN(3))
				for _, x := range []*Ingester{ref, g} {
					x.mu.Lock()
					if ps := x.pods[name]; ps != nil {
						x.clearPod(name, ps, "rewritten")
					}
					x.mu.Unlock()
				}
				clears++
			}
			for len(queue) > stageDepth || (len(queue) > 0 && rng.IntN(3) == 0) {
				g.runJob(queue[0])
				queue = queue[1:]
			}
		}
		for _, j := range queue {
			g.runJob(j)
		}
		if clears == 0 {
			t.Fatalf("seed %d: no clear", seed)
		}
		sameIndex(t, fmt.Sprintf("seed %d", seed), refIdx, idx, refReg, reg, engines)
	}
}

// Applied, WaitFor and CaughtUp say what is in the index: a message
// re-keyed but whose index writes wait in the stage is not applied yet.
// The replay check, though, goes by what was re-keyed: a redelivery of
// such a message is skipped, not re-keyed twice.
func TestIngestAppliedMeansInTheIndex(t *testing.T) {
	msgs, engines := workload(5, 2)
	g, idx, reg, _, _ := newTestIngester(t)
	ends := map[int]int64{}
	for _, m := range msgs {
		ends[m.Partition] = m.Offset + 1
	}
	g.SetStartOffsets(ends)
	jobs := make([]*indexJob, len(msgs))
	for i, m := range msgs {
		jobs[i] = &indexJob{}
		g.apply(m, -1, nil, jobs[i])
	}
	if a := g.Applied(); len(a) != 0 || g.CaughtUp() {
		t.Fatalf("nothing in the index yet, but applied %v, caught up %v", a, g.CaughtUp())
	}
	if st := idx.Stats(); st.Blocks != 0 {
		t.Fatalf("the re-keyer wrote %d blocks to the index itself", st.Blocks)
	}
	var replay indexJob
	g.apply(msgs[len(msgs)-1], -1, nil, &replay)
	if replay.record || len(replay.ops) != 0 {
		t.Fatalf("a redelivered message, re-keyed already, was re-keyed again: %+v", replay)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	woke := make(chan error, 1)
	go func() { woke <- g.WaitFor(ctx, g.CaughtUp) }()
	for i, j := range jobs {
		g.runJob(j)
		want := msgs[i].Offset
		if got, ok := g.Applied()[msgs[i].Partition]; !ok || got != want {
			t.Fatalf("after the index writes of offset %d of partition %d: applied %v", want, msgs[i].Partition, g.Applied())
		}
		if i < len(jobs)-1 && g.CaughtUp() {
			t.Fatalf("caught up with %d of %d messages in the index", i+1, len(msgs))
		}
	}
	if err := <-woke; err != nil {
		t.Fatalf("WaitFor(CaughtUp): %v", err)
	}
	checkIndex(t, idx, reg, engines)
}

// The index stage applies the messages in order and commits each only
// once its writes are in the index; stopping it applies every message
// handed over (the re-keyers are past them: redelivered, they would be
// skipped as replays). A commit error is reported once, and the messages
// after it are still applied.
func TestIngestStageCommitsAfterTheIndex(t *testing.T) {
	msgs, engines := workload(9, 3)
	g, idx, reg, _, _ := newTestIngester(t)
	var committed []int64
	var commitErrs []error
	staged, free, commitErr, stop := g.indexStage(func(m kafka.Message) error {
		got, ok := g.Applied()[m.Partition]
		if !ok || got < m.Offset {
			commitErrs = append(commitErrs, fmt.Errorf("offset %d of partition %d committed before it was applied (%v)", m.Offset, m.Partition, g.Applied()))
		}
		committed = append(committed, int64(m.Partition)<<32|m.Offset)
		if len(committed) == len(msgs)/2 {
			return errors.New("broker gone")
		}
		return nil
	})
	for _, m := range msgs {
		j := <-free
		g.apply(m, -1, nil, j)
		staged <- stagedMsg{job: j, msg: kafka.Message{Partition: m.Partition, Offset: m.Offset}}
	}
	stop()
	if err := errors.Join(commitErrs...); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-commitErr:
		if err == nil || err.Error() != "broker gone" {
			t.Fatalf("commit error %v", err)
		}
	default:
		t.Fatal("the commit error was not reported")
	}
	var want []int64
	for _, m := range msgs[:len(msgs)/2] {
		want = append(want, int64(m.Partition)<<32|m.Offset)
	}
	if !slices.Equal(committed, want) {
		t.Fatalf("committed %v, want the messages up to the failed commit, in order: %v", committed, want)
	}
	for _, m := range msgs {
		if got := g.Applied()[m.Partition]; got < m.Offset {
			t.Fatalf("offset %d of partition %d not applied after stop: %v", m.Offset, m.Partition, g.Applied())
		}
	}
	checkIndex(t, idx, reg, engines)
}
