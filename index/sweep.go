package index

import (
	"context"
	"math/bits"
	"time"
)

// sweepState is the progress of the current sweep pass, guarded by sweepMu.
// A pass clears the bits of a fixed set of dying slots (mask) from every
// shard in turn, walking each shard's slab in entry order; when it has been
// through all shards the slots become free. Slots removed during a pass wait
// for the next one.
type sweepState struct {
	active bool
	mask   []uint64
	slots  int    // slots in mask
	shard  int    // next shard to sweep
	cursor uint32 // next slab entry of that shard
	passes int    // completed passes
	freed  int    // slots freed by completed passes
}

// SweepProgress reports the background sweep.
type SweepProgress struct {
	Active       bool // a pass is in progress
	PassSlots    int  // slots being swept by the current pass
	ShardsDone   int  // shards the current pass has finished
	WaitingSlots int  // removed pods waiting for the next pass
	Passes       int  // passes completed since the index was built
	FreedSlots   int  // slots freed since the index was built
}

// SweepStep advances the sweep by at most budget slab entries (at least one
// shard boundary's worth of bookkeeping) and reports progress. It holds one
// shard's writer lock at a time, for at most budget entries, and each entry
// it changes is its own short seqlock window, so lookups never wait on it.
// It returns at once when no pod awaits sweeping.
func (x *Index) SweepStep(budget int) SweepProgress {
	if budget < 1 {
		budget = 1
	}
	x.sweepMu.Lock()
	defer x.sweepMu.Unlock()
	sw := &x.sweep
	if !sw.active {
		if n := x.pods.takeDying(sw.mask); n > 0 {
			sw.active, sw.slots, sw.shard, sw.cursor = true, n, 0, 0
		}
	}
	for sw.active && budget > 0 {
		s := &x.shards[sw.shard]
		s.mu.Lock()
		stop := sw.cursor + uint32(budget)
		if stop < sw.cursor { // overflow
			stop = ^uint32(0)
		}
		next := x.clearSlots(s, uint64(sw.shard), sw.mask, sw.cursor, stop)
		budget -= int(next-sw.cursor) + 1
		sw.cursor = next
		if next >= s.used {
			// Shard done: nothing of the mask can be left in it, since
			// dying pods cannot register.
			sw.shard++
			sw.cursor = 0
		}
		s.mu.Unlock()
		if sw.shard == numShards {
			x.pods.release(sw.mask)
			sw.passes++
			sw.freed += sw.slots
			sw.active, sw.slots, sw.shard = false, 0, 0
			clear(sw.mask)
		}
	}
	return x.sweepProgressLocked()
}

func (x *Index) sweepProgressLocked() SweepProgress {
	sw := &x.sweep
	x.pods.mu.Lock()
	waiting := x.pods.nDying
	x.pods.mu.Unlock()
	return SweepProgress{
		Active:       sw.active,
		PassSlots:    sw.slots,
		ShardsDone:   sw.shard,
		WaitingSlots: waiting,
		Passes:       sw.passes,
		FreedSlots:   sw.freed,
	}
}

// sweepPending counts slots in the current pass (for error messages).
func (x *Index) sweepPending() int {
	if !x.sweepMu.TryLock() {
		return 0
	}
	defer x.sweepMu.Unlock()
	n := 0
	for _, w := range x.sweep.mask {
		n += bits.OnesCount64(w)
	}
	return n
}

// RunSweeper calls SweepStep(budget) every interval until ctx is done, and
// immediately again while a pass is in progress and the previous step used
// its whole budget. It is the owner loop of the index's background work; the
// caller runs it in a goroutine. It returns ctx.Err().
func (x *Index) RunSweeper(ctx context.Context, interval time.Duration, budget int) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		for p := x.SweepStep(budget); p.Active; p = x.SweepStep(budget) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
}
