package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Log is one controller's audit log. Append may be called from any number of
// goroutines; a single writer goroutine assigns seq numbers, chains, writes
// and fsyncs records in batches. Open starts it (and the checkpoint loop when
// a CheckpointSink is given); Close stops both and is safe to call twice.
type Log struct {
	cfg    Config
	dir    string // Dir/ControllerID
	hasher *Hasher
	clock  Clock
	fs     FS
	sink   CheckpointSink
	logger *slog.Logger
	m      *metrics

	mu     sync.RWMutex // guards closed; held for reading while sending on reqs
	closed bool
	reqs   chan *request

	// Owned by the writer goroutine.
	seg       *activeSegment
	head      chainHead
	mustCycle bool // the active segment is damaged: start a new one
	buf       []byte
	idxBuf    []byte

	state         atomic.Pointer[commitState]
	lastPublished atomic.Uint64 // seq of the last checkpoint the sink accepted

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

type request struct {
	body []byte
	done chan error
}

type chainHead struct {
	seq  uint64
	hash string
	ts   time.Time
}

type activeSegment struct {
	name      string
	first     uint64
	f         File
	idx       File // nil once writing the index failed
	size      int64
	count     uint64
	created   time.Time
	headSeg   string // segment holding the chain head (this one once count > 0)
	headCount uint64
}

// commitState is what readers and checkpoints see: only durable records.
type commitState struct {
	segment   string // active segment
	off       int64  // durable bytes of the active segment
	head      chainHead
	headSeg   string // segment holding head.seq
	headCount uint64 // records of headSeg up to head.seq
	notify    chan struct{}
}

// Open opens (or creates) the log of cfg.ControllerID under cfg.Dir, recovers
// the chain head from the last segment, starts a new segment and starts the
// writer goroutine.
func Open(cfg Config, deps Deps) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	h, err := NewHasher(cfg.HMACKey)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	l := &Log{
		cfg:    cfg,
		dir:    filepath.Join(cfg.Dir, cfg.ControllerID),
		hasher: h,
		clock:  deps.Clock,
		fs:     deps.FS,
		sink:   deps.Sink,
		logger: deps.Logger,
		reqs:   make(chan *request, cfg.QueueLen),
	}
	if l.clock == nil {
		l.clock = systemClock{}
	}
	if l.fs == nil {
		l.fs = OSFS{}
	}
	if l.logger == nil {
		l.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// The caller's logger names the controller (and region) where that
	// needs saying: a key given twice in one line loses one of them.
	l.logger = l.logger.With("component", "audit")
	if l.m, err = newMetrics(deps.Registerer, func() float64 { return float64(len(l.reqs)) }); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	if err := l.fs.MkdirAll(l.dir, 0o750); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	if err := l.recover(); err != nil {
		return nil, fmt.Errorf("open audit log %s: %w", l.dir, err)
	}
	l.publish()
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(1)
	go l.run()
	if l.sink != nil {
		l.wg.Add(1)
		go l.checkpointLoop(ctx)
	}
	return l, nil
}

// Dir is the directory holding this controller's segments.
func (l *Log) Dir() string { return l.dir }

// Hasher returns the HMAC hasher of the log's key.
func (l *Log) Hasher() *Hasher { return l.hasher }

// Append records e and returns nil only once it is durably written (its
// batch fsync'd). Any error means the record is not known to be durable and
// the caller must fail closed: it is an *EntryError for invalid input and an
// *AppendError otherwise (closed log, write, fsync or rotation failure,
// context done).
func (l *Log) Append(ctx context.Context, e Entry) error {
	if err := ctx.Err(); err != nil {
		// Done already: nothing is written (the selects below would pick
		// the send or the wait at random when both are ready).
		return &AppendError{Op: "append", Err: err}
	}
	body, err := prepare(&e, l.hasher, nil)
	if err != nil {
		return err
	}
	r := requestPool.Get().(*request)
	r.body = body
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return &AppendError{Op: "append", Err: ErrClosed}
	}
	select {
	case l.reqs <- r:
		l.mu.RUnlock()
	case <-ctx.Done():
		l.mu.RUnlock()
		requestPool.Put(r)
		return &AppendError{Op: "append", Err: ctx.Err()}
	}
	select {
	case err := <-r.done:
		r.body = nil
		requestPool.Put(r) // its done channel is empty again
		return err
	case <-ctx.Done():
		// The writer will still answer on r.done: r is not reused.
		return &AppendError{Op: "wait", Err: fmt.Errorf("fsync not confirmed: %w", ctx.Err())}
	}
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan error, 1)} }}

// Close stops accepting appends, writes what was already accepted, seals the
// active segment, hands a last checkpoint to the sink and returns. It is safe
// to call more than once; later calls return the first result.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.reqs)
		l.mu.Unlock()
		l.cancel()
		l.wg.Wait()
		var errs []error
		if l.seg != nil {
			errs = append(errs, l.closeSegment())
		}
		if l.sink != nil {
			cp := l.Checkpoint()
			if cp.LastSeq > 0 && cp.LastSeq != l.lastPublished.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), l.cfg.CheckpointTimeout)
				errs = append(errs, l.publishCheckpoint(ctx, cp))
				cancel()
			}
		}
		st := l.state.Load()
		close(st.notify) // wake tailers so they see the log is closed
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// Checkpoint returns a checkpoint of the current durable chain head
// (LastSeq 0 when the log is empty).
func (l *Log) Checkpoint() Checkpoint {
	st := l.state.Load()
	return Checkpoint{
		Controller: l.cfg.ControllerID,
		Segment:    st.headSeg,
		LastSeq:    st.head.seq,
		Head:       st.head.hash,
		Count:      st.headCount,
		Time:       l.clock.Now().UTC(),
	}
}

func (l *Log) publish() {
	st := &commitState{
		segment:   l.seg.name,
		off:       l.seg.size,
		head:      l.head,
		headSeg:   l.seg.headSeg,
		headCount: l.seg.headCount,
		notify:    make(chan struct{}),
	}
	if old := l.state.Swap(st); old != nil {
		close(old.notify)
	}
}

func (l *Log) closedNow() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.closed
}

// run is the writer goroutine: it takes what is queued (up to MaxBatch),
// writes it with one fsync and answers every request of the batch.
func (l *Log) run() {
	defer l.wg.Done()
	batch := make([]*request, 0, min(l.cfg.MaxBatch, 1024))
	for {
		r, ok := <-l.reqs
		if !ok {
			return
		}
		batch = append(batch[:0], r)
	fill:
		for len(batch) < l.cfg.MaxBatch {
			select {
			case r, ok := <-l.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		err := l.writeBatch(batch)
		for _, r := range batch {
			r.done <- err
		}
		clear(batch)
	}
}

func (l *Log) writeBatch(batch []*request) error {
	now := l.clock.Now()
	if err := l.maybeRotate(now); err != nil {
		l.m.writeErrors.WithLabelValues("rotate").Inc()
		l.logger.Error("audit segment rotation failed; records refused", "err", err)
		return err
	}
	seg := l.seg
	ts := now.UTC().Round(0)
	if ts.Before(l.head.ts) {
		// Times never go back within a chain, but a clock that steps back
		// is not hidden: counted, measured and logged.
		back := l.head.ts.Sub(ts)
		l.m.clockBack.Inc()
		l.m.clockBackBy.Set(back.Seconds())
		l.logger.Warn("audit: the wall clock is behind the last record's time; records keep that time",
			"behind", back, "last_record", l.head.ts, "clock", ts)
		ts = l.head.ts
	}
	buf := l.buf[:0]
	idx := l.idxBuf[:0]
	seq, prev, count := l.head.seq, l.head.hash, seg.count
	for _, r := range batch {
		seq++
		if count%uint64(l.cfg.IndexEvery) == 0 {
			idx = appendIndexEntry(idx, indexEntry{Seq: seq, TS: ts.UnixNano(), Off: seg.size + int64(len(buf))})
		}
		start := len(buf)
		buf = appendContent(buf, l.cfg.ControllerID, seq, ts, r.body, prev)
		buf, prev = sealLineAt(buf, start)
		count++
	}
	l.buf = buf
	l.idxBuf = idx
	path := filepath.Join(l.dir, seg.name)
	if _, err := seg.f.Write(buf); err != nil {
		l.rollback(seg, path)
		l.m.writeErrors.WithLabelValues("write").Inc()
		return &AppendError{Op: "write", Path: path, Err: err}
	}
	t0 := time.Now()
	if err := seg.f.Sync(); err != nil {
		l.rollback(seg, path)
		l.m.writeErrors.WithLabelValues("sync").Inc()
		return &AppendError{Op: "sync", Path: path, Err: err}
	}
	l.m.fsync.Observe(time.Since(t0).Seconds())
	seg.size += int64(len(buf))
	seg.count = count
	seg.headSeg, seg.headCount = seg.name, count
	l.head = chainHead{seq: seq, hash: prev, ts: ts}
	if seg.idx != nil && len(idx) > 0 {
		if _, err := seg.idx.Write(idx); err != nil {
			l.logger.Warn("audit index write failed; readers of this segment will scan", "segment", seg.name, "err", err)
			l.m.writeErrors.WithLabelValues("index").Inc()
			seg.idx.Close()
			seg.idx = nil
		}
	}
	l.m.records.Add(float64(len(batch)))
	l.m.bytes.Add(float64(len(buf)))
	l.m.batch.Observe(float64(len(batch)))
	l.publish()
	return nil
}

// sealLineAt turns the content at b[start:] into a stored line (see
// sealLine) in place and returns b and the record's hash.
func sealLineAt(b []byte, start int) ([]byte, string) {
	line, h := sealLine(b[start:])
	if len(line) > 0 && &line[0] == &b[start] {
		return b[:start+len(line)], h
	}
	// sealLine grew a new array: copy the line back after b[:start].
	return append(b[:start], line...), h
}

// rollback cuts the bytes of a failed batch from the segment so that they do
// not linger as unacknowledged records; if that fails too, the segment is
// abandoned and the next batch starts a new one.
func (l *Log) rollback(seg *activeSegment, path string) {
	err := seg.f.Truncate(seg.size)
	if err == nil {
		err = seg.f.Sync()
	}
	if err != nil {
		l.logger.Error("audit rollback of a failed batch failed; starting a new segment", "segment", path, "err", err)
		l.mustCycle = true
	}
}

func (l *Log) maybeRotate(now time.Time) error {
	seg := l.seg
	full := seg.size >= l.cfg.MaxSegmentBytes
	old := now.Sub(seg.created) >= l.cfg.MaxSegmentAge
	if !l.mustCycle && (seg.count == 0 || (!full && !old)) {
		return nil
	}
	if seg.count == 0 {
		// A damaged empty segment: remove it and create it again.
		path := filepath.Join(l.dir, seg.name)
		_ = seg.f.Close()
		if seg.idx != nil {
			_ = seg.idx.Close()
		}
		if err := l.fs.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return &AppendError{Op: "rotate", Path: path, Err: err}
		}
		headSeg, headCount := seg.headSeg, seg.headCount
		l.seg = nil
		ns, err := l.createSegment(now)
		if err != nil {
			// Keep a closed placeholder so the next batch retries.
			l.seg = &activeSegment{name: seg.name, first: seg.first, f: closedFile{}, created: seg.created, headSeg: headSeg, headCount: headCount}
			return &AppendError{Op: "rotate", Path: path, Err: err}
		}
		ns.headSeg, ns.headCount = headSeg, headCount
		l.seg = ns
		l.mustCycle = false
		return nil
	}
	ns, err := l.createSegment(now)
	if err != nil {
		return &AppendError{Op: "rotate", Path: filepath.Join(l.dir, SegmentName(l.head.seq+1)), Err: err}
	}
	ns.headSeg, ns.headCount = seg.headSeg, seg.headCount
	if err := l.closeSegment(); err != nil {
		l.logger.Warn("audit sealing of the previous segment failed", "segment", seg.name, "err", err)
	}
	l.seg = ns
	l.mustCycle = false
	l.m.rotations.Inc()
	l.publish()
	return nil
}

// createSegment creates the segment that starts at head.seq+1, with its index.
func (l *Log) createSegment(now time.Time) (*activeSegment, error) {
	name := SegmentName(l.head.seq + 1)
	path := filepath.Join(l.dir, name)
	f, err := l.fs.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	idx, err := l.fs.OpenFile(filepath.Join(l.dir, indexName(name)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		l.logger.Warn("audit index create failed; readers of this segment will scan", "segment", name, "err", err)
		idx = nil
	}
	if err := l.syncDir(); err != nil {
		f.Close()
		if idx != nil {
			idx.Close()
		}
		_ = l.fs.Remove(path)
		return nil, err
	}
	return &activeSegment{name: name, first: l.head.seq + 1, f: f, idx: idx, created: now}, nil
}

// closeSegment seals the active segment: a seal line in its index (with the
// last seq, hash, count and size), then closes both files.
func (l *Log) closeSegment() error {
	seg := l.seg
	var errs []error
	if seg.idx != nil {
		if seg.count > 0 && !l.mustCycle {
			b := appendIndexEntry(nil, indexEntry{Seq: l.head.seq, TS: l.head.ts.UnixNano(), Off: seg.size, Seal: true, Count: seg.count, Hash: l.head.hash})
			if _, err := seg.idx.Write(b); err != nil {
				errs = append(errs, fmt.Errorf("seal index of %s: %w", seg.name, err))
			} else if err := seg.idx.Sync(); err != nil {
				errs = append(errs, fmt.Errorf("seal index of %s: %w", seg.name, err))
			}
		}
		errs = append(errs, seg.idx.Close())
		seg.idx = nil
	}
	errs = append(errs, seg.f.Close())
	return errors.Join(errs...)
}

func (l *Log) syncDir() error {
	d, err := l.fs.OpenFile(l.dir, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// checkpointLoop hands the chain head to the sink every CheckpointInterval
// when it has moved. A failing sink is logged and retried at the next tick.
func (l *Log) checkpointLoop(ctx context.Context) {
	defer l.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.clock.After(l.cfg.CheckpointInterval):
		}
		cp := l.Checkpoint()
		if cp.LastSeq == 0 || cp.LastSeq == l.lastPublished.Load() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, l.cfg.CheckpointTimeout)
		if err := l.publishCheckpoint(cctx, cp); err != nil {
			l.logger.Warn("audit checkpoint not published; will retry", "seq", cp.LastSeq, "err", err)
		}
		cancel()
	}
}

func (l *Log) publishCheckpoint(ctx context.Context, cp Checkpoint) error {
	if err := l.sink.PublishCheckpoint(ctx, cp); err != nil {
		l.m.checkpoints.WithLabelValues("error").Inc()
		return fmt.Errorf("publish audit checkpoint seq %d: %w", cp.LastSeq, err)
	}
	l.m.checkpoints.WithLabelValues("ok").Inc()
	l.lastPublished.Store(cp.LastSeq)
	return nil
}

// closedFile stands in for a segment whose re-creation failed.
type closedFile struct{}

func (closedFile) Write([]byte) (int, error) { return 0, os.ErrClosed }
func (closedFile) Sync() error               { return os.ErrClosed }
func (closedFile) Truncate(int64) error      { return os.ErrClosed }
func (closedFile) Close() error              { return nil }
