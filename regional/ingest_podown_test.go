package regional

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// Block events after a PodDown in the same message, whose pod cannot be
// tracked again (its headers name no model and none is configured), are
// counted as no_model and skipped: the ingester neither panics nor indexes
// them, and goes on with the next message.
func TestIngestBlocksAfterPodDownWithoutModel(t *testing.T) {
	g, idx, _, _, _ := newTestIngester(t)
	e := newTestEngine("pod-0", 1)
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: e.headers(), Value: e.batch(e.podUp(), e.store(testPrompt(0)))})
	var noModel []kafka.Header
	for _, h := range e.headers() {
		if h.Key != kvevents.HeaderModel {
			noModel = append(noModel, h)
		}
	}
	g.Apply(Message{Offset: 1, Key: []byte(e.name), Headers: noModel,
		Value: e.batch(&kvevents.PodDown{Pod: e.name, Epoch: 1}, e.store(testPrompt(1)))})
	if got := testutil.ToFloat64(g.m.decodeErrors.WithLabelValues("no_model")); got != 1 {
		t.Fatalf("no_model rejections: %v, want 1", got)
	}
	held := func(prompt []uint32) []index.Match {
		return idx.Lookup(index.ChainHashes(index.Namespace{Model: testModel, BlockSize: routerBlockSize}, prompt, nil), nil)
	}
	if m := held(testPrompt(1)); len(m) != 0 {
		t.Fatalf("the blocks stored after the PodDown are indexed: %v", m)
	}
	g.Apply(Message{Offset: 2, Key: []byte(e.name), Headers: e.headers(), Value: e.batch(e.podUp(), e.store(testPrompt(2)))})
	if m := held(testPrompt(2)); len(m) == 0 {
		t.Fatal("the next message indexed nothing")
	}
}
