package sim

import (
	"container/heap"
	"math"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

// enginePerf is the simulator's model of one pod's engine: vLLM V1's
// scheduler with chunked prefill on a 70B-class FP8 model at tensor
// parallelism 2. Every scheduler step batches one token of each running
// decode and up to ChunkTokens - decodes tokens of prefill (first in, first
// served), and takes
//
//	StepMs + PrefillMsPerToken x prefill tokens
//	       + AttnMsPerTokenPos x sum over prefill tokens of their position
//	       + KVReadMsPerToken x context tokens of the decodes
//
// so prefill grows with context (attention), shares its steps with decode,
// and decode slows as the batch and its contexts grow. It is deliberately
// not the router's cost model (gorgo: linear in uncached tokens, one
// prompt at a time): routerProfile gives the router the linear fit an
// operator would read off a single-request benchmark of this engine.
type enginePerf struct {
	Name              string
	StepMs            float64 // fixed part of every step (weights read once, launch, sampling)
	PrefillMsPerToken float64 // linear layers, per prefill token
	AttnMsPerTokenPos float64 // attention, per prefill token per token of context before it
	KVReadMsPerToken  float64 // decode attention, per context token of each running decode
	ChunkTokens       int     // vLLM max_num_batched_tokens
	MaxSeqs           int     // vLLM max_num_seqs
	Source            string
}

// Published figures behind the engine constants.
//
// H100 anchors them: NVIDIA NIM benchmarking, Llama-3.3-70B-Instruct, NIM
// 1.8.0, 2 x H100 80GB, FP8, TP2 (docs.nvidia.com/nim/benchmarking/llm/
// 1.0.0/performance), 5000 input / 500 output tokens: concurrency 1 TTFT
// 406.77 ms, ITL 18.58 ms; concurrency 5, 25, 50: ITL 21.83, 38.75, 59.73
// ms; 500 input / 2000 output: concurrency 1 TTFT 47.77 ms.
//   - ITL grows 0.84 ms per concurrent request (1 -> 50). In that closed
//     loop each request's 5,000-token prefill rides in the decode steps:
//     B/500 arrivals per step x 5,000 tokens x 0.0712 ms = 0.712 ms per
//     request; the other 0.128 ms per request at ~5,250 tokens of context is
//     decode attention: 2.44e-5 ms per context token (FP8 KV: 160 KiB per
//     token, 80 KiB per GPU at TP2, read at 3.35 TB/s is 2.4e-5 ms: the
//     figure is memory-bound, as it should be). The step's fixed part is
//     the concurrency-1 ITL less one request's attention: 17.7 ms (70 GB of
//     FP8 weights read across 2 x 3.35 TB/s is 10.4 ms of it).
//   - Attention per prefill token at position p costs p / 53,800 of its
//     linear layers' FLOPs (Llama-3-70B: 4 x 80 layers x 8,192 x p against 2
//     x 70.6e9), at half their FP8 GEMM throughput: AttnMsPerTokenPos =
//     PrefillMsPerToken / 26,900.
//   - PrefillMsPerToken then fits the 5,000-token TTFT: 17.7 + 5,000 a +
//     5,000 x 2,500 a / 26,900 = 406.77 gives a = 0.0712 ms (the 500-token
//     TTFT comes out at 53.6 ms against 47.77 measured).
//
// H200 has the same dense FP8 compute (1,979 TFLOPS), so the same prefill;
// the memory-bound parts scale with bandwidth, 3.35 / 4.8 TB/s. TensorRT-LLM's
// published Llama-3.3-70B FP8 throughput (docs/source/performance/
// perf-overview.md, NVIDIA/TensorRT-LLM@00f3768) has H200 ahead of H100 by
// 1.26x per GPU at 5000/500 and 1.30x at 128/2048, in line.
//
// B200: 4,500 dense FP8 TFLOPS (2.27x) for prefill and attention, 8 TB/s
// (2.39x) for the memory-bound parts. (TensorRT-LLM publishes B200 only in
// FP4: 2.58x H200's per-GPU throughput at 5000/500, which FP4 would give.)
//
// ChunkTokens 8192 and MaxSeqs 1024 are vLLM's defaults for the OpenAI
// server on GPUs with 70 GiB or more (vllm/engine/arg_utils.py).
func enginePerfs() map[string]enginePerf {
	const (
		h100Step    = 17.7
		h100Prefill = 0.0712
		h100KV      = 2.44e-5
		attnRatio   = 26900.0
	)
	mk := func(name string, compute, bandwidth float64, src string) enginePerf {
		a := h100Prefill / compute
		return enginePerf{Name: name, StepMs: h100Step / bandwidth, PrefillMsPerToken: a, AttnMsPerTokenPos: a / attnRatio,
			KVReadMsPerToken: h100KV / bandwidth, ChunkTokens: 8192, MaxSeqs: 1024, Source: src}
	}
	return map[string]enginePerf{
		"h100": mk("h100", 1, 1, "NVIDIA NIM 1.8.0 Llama-3.3-70B FP8 TP2 on 2 x H100: TTFT 406.77 ms at 5000 in, ITL 18.58-59.73 ms at 1-50 concurrent"),
		"h200": mk("h200", 1, 4.8/3.35, "H100 anchor; same FP8 compute; 4.8 TB/s HBM3e; TensorRT-LLM perf-overview H200/H100 1.26-1.30x"),
		"b200": mk("b200", 4500.0/1979, 8/3.35, "H100 anchor; 4.5 PFLOPS dense FP8; 8 TB/s HBM3e"),
	}
}

// scaled returns the engine with every time constant multiplied by k (a pod
// k times slower than its profile).
func (e enginePerf) scaled(k float64) enginePerf {
	e.StepMs *= k
	e.PrefillMsPerToken *= k
	e.AttnMsPerTokenPos *= k
	e.KVReadMsPerToken *= k
	return e
}

// soloTTFTMs is the time to first token of one request alone on the
// engine: cached tokens already in place, uncached ones prefilled in
// chunks with nothing else running.
func (e enginePerf) soloTTFTMs(cached, uncached int) float64 {
	t, pos, left := 0.0, float64(cached), float64(uncached)
	for left > 0 {
		n := min(left, float64(e.ChunkTokens))
		t += e.StepMs + e.PrefillMsPerToken*n + e.AttnMsPerTokenPos*n*(pos+n/2)
		pos += n
		left -= n
	}
	return max(t, e.StepMs)
}

// routerProfile is what an operator configures for the router from a
// single-request benchmark of this engine, as NIM publishes one, at 500,
// 5,000 and 50,000 uncached tokens: gorgo's model overhead + rate x u x (1 +
// u / (2 AttnTokens)) through the three TTFTs; decode is the inter-token
// latency of one request at 5,000 tokens of context. A smooth formula where
// the engine has steps, chunks and a batch.
func (e enginePerf) routerProfile() gorgo.Profile {
	// t(u) = o + r u + k u^2 through (u_i, t_i); attn = r / (2k).
	us := [3]float64{500, 5000, 50000}
	var ts [3]float64
	for i, u := range us {
		ts[i] = e.soloTTFTMs(0, int(u))
	}
	d1 := (ts[1] - ts[0]) / (us[1] - us[0])
	d2 := (ts[2] - ts[1]) / (us[2] - us[1])
	k := (d2 - d1) / (us[2] - us[0])
	rate := d1 - k*(us[0]+us[1])
	overhead := ts[0] - rate*us[0] - k*us[0]*us[0]
	attn := 0.0
	if k > 0 {
		attn = rate / (2 * k)
	}
	return gorgo.Profile{Name: e.Name, PrefillMsPerToken: rate, OverheadMs: overhead, AttnTokens: attn,
		DecodeMsPerToken: e.StepMs + e.KVReadMsPerToken*5250, MaxConcurrency: e.MaxSeqs, MeanOutputTokens: 350}
}

// engine is one pod's engine at run time, as a fluid model of its steps:
// while nothing arrives or finishes, every step takes the same time and
// moves every decode one token and the prefill queue by the same number of
// tokens, so the engine only wakes when the head of the prefill queue
// completes or the next decode ends (or something is admitted). Being
// fluid, a request whose prefill ends inside a shared step gets its first
// token when its last prompt token is computed, up to one step before
// that step would end.
type engine struct {
	perf enginePerf

	prefill   []*job // admitted, prefill not done, first in first out
	phead     int
	decoding  decodeHeap
	steps     float64 // scheduler steps run (while busy)
	kv        float64 // context tokens of the running decodes
	last      time.Duration
	stepMs    float64 // while the state holds
	prefillMs float64 // the prefill part of stepMs (linear and attention)
	chunk     float64 // prefill tokens per step while the state holds
	gen       uint64  // invalidates a scheduled wake-up

	unscheduled int // admitted requests whose prefill has not started

	prefillTime float64 // ms spent on prefill (utilisation)
	busyTime    float64 // ms with anything to do
}

// decodeHeap orders running decodes by the step at which they end.
type decodeHeap []*job

func (h decodeHeap) Len() int           { return len(h) }
func (h decodeHeap) Less(i, j int) bool { return h[i].endStep < h[j].endStep }
func (h decodeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *decodeHeap) Push(x any)        { *h = append(*h, x.(*job)) }
func (h *decodeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

func (e *engine) prefilling() int { return len(e.prefill) - e.phead }

func (e *engine) idle() bool { return e.prefilling() == 0 && len(e.decoding) == 0 }

// advance runs the engine's steps from its last update to now.
func (e *engine) advance(now time.Duration) {
	if e.idle() || e.stepMs <= 0 {
		e.last = now
		return
	}
	ms := float64(now-e.last) / float64(time.Millisecond)
	e.last = now
	if ms <= 0 {
		return
	}
	n := ms / e.stepMs
	e.steps += n
	e.busyTime += ms
	e.kv += n * float64(len(e.decoding))
	if e.prefilling() == 0 {
		return
	}
	e.prefillTime += n * e.prefillMs
	done := n * e.chunk
	for i := e.phead; i < len(e.prefill) && done > 0; i++ {
		j := e.prefill[i]
		take := min(done, j.prefillLeft)
		j.prefillLeft -= take
		j.prefillPos += take
		done -= take
		if !j.scheduled {
			j.scheduled = true
			e.unscheduled--
		}
	}
}

// waiting is what vLLM reports as num_requests_waiting of the admitted
// requests: those whose prefill has not had its first chunk yet.
func (e *engine) waiting() int { return e.unscheduled }

// plan sets the step time and chunk for the current state, and returns the
// time until the next completion (the head's prefill, or a decode's end),
// or -1 when idle.
func (e *engine) plan() time.Duration {
	if e.idle() {
		e.stepMs, e.prefillMs, e.chunk = 0, 0, 0
		return -1
	}
	b := len(e.decoding)
	budget := float64(max(e.perf.ChunkTokens-b, 0))
	left := 0.0
	for i := e.phead; i < len(e.prefill); i++ {
		left += e.prefill[i].prefillLeft
	}
	e.chunk = min(budget, left)
	e.prefillMs = 0
	next := math.Inf(1)
	if e.prefilling() > 0 && e.chunk > 0 {
		h := e.prefill[e.phead]
		// Attention of the head's tokens still to come, spread over the
		// steps that compute them.
		e.prefillMs = e.perf.PrefillMsPerToken*e.chunk + e.perf.AttnMsPerTokenPos*e.chunk*(h.prefillPos+h.prefillLeft/2)
		next = h.prefillLeft / e.chunk
		if left <= budget {
			next = 1 // everything left fits this step: it ends with the step
		}
	}
	e.stepMs = e.perf.StepMs + e.perf.KVReadMsPerToken*e.kv + e.prefillMs
	if b > 0 {
		next = min(next, max(e.decoding[0].endStep-e.steps, 0))
	}
	if math.IsInf(next, 1) {
		return -1
	}
	return time.Duration(math.Ceil(next * e.stepMs * float64(time.Millisecond)))
}

// enqueue adds an admitted request to the prefill queue, its cached tokens
// in place.
func (e *engine) enqueue(j *job, cached, uncached int) {
	j.prefillPos, j.prefillLeft = float64(cached), float64(max(uncached, 1))
	j.scheduled = false
	e.unscheduled++
	e.prefill = append(e.prefill, j)
}

// popPrefilled removes and returns the head of the prefill queue if its
// prefill is done (within rounding).
func (e *engine) popPrefilled() *job {
	if e.prefilling() == 0 || e.prefill[e.phead].prefillLeft > 1e-6 {
		return nil
	}
	j := e.prefill[e.phead]
	if !j.scheduled {
		j.scheduled = true
		e.unscheduled--
	}
	e.prefill[e.phead] = nil
	e.phead++
	if e.phead == len(e.prefill) {
		e.prefill, e.phead = e.prefill[:0], 0
	} else if e.phead > 64 && e.phead*2 > len(e.prefill) {
		n := copy(e.prefill, e.prefill[e.phead:])
		clear(e.prefill[n:])
		e.prefill, e.phead = e.prefill[:n], 0
	}
	return j
}

// startDecode moves a prefilled request to decode: its first token came
// with the step that finished its prefill; out - 1 more follow.
func (e *engine) startDecode(j *job, out int) {
	j.decodeStart = e.steps
	j.endStep = e.steps + float64(max(out-1, 0))
	j.context = j.prefillPos
	e.kv += j.context
	heap.Push(&e.decoding, j)
}

// popDecoded removes and returns a running decode that has ended.
func (e *engine) popDecoded() *job {
	if len(e.decoding) == 0 || e.decoding[0].endStep > e.steps+1e-6 {
		return nil
	}
	j := heap.Pop(&e.decoding).(*job)
	e.kv = max(e.kv-j.context-(e.steps-j.decodeStart), 0)
	if len(e.decoding) == 0 {
		e.kv = 0 // no rounding left over
	}
	return j
}
