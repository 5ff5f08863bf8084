package kvbridge

import (
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// vLLM sends no PodUp, so a controller would know a bridged pod only from
// its events, never its endpoint. The bridge announces the pods whose HTTP
// endpoints it knows (static pods with http_endpoint, and every discovered
// pod), every AnnounceInterval, with a TTL.

// applyDiscovered takes one discovery snapshot: it subscribes to the
// engines that joined and announces them at once, resubscribes the ones
// that changed, and unsubscribes from the ones that left, announcing their
// PodDown. It runs on the discovery goroutine.
func (b *Bridge) applyDiscovered(pods []discovery.Pod) {
	d := discovery.Diff(b.discovered, pods)
	b.discovered = pods
	for _, p := range append(d.Left, d.Changed...) {
		b.removePod(p.Name)
	}
	var up []PodConfig
	for _, p := range append(d.Joined, d.Changed...) {
		pc := PodConfig{Name: p.Name, Endpoint: p.KVEvents, ReplayEndpoint: p.Replay, Model: p.Model, Hardware: p.Profile,
			HTTPEndpoint: p.Endpoint, DataParallelSize: 1}
		if err := b.addPod(pc); err != nil {
			b.log.Warn("kv bridge: cannot subscribe to a discovered engine; announcing it all the same", "pod", p.Name, "err", err)
		}
		up = append(up, pc)
	}
	var out []outMsg
	for _, p := range d.Left {
		out = append(out, b.podDown(p))
	}
	if b.cfg.AnnounceInterval > 0 {
		for _, p := range up {
			out = append(out, b.podUp(p))
		}
	}
	b.produce(b.bgCtx, out)
}

// addPod subscribes to a pod's engine (when it has a ZMQ endpoint) and
// adds it to the pods announced.
func (b *Bridge) addPod(p PodConfig) error {
	b.srcMu.Lock()
	b.announced[p.Name] = p
	b.srcMu.Unlock()
	if p.Endpoint == "" {
		return fmt.Errorf("no ZMQ endpoint (discovery.dns.kv_events_port, or kv_events in the file)")
	}
	srcs, err := b.newSources(p)
	if err != nil {
		return err
	}
	b.srcMu.Lock()
	b.sources = append(b.sources, srcs...)
	b.srcMu.Unlock()
	for _, s := range srcs {
		b.start(s)
	}
	return nil
}

// removePod unsubscribes from a pod's engine: what was received is still
// forwarded. It stops announcing the pod.
func (b *Bridge) removePod(name string) {
	b.srcMu.Lock()
	delete(b.announced, name)
	var gone []*source
	kept := b.sources[:0]
	for _, s := range b.sources {
		if s.pod.Name == name {
			gone = append(gone, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(b.sources[len(kept):])
	b.sources = kept
	b.srcMu.Unlock()
	for _, s := range gone {
		s.stop()
	}
}

// announceLoop announces every announced pod each AnnounceInterval until
// the bridge closes.
func (b *Bridge) announceLoop() {
	defer b.bg.Done()
	for {
		b.srcMu.Lock()
		out := make([]outMsg, 0, len(b.announced))
		for _, p := range b.announced {
			out = append(out, b.podUp(p))
		}
		b.srcMu.Unlock()
		b.produce(b.bgCtx, out)
		if !sleep(b.bgCtx, b.cfg.AnnounceInterval) {
			return
		}
	}
}

// podUp is the Kafka message announcing p: key and pod header its name,
// model and hardware headers, signed with AnnounceKey when set. Epoch 0:
// the bridge does not know the engine's process epoch (see the package
// doc), and a PodUp without one changes no epoch and clears nothing.
func (b *Bridge) podUp(p PodConfig) outMsg {
	u := &kvevents.PodUp{Pod: p.Name, Endpoint: p.HTTPEndpoint, Model: p.Model, Hardware: p.Hardware, Region: b.cfg.Region,
		Engine: p.Engine, KVBlocks: uint64(max(p.KVBlocks, 0)), TTL: AnnounceTTLFactor * b.cfg.AnnounceInterval}
	hs := b.lifecycleHeaders(p.Name, p.Model, p.Hardware)
	if b.cfg.AnnounceKey != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderAnnounceMAC, Value: []byte(kvevents.AnnounceMAC([]byte(b.cfg.AnnounceKey), u))})
	}
	return outMsg{msg: kafka.Message{Key: []byte(p.Name), Value: b.lifecycleBatch(u), Headers: hs}, at: b.now(), announce: "up"}
}

// podDown is the Kafka message saying a discovered pod left.
func (b *Bridge) podDown(p discovery.Pod) outMsg {
	u := &kvevents.PodDown{Pod: p.Name, Reason: "discovery: no longer found"}
	return outMsg{msg: kafka.Message{Key: []byte(p.Name), Value: b.lifecycleBatch(u), Headers: b.lifecycleHeaders(p.Name, p.Model, p.Profile)},
		at: b.now(), announce: "down"}
}

func (b *Bridge) lifecycleHeaders(pod, model, hardware string) []kafka.Header {
	hs := []kafka.Header{{Key: kvevents.HeaderPod, Value: []byte(pod)}}
	if model != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderModel, Value: []byte(model)})
	}
	if hardware != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderHardware, Value: []byte(hardware)})
	}
	return hs
}

// lifecycleBatch is a vLLM-style batch holding one lifecycle event.
func (b *Bridge) lifecycleBatch(ev kvevents.Event) []byte {
	v, err := kvevents.Encoding{}.AppendBatch(nil, &kvevents.Batch{TS: float64(b.now().UnixNano()) / float64(time.Second), Events: []kvevents.Event{ev}})
	if err != nil {
		panic(fmt.Sprintf("encode announcement: %v", err)) // a fixed, valid event
	}
	return v
}
