package regional

import (
	"sync"
	"time"
)

// auditHealth remembers how the audit log's writes have been going, for
// /readyz: while the last write failed, crossings, forwarded-in requests
// and denials are refused (they need their record), and an operator should
// see why at once.
type auditHealth struct {
	mu       sync.Mutex
	failing  bool // the last write failed
	lastFail time.Time
	failures int64
}

func (h *auditHealth) ok(time.Time) {
	h.mu.Lock()
	h.failing = false
	h.mu.Unlock()
}

func (h *auditHealth) failed(now time.Time, _ error) {
	h.mu.Lock()
	h.failing, h.lastFail = true, now
	h.failures++
	h.mu.Unlock()
}

// detail is the audit part of /readyz. It names no cause: causes name
// files, and /readyz answers anyone who can reach the API.
func (h *auditHealth) detail() map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := map[string]any{"writable": !h.failing, "write_failures": h.failures}
	if h.failures > 0 {
		d["last_failure"] = h.lastFail.UTC().Format(time.RFC3339Nano)
	}
	if h.failing {
		d["note"] = "audit writes are failing: cross-region requests, forwarded-in requests and residency denials are refused until they succeed (see the controller's log)"
	}
	return d
}
