package regional

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Keeping links to other regions' controllers warm. A forward that needs a
// new connection pays TCP and a mutual TLS handshake on the request path;
// on a controller short of CPU that alone can exceed the connect bound
// (ForwardConfig.ConnectMin), and it comes all at once when one of a
// region's controllers dies and every forward moves to another one. So:
//
//   - every PeerWarmInterval this controller asks each other region's
//     controllers for /healthz through the same client the forwards use, so
//     that each has a kept-alive connection in the pool before a forward
//     needs it, and a controller that stopped answering is known before a
//     request finds out;
//   - forwards to a region go first to its controllers whose last contact
//     (a forward or a probe) succeeded, taking turns among them so that
//     each one's pool holds connections sized to its share of the traffic;
//     a controller whose last contact failed to connect is tried last.

// PeerWarmInterval is how often the links to other regions' controllers are
// probed: well inside peerIdleTimeout, so the probe's connection never
// idles out.
const PeerWarmInterval = 5 * time.Second

// peerIdleTimeout is how long a connection to another region's controller
// may stay idle in the pool: longer than PeerWarmInterval, shorter than the
// other end's idle timeout (ListenerConfig.IdleTimeout, 120 s by default),
// so that the pool does not keep connections the other end is closing.
const peerIdleTimeout = 90 * time.Second

// NewPeerTransport is the transport of forwards to other regions'
// controllers: kept-alive connections with an explicit idle timeout, and a
// bounded TLS handshake (on top of each forward's connect bound), over
// the pod transport's settings.
func NewPeerTransport() *http.Transport {
	t := NewPodTransport()
	t.MaxIdleConnsPerHost = 64
	t.IdleConnTimeout = peerIdleTimeout
	t.TLSHandshakeTimeout = 10 * time.Second
	return t
}

// peerLinks remembers how the last contact with each other region's
// controller went (by forward address), for the order of forwards.
type peerLinks struct {
	client *http.Client
	now    func() time.Time

	mu   sync.Mutex
	last map[string]peerContact
	turn atomic.Uint64
}

// peerContact is when a controller last answered and last failed to.
type peerContact struct{ ok, failed time.Time }

func newPeerLinks(client *http.Client, now func() time.Time) *peerLinks {
	return &peerLinks{client: client, now: now, last: map[string]peerContact{}}
}

// note records a contact with the controller at addr.
func (l *peerLinks) note(addr string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.last[addr]
	if ok {
		c.ok = l.now()
	} else {
		c.failed = l.now()
	}
	l.last[addr] = c
}

// order returns the addresses of a region's controllers in the order a
// forward tries them: those whose last contact did not fail, starting
// with the next one's turn, then those whose last contact failed, the
// longest failed first. addrs is not changed.
func (l *peerLinks) order(addrs []string) []string {
	if len(addrs) < 2 {
		return addrs
	}
	out := make([]string, 0, len(addrs))
	var failed []string
	l.mu.Lock()
	for _, a := range addrs {
		if c := l.last[a]; c.failed.After(c.ok) {
			failed = append(failed, a)
		} else {
			out = append(out, a)
		}
	}
	slices.SortStableFunc(failed, func(a, b string) int { return l.last[a].failed.Compare(l.last[b].failed) })
	l.mu.Unlock()
	if n := len(out); n > 1 {
		k := int(l.turn.Add(1) % uint64(n))
		slices.Reverse(out[:k])
		slices.Reverse(out[k:])
		slices.Reverse(out)
	}
	return append(out, failed...)
}

// warm probes every address at once, each within timeout, and forgets
// what it knew of addresses no longer given. It returns when every probe
// is done.
func (l *peerLinks) warm(ctx context.Context, addrs []string, timeout time.Duration) {
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() { l.note(a, l.probe(ctx, a, timeout)) })
	}
	wg.Wait()
	l.mu.Lock()
	for a := range l.last {
		if !slices.Contains(addrs, a) {
			delete(l.last, a)
		}
	}
	l.mu.Unlock()
}

// probe asks the controller at addr for /healthz, leaving the connection
// in the pool for the next forward.
func (l *peerLinks) probe(ctx context.Context, addr string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return false
	}
	// Read to the end, or the connection is not reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// run probes the addresses addrs gives every interval until ctx ends.
func (l *peerLinks) run(ctx context.Context, interval time.Duration, addrs func() []string) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		l.warm(ctx, addrs(), interval)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
