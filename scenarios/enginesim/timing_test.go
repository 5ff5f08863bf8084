package enginesim

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// coreConfig is a small, exactly-timed engine for scheduler tests.
func coreConfig() Config {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	cfg.CacheBlocks = 1000
	cfg.HashSeed = "test"
	cfg.Timing = Timing{PrefillOverhead: 10 * time.Millisecond, PrefillPerToken: time.Millisecond, DecodeInterval: 5 * time.Millisecond, LoadFactor: 1, PrefillSlots: -1}
	cfg.MaxConcurrency = 8
	return cfg
}

// newCoreEngine builds an engine without network, with its event pipe
// running into pub; call it inside a synctest bubble. The pipe stops at the
// end of the test.
func newCoreEngine(t *testing.T, cfg Config, pub Publisher) *Engine {
	t.Helper()
	e, err := newEngine(cfg, "core")
	if err != nil {
		t.Fatal(err)
	}
	if pub == nil {
		pub = discardPublisher{}
	}
	e.startPipe(pub)
	t.Cleanup(func() {
		if err := e.pipe.close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return e
}

func seqTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// A miss pays prefill for every prompt token; the same prompt again hits all
// full blocks but the one holding the last token; decode adds one interval
// per output token after the first.
func TestTimingPrefillAndDecode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newCoreEngine(t, coreConfig(), nil)
		ctx := context.Background()
		prompt := seqTokens(40, 1)
		start := time.Now()
		res, err := e.generate(ctx, genRequest{tokens: prompt, maxTokens: 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.cachedTokens != 0 || res.ttft != 50*time.Millisecond || res.tokens != 3 {
			t.Fatalf("miss: %+v, want 0 cached, ttft 10ms+40x1ms", res)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Fatalf("miss took %v, want ttft + 2 decode intervals = 60ms", d)
		}
		res, err = e.generate(ctx, genRequest{tokens: prompt, maxTokens: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.cachedTokens != 36 || res.ttft != 14*time.Millisecond {
			t.Fatalf("hit: %+v, want 36 cached (9 of 10 blocks), ttft 10ms+4x1ms", res)
		}
	})
}

// With MaxConcurrency 1 requests run one after the other in arrival order;
// each waits for the previous one to finish.
func TestTimingQueueFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.MaxConcurrency = 1
		e := newCoreEngine(t, cfg, nil)
		var mu sync.Mutex
		ttft := map[int]time.Duration{}
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(10, uint32(100*i+1)), maxTokens: 2}, nil)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				ttft[i] = res.ttft
				mu.Unlock()
			})
			synctest.Wait() // request i is queued before i+1 arrives
		}
		wg.Wait()
		// each: prefill 10ms + 10 x 1ms = 20ms, decode 1 x 5ms; total 25ms.
		want := map[int]time.Duration{0: 20 * time.Millisecond, 1: 45 * time.Millisecond, 2: 70 * time.Millisecond}
		for i, w := range want {
			if ttft[i] != w {
				t.Errorf("request %d: ttft %v, want %v", i, ttft[i], w)
			}
		}
	})
}

// With one prefill slot (the default), concurrent prefills share the GPU:
// each waits for the prefill work admitted before it; the fixed overhead
// runs alongside.
func TestTimingPrefillSlotsSerialize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.Timing.PrefillSlots = 1
		e := newCoreEngine(t, cfg, nil)
		var wg sync.WaitGroup
		ttft := make([]time.Duration, 3)
		for i := range 3 {
			wg.Go(func() {
				res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(10*(i+1), uint32(100*i+1)), maxTokens: 1}, nil)
				if err != nil {
					t.Error(err)
				}
				ttft[i] = res.ttft
			})
			synctest.Wait()
		}
		wg.Wait()
		// Compute 10, 20 and 30 ms, back to back; overhead 10 ms each on top.
		for i, w := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 70 * time.Millisecond} {
			if ttft[i] != w {
				t.Errorf("request %d: ttft %v, want %v", i, ttft[i], w)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.Timing.PrefillSlots = 2
		e := newCoreEngine(t, cfg, nil)
		var wg sync.WaitGroup
		ttft := make([]time.Duration, 3)
		for i := range 3 {
			wg.Go(func() {
				res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(20, uint32(100*i+1)), maxTokens: 1}, nil)
				if err != nil {
					t.Error(err)
				}
				ttft[i] = res.ttft
			})
			synctest.Wait()
		}
		wg.Wait()
		// Two run at once (20 ms each); the third waits 20 ms for a slot.
		for i, w := range []time.Duration{30 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond} {
			if ttft[i] != w {
				t.Errorf("two slots, request %d: ttft %v, want %v", i, ttft[i], w)
			}
		}
	})
}

func TestTimingScaleAndLoadFactor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.TimeScale = 0.5
		e := newCoreEngine(t, cfg, nil)
		res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(40, 1), maxTokens: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.ttft != 25*time.Millisecond {
			t.Fatalf("ttft %v, want (10ms+40ms) x 0.5", res.ttft)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.MaxConcurrency = 3
		cfg.Timing.LoadFactor = 3 // x1 with one running, x2 with two, x3 with three
		e := newCoreEngine(t, cfg, nil)
		var wg sync.WaitGroup
		ttft := make([]time.Duration, 3)
		for i := range 3 {
			wg.Go(func() {
				res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(10, uint32(100*i+1)), maxTokens: 1}, nil)
				if err != nil {
					t.Error(err)
				}
				ttft[i] = res.ttft
			})
			synctest.Wait()
		}
		wg.Wait()
		for i, w := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 60 * time.Millisecond} {
			if ttft[i] != w {
				t.Errorf("request %d (admitted with %d running): ttft %v, want %v", i, i+1, ttft[i], w)
			}
		}
	})
}

// A request that does not fit in the cache next to a running one waits at
// the head of the queue even with a free slot, and runs once the first
// releases its blocks.
func TestTimingWaitsForCacheSpace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.CacheBlocks = 12 // one request needs ceil((40+4)/4) = 11 blocks
		e := newCoreEngine(t, cfg, nil)
		var wg sync.WaitGroup
		ttft := make([]time.Duration, 2)
		for i := range 2 {
			wg.Go(func() {
				res, err := e.generate(context.Background(), genRequest{tokens: seqTokens(40, uint32(1000*i+1)), maxTokens: 4}, nil)
				if err != nil {
					t.Error(err)
				}
				ttft[i] = res.ttft
			})
			synctest.Wait()
		}
		if st := e.Stats(); st.Running != 1 || st.Waiting != 1 {
			t.Fatalf("stats %+v, want one running and one waiting for cache space", st)
		}
		wg.Wait()
		// first: 50ms prefill + 3 x 5ms decode = 65ms; second starts then.
		if ttft[0] != 50*time.Millisecond || ttft[1] != 115*time.Millisecond {
			t.Fatalf("ttft %v, want [50ms 115ms]", ttft)
		}
	})
}

// Cancelling a request while it waits, while it prefills and while it
// decodes releases everything it held; a request cancelled before its
// prefill completes stores nothing.
func TestCancellationFreesRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.MaxConcurrency = 1
		pub := NewMemoryPublisher()
		e := newCoreEngine(t, cfg, pub)

		blocker, stopBlocker := context.WithCancel(context.Background())
		queued, stopQueued := context.WithCancel(context.Background())
		errs := make(chan error, 2)
		go func() {
			_, err := e.generate(blocker, genRequest{tokens: seqTokens(40, 1), maxTokens: 100}, nil)
			errs <- err
		}()
		synctest.Wait()
		go func() {
			_, err := e.generate(queued, genRequest{tokens: seqTokens(40, 500), maxTokens: 1}, nil)
			errs <- err
		}()
		synctest.Wait()
		if st := e.Stats(); st.Running != 1 || st.Waiting != 1 {
			t.Fatalf("stats %+v", st)
		}
		stopQueued() // cancelled while waiting
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("queued request: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // virtual time: the blocker is mid-prefill (50ms)
		stopBlocker()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("running request: %v", err)
		}
		if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 || st.CachedBlocks != 0 {
			t.Fatalf("after cancellations: %+v, want nothing held and nothing cached", st)
		}

		// Cancelled during decode: the prompt's blocks stay cached, unpinned.
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, err := e.generate(ctx, genRequest{tokens: seqTokens(40, 1), maxTokens: 100}, func(i int, _ genResult) error {
				if i == 3 {
					cancel()
				}
				return nil
			})
			errs <- err
		}()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("decoding request: %v", err)
		}
		st := e.Stats()
		if st.Running != 0 || st.CachedBlocks != 10 || st.UsedBlocks != 10 || st.KVUsage != 0 {
			t.Fatalf("after decode cancellation: %+v, want 10 cached unpinned blocks", st)
		}
	})
}

// Events are batched by count (EventBatchSize) or after EventFlushInterval,
// numbered from 0; PodUp-style events ride in the same batches.
func TestEventPipeBatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.EventBatchSize = 3
		cfg.EventFlushInterval = 100 * time.Millisecond
		pub := NewMemoryPublisher()
		e := newCoreEngine(t, cfg, pub)
		emit := func(n int) {
			e.mu.Lock()
			for range n {
				e.emitLocked(Event{Kind: AllBlocksCleared})
			}
			e.mu.Unlock()
		}
		start := time.Now()
		emit(3)
		synctest.Wait()
		if b := pub.Batches(); len(b) != 1 || len(b[0].Events) != 3 || b[0].Seq != 0 || !b[0].TS.Equal(start) {
			t.Fatalf("a full batch is published at once: %+v", b)
		}
		emit(1)
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if n := len(pub.Batches()); n != 1 {
			t.Fatalf("%d batches before the flush interval", n)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		b := pub.Batches()
		if len(b) != 2 || len(b[1].Events) != 1 || b[1].Seq != 1 || b[1].TS.Sub(start) != 100*time.Millisecond {
			t.Fatalf("after the interval: %+v", b)
		}
	})
}

// flakyPublisher fails its first n calls.
type flakyPublisher struct {
	mu    sync.Mutex
	fails int
	calls int
	inner *MemoryPublisher
}

func (f *flakyPublisher) Publish(ctx context.Context, b Batch) error {
	f.mu.Lock()
	f.calls++
	fail := f.calls <= f.fails
	f.mu.Unlock()
	if fail {
		return errors.New("broker unavailable")
	}
	return f.inner.Publish(ctx, b)
}

// A failing publisher is retried with backoff, keeping order and sequence
// numbers; past MaxPendingEvents events are dropped and the sequence skips
// one so the consumer sees the gap.
func TestEventPipeRetryAndDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := coreConfig()
		cfg.EventBatchSize = 1
		cfg.MaxPendingEvents = 4
		pub := &flakyPublisher{fails: 3, inner: NewMemoryPublisher()}
		e := newCoreEngine(t, cfg, pub)
		e.mu.Lock()
		e.emitLocked(Event{Kind: AllBlocksCleared})
		e.mu.Unlock()
		synctest.Wait() // first attempt failed; backoff 50ms, 100ms, 200ms
		e.mu.Lock()
		for range 5 { // the fifth overflows MaxPendingEvents: all five pending are dropped
			e.emitLocked(Event{Kind: BlockRemoved, BlockHashes: []uint64{7}})
		}
		e.emitLocked(Event{Kind: BlockRemoved, BlockHashes: []uint64{8}})
		e.mu.Unlock()
		time.Sleep(350 * time.Millisecond)
		synctest.Wait()
		b := pub.inner.Batches()
		if len(b) != 2 || b[0].Seq != 0 || b[0].Events[0].Kind != AllBlocksCleared || b[1].Seq != 2 || b[1].Events[0].BlockHashes[0] != 8 {
			t.Fatalf("batches %+v: want seq 0 (after 3 failures), then seq 2 after the dropped seq 1", b)
		}
		if got := metricValue(t, e, "meridian_enginesim_kv_events_dropped_total"); got != 5 {
			t.Fatalf("dropped %v events, want 5", got)
		}
	})
}
