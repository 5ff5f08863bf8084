package fleet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// BalancerProbeInterval is how often a Balancer asks each replica's
// /readyz, as a load balancer's health check would.
const BalancerProbeInterval = 250 * time.Millisecond

// balancerMisses is how many probes in a row must go unanswered (timed
// out) before a replica that was ready leaves the rotation; one that
// answers "not ready", or refuses the connection, leaves at once.
const balancerMisses = 3

// Balancer spreads requests over a region's replicas as a load balancer in
// front of them would (a Kubernetes Service, the compose file's region
// address): round robin over the replicas whose /readyz last answered 200,
// probed every BalancerProbeInterval over HTTP (so a killed replica keeps
// getting requests until a probe fails, as behind a real one). A request
// whose connection is refused is retried once on another replica, as
// clients behind a Service see (nothing was sent: no work is done twice);
// so is one sent on a kept-alive connection that the replica closed before
// answering a byte (the race every keep-alive client has with a server
// going away; Go's transport retries it itself for requests it may
// replay, and an inference request that got no byte of its answer is one:
// Meridian's proxy retries the same way between pods). The retry goes to
// another ready replica, or, with none, to one whose probe failed (as
// Envoy's retry of a refused connection may); with no replica of the
// region ready it tries any two.
type Balancer struct {
	f      *Fleet
	hc     *http.Client
	next   atomic.Uint64
	mu     sync.Mutex
	ready  map[*Replica]bool
	misses map[*Replica]int // probes in a row with no answer
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewBalancer starts a balancer sending with hc (which must trust the
// fleet's CA: f.HTTP, or a client built on its transport). Close stops its
// probes.
func (f *Fleet) NewBalancer(hc *http.Client) *Balancer {
	ctx, cancel := context.WithCancel(context.Background())
	b := &Balancer{f: f, hc: hc, ready: map[*Replica]bool{}, misses: map[*Replica]int{}, cancel: cancel}
	b.probe(ctx)
	b.wg.Go(func() {
		t := time.NewTicker(BalancerProbeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				b.probe(ctx)
			}
		}
	})
	return b
}

// Close stops the probes.
func (b *Balancer) Close() {
	b.cancel()
	b.wg.Wait()
}

// probe asks every replica's /readyz, in parallel.
func (b *Balancer) probe(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range b.f.Regions {
		for _, rep := range r.Replicas {
			wg.Go(func() {
				ok, answered := false, false
				pctx, cancel := context.WithTimeout(ctx, BalancerProbeInterval)
				defer cancel()
				req, err := http.NewRequestWithContext(pctx, http.MethodGet, rep.URL()+"/readyz", nil)
				if err == nil {
					var resp *http.Response
					if resp, err = b.hc.Do(req); err == nil {
						ok, answered = resp.StatusCode == http.StatusOK, true
						resp.Body.Close()
					}
				}
				b.mu.Lock()
				defer b.mu.Unlock()
				switch {
				case ok:
					b.ready[rep], b.misses[rep] = true, 0
				case answered || Refused(err):
					// It said it is not ready, or nothing listens: out at once.
					b.ready[rep] = false
				default:
					// No answer in time (a loaded machine): out after
					// balancerMisses in a row, as a load balancer's
					// failure threshold.
					b.misses[rep]++
					if b.misses[rep] >= balancerMisses {
						b.ready[rep] = false
					}
				}
			})
		}
	}
	wg.Wait()
}

// Ready reports whether the replica's last probe answered 200.
func (b *Balancer) Ready(rep *Replica) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready[rep]
}

// pick returns the replicas of region to try, in order: a ready one (round
// robin), then another one for a refused retry (ready if one is, else any
// other: a probe that timed out on a loaded machine must not leave a
// refused request nowhere to go); with none ready, any two in turn.
func (b *Balancer) pick(region string) []*Replica {
	r := b.f.Region(region)
	if r == nil || len(r.Replicas) == 0 {
		return nil
	}
	b.mu.Lock()
	var ready, rest []*Replica
	for _, rep := range r.Replicas {
		if b.ready[rep] {
			ready = append(ready, rep)
		} else {
			rest = append(rest, rep)
		}
	}
	b.mu.Unlock()
	n := b.next.Add(1)
	out := make([]*Replica, 0, 2)
	for _, set := range [][]*Replica{ready, rest} {
		for i := range min(2-len(out), len(set)) {
			out = append(out, set[(n+uint64(i))%uint64(len(set))])
		}
	}
	return out
}

// Do sends a request to a replica of region: newReq builds it for the
// replica's base URL (it is called again for the retry). It returns the
// response, the replica that answered (or last refused) and the error of
// the last attempt.
func (b *Balancer) Do(region string, newReq func(base string) (*http.Request, error)) (*http.Response, *Replica, error) {
	var last *Replica
	var err error
	reps := b.pick(region)
	for i, rep := range reps {
		last = rep
		var req *http.Request
		if req, err = newReq(rep.URL()); err != nil {
			return nil, rep, err
		}
		reused := false
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused },
		}))
		var resp *http.Response
		resp, err = b.hc.Do(req)
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			// A replica that has not read its pods yet says so
			// (replica_not_ready): nothing was done, another may serve.
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if rerr == nil && bytes.Contains(body, []byte(`"replica_not_ready"`)) && i+1 < len(reps) {
				continue
			}
		}
		if err == nil || !(Refused(err) || reused) || req.Context().Err() != nil {
			return resp, rep, err
		}
	}
	if last == nil {
		err = errors.New("balancer: no replica of region " + region)
	}
	return nil, last, err
}

// Refused reports whether err is a refused connection: nothing listens at
// the address (a replica that is down), so the request was not sent.
func Refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
