package kvevents

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestWarnLimiter: one line per kind per interval; the next line after the
// interval carries the number suppressed; kinds are limited independently.
func TestWarnLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(1000, 0)
	l := NewWarnLimiter(log, time.Minute, func() time.Time { return now })
	for range 5 {
		l.Warn("truncated", "bad event", "reason", "truncated")
	}
	l.Warn("bad_hash", "bad event", "reason", "bad_hash")
	now = now.Add(59 * time.Second)
	l.Warn("truncated", "bad event", "reason", "truncated")
	now = now.Add(time.Second)
	l.Warn("truncated", "bad event", "reason", "truncated")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	if strings.Contains(lines[0], "suppressed") || !strings.Contains(lines[1], "reason=bad_hash") {
		t.Errorf("first lines:\n%s", buf.String())
	}
	if !strings.Contains(lines[2], "reason=truncated") || !strings.Contains(lines[2], "suppressed_since_last=5") {
		t.Errorf("after the interval: %s, want the 5 suppressed counted", lines[2])
	}
}
