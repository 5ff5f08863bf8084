package regional

import (
	"context"
	"sync"
)

// The consumer reads messages ahead of applying them, bounded in bytes.
//
// kafka-go's Reader reads a fetch response message by message into a
// queue of QueueCapacity messages (100); when the queue is full it stops
// reading the response, and it asks for the next fetch only when it has
// read the whole of the last one. At 2 MiB fetches of ~33 KB engine
// batches that queue holds about a fetch and a half, and the consumer's
// fetch goroutine took only fetchDepth (4) messages ahead, so the Reader
// and the broker waited on the re-keyer in lockstep. A deeper queue in
// messages would bound nothing in bytes (a message may be 1 MiB). So the
// fetch goroutine now takes and decodes messages as long as those not yet
// applied hold at most read_ahead_bytes of values (by default
// readAheadFetches fetches' worth, 16 x fetch_max_bytes: 32 MiB) and
// number at most readAheadMsgs,
// with a decoder each (spares are kept for reuse).
//
// The cost is memory while the consumer is behind (catching up from the
// topic): a decoded engine batch holds about 3.9 times its message's
// bytes (200 benchmark messages, 6.2 MB, held 24.1 MB live once
// decoded), so a full read-ahead is about 32 MiB of values and 125 MiB of
// decoded batches, about 160 MiB at the defaults (read_ahead_bytes sets
// it). A consumer that keeps up holds a few messages.
//
// BenchmarkIngestKafka, alternated rounds of test binaries against the
// old code, benchstat: events/s +18.9% (10 rounds, p=0.004), then +14%
// (12 rounds, p=0.052; steady +22.6%, p=0.024) and once no significant
// change (8 rounds, p=0.38): the machine's noise is about as large. A
// read-ahead of 4 fetches gave +4% (not significant), kafka-go's queue at
// 1,024 messages +9.6% (p=0.004; it bounds nothing in bytes), 256
// messages nothing significant, and a separate goroutine draining the
// Reader ahead of a 4-deep decoder +4.5% (p=0.105).
const (
	readAheadFetches = 16
	readAheadMsgs    = 4096
)

// readBudget bounds the bytes of the messages read and not yet applied.
// One goroutine acquires, any may release.
type readBudget struct {
	mu    sync.Mutex
	free  int64
	max   int64
	freed chan struct{} // a release since the acquirer last looked
}

func newReadBudget(max int64) *readBudget {
	return &readBudget{free: max, max: max, freed: make(chan struct{}, 1)}
}

// acquire takes n bytes (at most the whole budget, so that a message
// larger than it still passes, alone), waiting for releases while they
// are not free. It fails only when ctx is done.
func (b *readBudget) acquire(ctx context.Context, n int64) error {
	n = min(n, b.max)
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives back what acquire(n) took.
func (b *readBudget) release(n int64) {
	n = min(n, b.max)
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}
