// Package gossiptest holds test helpers for the gossip pool: transport
// wrappers that delay packets per destination, to inject WAN latency into
// in-process clusters on loopback, and that cut links between nodes
// (Partition).
//
// Invariants: no packet leaves before its delay, and delayed packets leave
// in order of due time (send order among equal ones), so a constant delay
// per destination keeps each destination's order; streams (TCP) pass
// through undelayed; Shutdown drops what is queued and waits for the one
// goroutine a DelayTransport owns.
//
// It is test scaffolding: only tests import it. It imports nothing of ours,
// not even gossip, so that gossip's own (in-package) tests can use it.
package gossiptest

import (
	"container/heap"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// DelayTransport delays the packets (UDP: probes, acks, gossip) it sends by
// a per-destination amount. Giving every node of a cluster a DelayTransport
// whose delay to a peer is half the wanted RTT makes every direct probe take
// that RTT. Streams (TCP) are not delayed.
type DelayTransport struct {
	memberlist.NodeAwareTransport
	delay func(to memberlist.Address) time.Duration

	mu   sync.Mutex
	q    packetHeap
	seq  uint64
	wake chan struct{}
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// NewDelayTransport wraps inner; delay gives the one-way delay of a packet
// to a destination (0: send at once). It owns a goroutine until Shutdown.
func NewDelayTransport(inner memberlist.NodeAwareTransport, delay func(to memberlist.Address) time.Duration) *DelayTransport {
	t := &DelayTransport{
		NodeAwareTransport: inner,
		delay:              delay,
		wake:               make(chan struct{}, 1),
		done:               make(chan struct{}),
	}
	t.wg.Add(1)
	go t.loop()
	return t
}

type packet struct {
	due time.Time
	seq uint64
	b   []byte
	to  memberlist.Address
}

type packetHeap []packet

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}

// WriteToAddress queues the packet for its due time (or sends it now). The
// returned send time is now: the delay counts as network time.
func (t *DelayTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	d := t.delay(a)
	if d <= 0 {
		return t.NodeAwareTransport.WriteToAddress(b, a)
	}
	now := time.Now()
	t.mu.Lock()
	t.seq++
	heap.Push(&t.q, packet{due: now.Add(d), seq: t.seq, b: append([]byte(nil), b...), to: a})
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return now, nil
}

// WriteTo is WriteToAddress without a node name.
func (t *DelayTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *DelayTransport) loop() {
	defer t.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		t.mu.Lock()
		var next time.Duration = time.Hour
		var ready []packet
		now := time.Now()
		for t.q.Len() > 0 {
			if d := t.q[0].due.Sub(now); d > 0 {
				next = d
				break
			}
			ready = append(ready, heap.Pop(&t.q).(packet))
		}
		t.mu.Unlock()
		for _, p := range ready {
			_, _ = t.NodeAwareTransport.WriteToAddress(p.b, p.to)
		}
		if len(ready) > 0 {
			continue
		}
		timer.Reset(next)
		select {
		case <-t.done:
			return
		case <-t.wake:
		case <-timer.C:
		}
	}
}

// Shutdown drops the queued packets, stops the goroutine and shuts the
// wrapped transport down.
func (t *DelayTransport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	t.wg.Wait()
	return t.NodeAwareTransport.Shutdown()
}
