package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrRunning is returned by a second Run of a source while one runs.
var ErrRunning = errors.New("discovery: source is already running")

// Source yields the current set of pods. DNS and File are its two
// implementations; New builds the one a Config chooses.
type Source interface {
	// Run looks the pods up until ctx ends, then returns ctx.Err(). It calls
	// update from its own goroutine, never concurrently: first with the
	// answer of the first lookup that succeeds (possibly no pod), then each
	// time the set changes. Each call gets a new slice, sorted by name with
	// unique names, that the callee may keep; Diff gives what changed. A
	// failed lookup calls nothing: the last set stands. update should
	// return promptly, since lookups wait for it, and must not call
	// Refresh. One Run at a time.
	Run(ctx context.Context, update func(pods []Pod)) error
	// Refresh makes the running Run look up now, and returns once the
	// answer has been applied (update called, if the set changed): nil, or
	// the lookup's error. It waits for Run to start, or ctx to end.
	Refresh(ctx context.Context) error
}

// Deps are what a source is given rather than configured with.
type Deps struct {
	// Logger; nil = discard.
	Logger *slog.Logger
	// Registerer receives the metrics; nil = a private registry (never the
	// global one). A process with several sources gives each its own, or
	// wraps one with prometheus.WrapRegistererWith(Labels{"source": ...}).
	Registerer prometheus.Registerer
	// Now is the clock of the DNS source's grace period; nil = time.Now.
	Now func() time.Time
}

// New builds the source that cfg chooses, after validating it.
func New(cfg Config, deps Deps) (Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DNS.Name != "" {
		return NewDNS(cfg.DNS, deps)
	}
	return NewFile(cfg.File, deps)
}

// answer is the outcome of one lookup.
type answer struct {
	pods     []Pod         // unique names
	ttl      time.Duration // shortest TTL seen, when ttlSeen
	ttlSeen  bool          // false: no answer record was read (no TTL)
	notFound bool          // an answer of no pods (result not_found)
	skipped  bool          // nothing looked up (the file did not change)
}

// runner is the loop both sources share: lookups on a timer and on
// request, the tracker, the metrics and the logs. Its fields after refresh
// belong to the goroutine in run.
type runner struct {
	kind    string // "dns" or "file": the logs' source
	what    string // the name or path
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	refresh chan chan error
	running atomic.Bool

	lookup func(ctx context.Context, force bool) (answer, error)
	delay  func(a answer, err error, fails int) time.Duration

	track     *tracker
	published []Pod
	first     bool // nothing published yet
	fails     int  // consecutive failed lookups
	lastErr   string
}

func newRunner(kind, what string, deps Deps, track *tracker) (*runner, error) {
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	return &runner{kind: kind, what: what, log: log.With("source", kind, kind, what), now: now, m: m,
		refresh: make(chan chan error), track: track, first: true}, nil
}

func (r *runner) run(ctx context.Context, update func([]Pod)) error {
	if update == nil {
		return errors.New("discovery: Run needs an update function")
	}
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		var reply chan error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case reply = <-r.refresh:
			t.Stop()
		}
		a, err := r.round(ctx, reply != nil, update)
		if reply != nil {
			reply <- err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t.Reset(r.delay(a, err, r.fails))
	}
}

func (r *runner) requestRefresh(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case r.refresh <- reply:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// round does one lookup and applies its answer.
func (r *runner) round(ctx context.Context, force bool, update func([]Pod)) (answer, error) {
	a, err := r.lookup(ctx, force)
	if ctx.Err() != nil {
		return a, ctx.Err()
	}
	if err != nil {
		r.fails++
		r.m.lookups.WithLabelValues(resultError).Inc()
		if msg := err.Error(); msg != r.lastErr {
			// Once per distinct error, not once per interval.
			r.log.Warn("discovery lookup failed; keeping the last pods", "err", err, "pods", len(r.published))
			r.lastErr = msg
		}
		return a, err
	}
	if a.skipped {
		return a, nil
	}
	if r.fails > 0 {
		r.log.Info("discovery lookups succeed again", "failed", r.fails)
	}
	r.fails, r.lastErr = 0, ""
	if a.notFound {
		r.m.lookups.WithLabelValues(resultNotFound).Inc()
	} else {
		r.m.lookups.WithLabelValues(resultOK).Inc()
	}
	changed := r.track.observe(r.now(), a.pods)
	r.m.missing.Set(float64(r.track.missing()))
	if !changed && !r.first {
		return a, nil
	}
	next := r.track.snapshot()
	if d := Diff(r.published, next); !d.Empty() {
		r.m.changes.Inc()
		r.log.Info("discovered pods changed", "pods", len(next), "joined", names(d.Joined), "changed", names(d.Changed),
			"left", names(d.Left))
	}
	r.first = false
	r.published = next
	r.m.pods.Set(float64(len(next)))
	update(append([]Pod(nil), next...))
	return a, nil
}

// names lists pods' names for a log line, at most 20 of them.
func names(pods []Pod) []string {
	const most = 20
	out := make([]string, 0, min(len(pods), most+1))
	for i, p := range pods {
		if i == most {
			out = append(out, fmt.Sprintf("... %d more", len(pods)-most))
			break
		}
		out = append(out, p.Name)
	}
	return out
}
