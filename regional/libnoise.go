package regional

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// libraryLogKey is the attribute by which the client libraries' log bridges
// (global's for hashicorp/raft, gossip's for memberlist, kafkaErrorLogger)
// name the library a line comes from.
const libraryLogKey = "logger"

// libraryNoise is the controller's log handler in front of the one it is
// given: what a client library logs at Warn or above passes at most once per
// interval for each (library, message), the next one saying how many were
// suppressed ("suppressed_since_last"). A peer that is down makes raft and
// memberlist repeat the same complaint several times a second; the metrics
// and the first line say it, the rest is noise. The controller's own lines
// pass untouched.
type libraryNoise struct {
	next  slog.Handler
	state *noiseState // shared by the handlers WithAttrs and WithGroup derive
}

type noiseState struct {
	every      time.Duration
	now        func() time.Time
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// noiseKeysKept bounds the remembered (library, message) pairs: past it,
// pairs not seen within the interval are forgotten.
const noiseKeysKept = 1024

func newLibraryNoise(next slog.Handler, every time.Duration, now func() time.Time) *libraryNoise {
	return &libraryNoise{next: next, state: &noiseState{every: every, now: now,
		last: map[string]time.Time{}, suppressed: map[string]int{}}}
}

func (h *libraryNoise) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *libraryNoise) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	var lib string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == libraryLogKey {
			lib = a.Value.String()
			return false
		}
		return true
	})
	if lib == "" {
		return h.next.Handle(ctx, r)
	}
	n, pass := h.state.admit(lib + "\x00" + r.Message)
	if !pass {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed_since_last", n))
	}
	return h.next.Handle(ctx, r)
}

// admit reports whether a line of key may pass now and how many were
// suppressed since the last that did.
func (s *noiseState) admit(key string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if t, ok := s.last[key]; ok && now.Sub(t) < s.every {
		s.suppressed[key]++
		return 0, false
	}
	if len(s.last) >= noiseKeysKept {
		for k, t := range s.last {
			if now.Sub(t) >= s.every {
				delete(s.last, k)
				delete(s.suppressed, k)
			}
		}
	}
	n := s.suppressed[key]
	s.last[key], s.suppressed[key] = now, 0
	return n, true
}

func (h *libraryNoise) WithAttrs(as []slog.Attr) slog.Handler {
	return &libraryNoise{next: h.next.WithAttrs(as), state: h.state}
}

func (h *libraryNoise) WithGroup(name string) slog.Handler {
	return &libraryNoise{next: h.next.WithGroup(name), state: h.state}
}

// kafkaErrorLogger is the Kafka reader's ErrorLogger. kafka-go reports a
// fetch that ends in an i/o timeout (an idle long poll against a healthy
// broker, with some brokers every few seconds) as an error and reconnects by
// itself: that goes to Debug. The ingester's own probe and
// meridian_ingest_connected say whether the brokers answer. Other errors are
// warnings, at most one a minute (warn).
func kafkaErrorLogger(warn *kvevents.WarnLimiter, log *slog.Logger) kafka.Logger {
	return kafka.LoggerFunc(func(msg string, args ...any) {
		line := fmt.Sprintf(msg, args...)
		if strings.Contains(line, "i/o timeout") || strings.Contains(line, "deadline exceeded") {
			log.Debug(line, libraryLogKey, "kafka-go")
			return
		}
		warn.Warn("kafka", line, libraryLogKey, "kafka-go")
	})
}
