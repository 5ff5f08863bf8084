package kvbridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// benchBatch is a batch of one BlockStored of 16 blocks of 16 tokens (a
// 256-token prefill step), about 1.2 KB encoded.
func benchBatch(seq uint64) enginesim.Batch {
	hashes := make([]uint64, 16)
	tokens := make([]uint32, 16*16)
	for i := range hashes {
		hashes[i] = seq<<8 | uint64(i) | 1<<63
	}
	for i := range tokens {
		tokens[i] = uint32(1000 + i*7)
	}
	return enginesim.Batch{Pod: "pod-b", Seq: seq, TS: time.Unix(1700000000, 0), Events: []enginesim.Event{{
		Kind: enginesim.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 16, Medium: enginesim.MediumGPU,
		HasParent: true, ParentHash: seq}}}
}

// End to end: the engine simulator's ZMQ publisher -> the bridge -> an
// in-process Kafka-protocol broker (kfake), on loopback. Reports forwarded
// batches per second; each op is one batch published and acknowledged.
func BenchmarkBridgeEndToEnd(b *testing.B) {
	cluster := startKafkaB(b)
	pub, err := enginesim.NewZMQPublisher(enginesim.ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind",
		ReplayEndpoint: "tcp://127.0.0.1:0", HWM: 1 << 30, BufferSteps: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	cfg := bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-b", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr()})
	br, err := kvbridge.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := pub.WaitFor(ctx, func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 }); err != nil {
		b.Fatal(err)
	}
	batches := make([]enginesim.Batch, 0, 1024)
	for i := range 1024 {
		batches = append(batches, benchBatch(uint64(i)))
	}
	// Warm up: the first write fetches the topic's metadata.
	if err := pub.Publish(ctx, batches[0]); err != nil {
		b.Fatal(err)
	}
	if err := br.WaitFor(ctx, func(s kvbridge.Stats) bool { return s.Forwarded == 1 && s.Pending == 0 }); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		bt := batches[i%len(batches)]
		bt.Seq = uint64(i + 1)
		if err := pub.Publish(ctx, bt); err != nil {
			b.Fatal(err)
		}
	}
	if err := br.WaitFor(ctx, func(s kvbridge.Stats) bool { return s.Forwarded >= uint64(b.N)+1 && s.Pending == 0 }); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
	if st := br.Stats(); st.GapsLost != 0 || st.Forwarded != uint64(b.N)+1 {
		b.Fatalf("stats %+v", st)
	}
}
