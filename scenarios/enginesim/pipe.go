package enginesim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// eventPipe batches events and hands them to the Publisher from one
// goroutine, in order, with a sequence number per batch.
type eventPipe struct {
	pod        string
	engine     string
	epoch      uint64
	rank       int
	batchSize  int
	interval   time.Duration
	maxPending int
	pub        Publisher
	clock      Clock
	log        *slog.Logger
	m          *metrics

	mu      sync.Mutex
	pending []Event
	firstAt time.Time // when the oldest pending event arrived
	seq     uint64    // next batch's sequence number
	notify  chan struct{}
	stop    chan struct{}
	done    chan struct{}
	ctx     context.Context // cancelled when close gives up waiting for the flush
	cancel  context.CancelFunc
}

func newEventPipe(pod string, epoch uint64, cfg Config, pub Publisher, clock Clock, log *slog.Logger, m *metrics) *eventPipe {
	ctx, cancel := context.WithCancel(context.Background())
	return &eventPipe{
		ctx: ctx, cancel: cancel,
		pod: pod, engine: cfg.Engine, epoch: epoch, rank: cfg.DataParallelRank,
		batchSize: cfg.EventBatchSize, interval: cfg.EventFlushInterval, maxPending: cfg.MaxPendingEvents,
		pub: pub, clock: clock, log: log, m: m,
		notify: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// add queues an event. When too many are pending (the publisher keeps
// failing) they are dropped and the sequence skips a number, so consumers
// see a gap and resynchronise.
func (p *eventPipe) add(ev Event) {
	p.mu.Lock()
	if len(p.pending) == 0 {
		p.firstAt = p.clock.Now()
	}
	p.pending = append(p.pending, ev)
	if len(p.pending) > p.maxPending {
		p.m.dropped.Add(float64(len(p.pending)))
		p.log.Warn("kv events dropped: publisher is failing", "events", len(p.pending), "skipped_seq", p.seq)
		p.pending = nil
		p.seq++
	}
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// take removes the pending events as the next batch, if it is due (full, or
// the oldest event has waited an interval, or force).
func (p *eventPipe) take(force bool) (b Batch, ok bool, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return Batch{}, false, -1
	}
	now := p.clock.Now()
	if due := p.firstAt.Add(p.interval); !force && len(p.pending) < p.batchSize && now.Before(due) {
		return Batch{}, false, due.Sub(now)
	}
	b = Batch{Pod: p.pod, Engine: p.engine, Seq: p.seq, Epoch: p.epoch, TS: now, DPRank: p.rank, Events: p.pending}
	p.seq++
	p.pending = nil
	return b, true, 0
}

// run publishes batches until stop, then flushes what is left and closes
// done. It is the pipe's one goroutine.
func (p *eventPipe) run() {
	defer close(p.done)
	ctx := p.ctx
	stopping := false
	for {
		b, ok, wait := p.take(stopping)
		if ok {
			if !p.publish(ctx, b, stopping) {
				return
			}
			continue
		}
		if stopping {
			return
		}
		var timerC <-chan time.Time
		var t Timer
		if wait >= 0 {
			t = p.clock.NewTimer(wait)
			timerC = t.C()
		}
		select {
		case <-p.notify:
		case <-timerC:
		case <-p.stop:
			stopping = true
		}
		if t != nil {
			t.Stop()
		}
	}
}

// publish hands b to the publisher, retrying with backoff until it succeeds.
// While stopping, or when ctx ends, it gives up: it returns false when the
// pipe should end.
func (p *eventPipe) publish(ctx context.Context, b Batch, stopping bool) bool {
	backoff := 50 * time.Millisecond
	for {
		err := p.pub.Publish(ctx, b)
		if err == nil {
			p.m.batches.Inc()
			return true
		}
		p.m.publishErrors.Inc()
		p.log.Warn("publish kv event batch", "seq", b.Seq, "events", len(b.Events), "err", err)
		if stopping || ctx.Err() != nil {
			p.m.dropped.Add(float64(len(b.Events)))
			return ctx.Err() == nil
		}
		t := p.clock.NewTimer(backoff)
		select {
		case <-t.C():
		case <-p.stop:
			t.Stop()
			stopping = true // one last attempt
		case <-ctx.Done():
			t.Stop()
			return false
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// close stops the pipe after it has flushed the pending events; when ctx
// ends first, the flush is abandoned (the publisher's context is cancelled).
// Either way the goroutine has ended when close returns.
func (p *eventPipe) close(ctx context.Context) error {
	close(p.stop)
	defer p.cancel()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		p.cancel()
		<-p.done
		return fmt.Errorf("flush kv events: %w", ctx.Err())
	}
}

// discardPublisher drops batches (Config without Kafka or Publisher).
type discardPublisher struct{}

func (discardPublisher) Publish(context.Context, Batch) error { return nil }
