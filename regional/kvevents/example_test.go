package kvevents_test

import (
	"fmt"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// Example shows the ingest path the Kafka ingester runs for one pod: decode
// a vLLM batch, re-key it onto our chain hashes, apply the ops to the index;
// then a request whose prompt starts with the same tokens finds the pod.
func Example() {
	// What a vLLM pod with 16-token blocks publishes (here built with our
	// encoder, as the engine simulator does).
	prompt := make([]uint32, 160)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	msg, _ := kvevents.Encoding{}.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20},
			TokenIDs: prompt, BlockSize: 16, Medium: kvevents.Some("GPU")},
	}})

	dec, _ := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	cfg := kvevents.DefaultRekeyConfig()
	cfg.Model, cfg.BlockSize = "llama", 64 // the router's block size
	rk, _ := kvevents.NewRekeyer(cfg)
	idx, _ := index.New(index.DefaultConfig())
	pod, _ := idx.AddPod("pod-a")

	batch, err := dec.Decode(msg)
	if err != nil {
		fmt.Println(kvevents.ReasonOf(err), err) // count by reason, skip
		return
	}
	for _, op := range rk.Apply(nil, batch) {
		switch op.Kind {
		case kvevents.OpRegister:
			_ = idx.Register(pod, op.Tier, op.Hashes)
		case kvevents.OpEvict:
			_ = idx.Evict(pod, op.Tier, op.Hashes)
		case kvevents.OpClearPod:
			_ = idx.ClearPod(pod)
		}
	}

	// 160 tokens are 10 engine blocks and 2 full router blocks of 64.
	chain := index.ChainHashes(index.Namespace{Model: "llama", BlockSize: 64}, prompt, nil)
	for _, m := range idx.Lookup(chain, nil) {
		name, _ := idx.PodName(m.Pod)
		fmt.Printf("%s holds %d of %d blocks\n", name, m.Blocks, len(chain))
	}
	// Output: pod-a holds 2 of 2 blocks
}
