package enginesim

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// The Kafka path end to end: an engine publishes to an in-process kfake
// broker; a reader decodes every message with regional/kvevents. Key and
// headers name the pod; batch sequence numbers run from 0; PodUp comes first
// and PodDown last with the engine's epoch; LoRA and cache salt ride in
// extra_keys; replaying the block events gives exactly the cache.
func TestKafkaPublishing(t *testing.T) {
	const topic = "meridian.kv-events.test-region"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()

	cfg := fastConfig()
	cfg.Region = "test-region"
	cfg.Name = "pod-a"
	cfg.CacheBlocks = 30
	cfg.LoRAs = []string{"adapter-x"}
	cfg.Kafka = &KafkaConfig{Brokers: cluster.ListenAddrs()}
	te := openTestEngine(t, cfg)
	for i := range 12 {
		model := "meridian/sim-70b"
		if i%4 == 3 {
			model = "adapter-x"
		}
		body := fmt.Sprintf(`{"model": %q, "max_tokens": 2, "cache_salt": "tenant-%d", "prompt": %q}`, model, i%2, strings.Repeat(fmt.Sprintf("topic %d words ", i%5), 10)+fmt.Sprint(i))
		if status, b := te.post(context.Background(), "/v1/completions", body); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := te.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]bool{}
	for _, b := range te.CachedBlocks() {
		want[b.Hash] = true
	}

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.ListenAddrs(), Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]bool{}
	// The router's view: re-key the events onto Meridian's chain hashes with
	// a router block of 8 tokens (two engine blocks).
	rk, err := kvevents.NewRekeyer(kvevents.RekeyConfig{Model: "meridian/sim-70b", BlockSize: 8, MaxEntries: 1 << 16, MaxRanks: 1})
	if err != nil {
		t.Fatal(err)
	}
	routerRefs := map[uint64]int{}
	var ops []kvevents.Op
	var kinds []kvevents.Kind
	var sawSalt, sawLoRA bool
	for seq := uint64(0); ; seq++ {
		msg, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read message %d: %v", seq, err)
		}
		h := map[string][]byte{}
		for _, hd := range msg.Headers {
			h[hd.Key] = hd.Value
		}
		if string(msg.Key) != "pod-a" || string(h[HeaderPod]) != "pod-a" || string(h[HeaderModel]) != "meridian/sim-70b" || string(h[HeaderHardware]) != "h100" {
			t.Fatalf("message %d: key %q headers %q", seq, msg.Key, h)
		}
		if s := binary.BigEndian.Uint64(h[HeaderSeq]); s != seq {
			t.Fatalf("message %d has seq %d", seq, s)
		}
		if e := binary.BigEndian.Uint64(h[HeaderEpoch]); e != te.Epoch() {
			t.Fatalf("message %d has epoch %d, engine %d", seq, e, te.Epoch())
		}
		b, err := dec.Decode(msg.Value)
		if err != nil {
			t.Fatalf("decode message %d: %v", seq, err)
		}
		if b.Rank() != 0 || b.TS <= 0 {
			t.Fatalf("message %d: rank %d ts %v", seq, b.Rank(), b.TS)
		}
		ops = rk.Apply(ops[:0], b)
		for _, op := range ops {
			switch op.Kind {
			case kvevents.OpRegister:
				for _, x := range op.Hashes {
					routerRefs[x]++
				}
			case kvevents.OpEvict:
				for _, x := range op.Hashes {
					if routerRefs[x]--; routerRefs[x] == 0 {
						delete(routerRefs, x)
					}
				}
			case kvevents.OpClearPod:
				clear(routerRefs)
			}
		}
		done := false
		for _, ev := range b.Events {
			kinds = append(kinds, ev.Kind())
			switch ev := ev.(type) {
			case *kvevents.PodUp:
				if ev.Pod != "pod-a" || ev.Epoch != te.Epoch() || ev.Region != "test-region" || ev.Endpoint != te.URL() || ev.Hardware != "h100" || ev.Model != "meridian/sim-70b" {
					t.Fatalf("PodUp %+v", ev)
				}
			case *kvevents.PodDown:
				if ev.Pod != "pod-a" || ev.Epoch != te.Epoch() {
					t.Fatalf("PodDown %+v", ev)
				}
				done = true
			case *kvevents.BlockStored:
				if ev.BlockSize != 4 || ev.Medium.V != "GPU" || len(ev.TokenIDs) != 4*len(ev.BlockHashes) {
					t.Fatalf("BlockStored %+v", ev)
				}
				if ev.LoRAName.V == "adapter-x" && len(ev.ExtraKeys) == len(ev.BlockHashes) {
					sawLoRA = true
				}
				if !ev.ParentBlockHash.Valid && len(ev.ExtraKeys) > 0 && strings.Contains(string(ev.ExtraKeys[0]), "tenant-") {
					sawSalt = true
				}
				for _, x := range ev.BlockHashes {
					got[x] = true
				}
			case *kvevents.BlockRemoved:
				for _, x := range ev.BlockHashes {
					delete(got, x)
				}
			case *kvevents.AllBlocksCleared:
				clear(got)
			}
		}
		if done {
			break
		}
	}
	if kinds[0] != kvevents.KindPodUp || kinds[len(kinds)-1] != kvevents.KindPodDown {
		t.Fatalf("event kinds %v: want PodUp first and PodDown last", kinds)
	}
	if !slices.Contains(kinds, kvevents.KindBlockRemoved) {
		t.Fatalf("no eviction in %v", kinds)
	}
	if !sawSalt || !sawLoRA {
		t.Fatalf("extra keys: salt seen %v, LoRA seen %v", sawSalt, sawLoRA)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("replayed %d blocks from Kafka, the cache holds %d", len(got), len(want))
	}
	// Every router block whose two engine blocks the cache holds, keyed by
	// Meridian's chain hash over the block's whole prefix, and nothing else.
	wantRouter := map[uint64]int{}
	for _, b := range te.CachedBlocks() {
		if (b.Position+1)%2 == 0 {
			ns := index.Namespace{Model: "meridian/sim-70b", LoRA: b.LoRA, CacheSalt: b.CacheSalt, BlockSize: 8}
			chain := index.ChainHashes(ns, b.Prefix, nil)
			wantRouter[chain[len(chain)-1]] = 1
		}
	}
	if st := rk.Stats(); st.UnknownParent != 0 || st.Opaque != 0 || st.Conflicts != 0 || st.UnknownMedium != 0 {
		t.Fatalf("re-keyer stats %+v", st)
	}
	if len(wantRouter) == 0 || !maps.Equal(routerRefs, wantRouter) {
		t.Fatalf("router view %v, want %v", routerRefs, wantRouter)
	}
}
