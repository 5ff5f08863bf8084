package regional

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// TestIngestPodUpEngineAndCapacity: a PodUp's engine kind reaches the
// registry (the scraper reads by it) and its KV capacity sizes the pod's
// re-keyer before the cache fills; a pod known only from its events takes
// them from its headers.
func TestIngestPodUpEngineAndCapacity(t *testing.T) {
	g, _, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-sg", 1)
	up := e.podUp().(*kvevents.PodUp)
	up.Engine, up.KVBlocks = kvevents.EngineSGLang, 20000
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: e.headers(), Value: e.batch(up)})
	p, ok := reg.Get("pod-sg")
	if !ok || p.Info().Engine != kvevents.EngineSGLang || p.Info().KVBlocks != 20000 {
		t.Fatalf("registry: %+v", p.Info())
	}
	if c := g.pods["pod-sg"].rekey.Capacity(); c < 20000 {
		t.Fatalf("re-keyer sized for %d blocks, want >= 20000", c)
	}
	hs := append(e.headers(), kafka.Header{Key: kvevents.HeaderEngine, Value: []byte(kvevents.EngineTRTLLM)},
		kafka.Header{Key: kvevents.HeaderKVBlocks, Value: []byte{0, 0, 0, 0, 0, 0, 0x30, 0}})
	g.Apply(Message{Offset: 1, Key: []byte("pod-trt"), Headers: hs, Value: e.batch(&kvevents.AllBlocksCleared{})})
	p, ok = reg.Get("pod-trt")
	if !ok || p.Info().Engine != kvevents.EngineTRTLLM || p.Info().KVBlocks != 0x3000 || g.pods["pod-trt"].rekey.Capacity() < 0x3000 {
		t.Fatalf("from headers: %+v", p.Info())
	}
}

// TestIngestSkipsOnlyTheBadEvent: a batch with a malformed event (an
// SGLang DeepSeek V4 page whose pairs do not chain) applies its other
// events and counts the bad one by reason.
func TestIngestSkipsOnlyTheBadEvent(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-x", 1)
	good := e.store(seqTokens(routerBlockSize, 1))
	bad := &kvevents.BlockStored{BlockHashes: []uint64{77}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Pairs: true, PairNext: 3}
	msg := e.batch(good, bad)
	// Break the pairs' chain: the second pair's first token is the first
	// pair's second (2); make it 9.
	i := strings.Index(string(msg), "\x92\x02\x03")
	if i < 0 {
		t.Fatal("no second pair in the message")
	}
	msg[i+1] = 9
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: e.headers(), Value: msg})
	p, _ := reg.Get("pod-x")
	chain := index.ChainHashes(index.Namespace{Model: testModel, BlockSize: routerBlockSize}, seqTokens(routerBlockSize, 1), nil)
	if res := idx.Lookup(chain, nil); len(res) != 1 || res[0].Pod != p.ID || res[0].Blocks != 1 {
		t.Fatalf("the good event was not applied: %+v", res)
	}
	if got := testutil.ToFloat64(g.m.decodeErrors.WithLabelValues(string(kvevents.ReasonBadTokenPairs))); got != 1 {
		t.Fatalf("bad_token_pairs counted %v times", got)
	}
}

// TestIngestRekeySkippedMetric: what the re-keyers skip is exported by
// reason, including after the pod is gone.
func TestIngestRekeySkippedMetric(t *testing.T) {
	g, _, _, pr, _ := newTestIngester(t)
	e := newTestEngine("pod-r", 1)
	ev := e.store(seqTokens(routerBlockSize, 5)).(*kvevents.BlockStored)
	ev.Medium, ev.Locality = kvevents.Some("STORAGE"), kvevents.Some("REMOTE")
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: e.headers(), Value: e.batch(e.podUp(), ev)})
	g.Apply(Message{Offset: 1, Key: []byte(e.name), Headers: e.headers(), Value: e.batch(&kvevents.PodDown{Pod: e.name, Epoch: 1})})
	want := `
# HELP meridian_ingest_rekey_skipped_total Engine blocks and events the re-keyers did not index, by reason (see kvevents.RekeyStats).
# TYPE meridian_ingest_rekey_skipped_total counter
`
	if err := testutil.GatherAndCompare(pr, strings.NewReader(want+`meridian_ingest_rekey_skipped_total{reason="bad_blocks"} 0
meridian_ingest_rekey_skipped_total{reason="bad_rank"} 0
meridian_ingest_rekey_skipped_total{reason="cap_dropped"} 0
meridian_ingest_rekey_skipped_total{reason="cap_evicted"} 0
meridian_ingest_rekey_skipped_total{reason="conflict"} 0
meridian_ingest_rekey_skipped_total{reason="non_local"} 1
meridian_ingest_rekey_skipped_total{reason="not_full_attention"} 0
meridian_ingest_rekey_skipped_total{reason="opaque"} 0
meridian_ingest_rekey_skipped_total{reason="reannounced"} 0
meridian_ingest_rekey_skipped_total{reason="unknown_medium"} 0
meridian_ingest_rekey_skipped_total{reason="unknown_parent"} 0
`), "meridian_ingest_rekey_skipped_total"); err != nil {
		t.Fatal(err)
	}
}

func seqTokens(n int, start uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)
	}
	return out
}
