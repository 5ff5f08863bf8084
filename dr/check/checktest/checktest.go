// Package checktest writes small, deterministic Hugging Face style model
// deployment folders for tests of the DR check: a two-shard tiny Llama with
// valid safetensors headers over a few kilobytes of data (no real weights),
// a real-format tokenizer.json, tokenizer and generation configs, a LoRA
// adapter, a vLLM config and deployment files (Kubernetes YAML, Dockerfile,
// pinned requirements). Tests then break one thing at a time.
//
// It is test scaffolding: only tests import it. It imports
// dr/check/safetensors and nothing else of ours.
package checktest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/meridian-llm/meridian/dr/check/safetensors"
)

// Variant selects the model written by WriteHealthy.
type Variant string

const (
	// BF16 is an unquantised model with a LoRA adapter.
	BF16 Variant = "bf16"
	// AWQ is a 4-bit AWQ model (packed .qweight tensors and a
	// quantization_config) served by vLLM with quantization awq.
	AWQ Variant = "awq"
)

// Shape of the tiny model.
const (
	VocabSize = 64
	Hidden    = 16
	Heads     = 4
	KVHeads   = 2
	MaxPos    = 2048
)

// Shard names of the tiny model.
const (
	Shard1 = "model-00001-of-00002.safetensors"
	Shard2 = "model-00002-of-00002.safetensors"
)

type tensor struct {
	name  string
	dtype safetensors.DType
	shape []uint64
}

func tensors(v Variant) (s1, s2 []tensor) {
	h, kv := uint64(Hidden), uint64(Hidden*KVHeads/Heads)
	proj := func(name string, out, in uint64) []tensor {
		if v == AWQ {
			return []tensor{
				{name + ".qweight", "I32", []uint64{in, out / 8}},
				{name + ".qzeros", "I32", []uint64{1, out / 8}},
				{name + ".scales", "F16", []uint64{1, out}},
			}
		}
		return []tensor{{name + ".weight", "BF16", []uint64{out, in}}}
	}
	s1 = append(s1, tensor{"model.embed_tokens.weight", "BF16", []uint64{VocabSize, h}})
	for _, p := range []struct {
		n       string
		out, in uint64
	}{{"q_proj", h, h}, {"k_proj", kv, h}, {"v_proj", kv, h}, {"o_proj", h, h}} {
		s1 = append(s1, proj("model.layers.0.self_attn."+p.n, p.out, p.in)...)
	}
	s1 = append(s1, tensor{"model.layers.0.input_layernorm.weight", "BF16", []uint64{h}})
	for _, p := range []struct {
		n       string
		out, in uint64
	}{{"gate_proj", 2 * h, h}, {"up_proj", 2 * h, h}, {"down_proj", h, 2 * h}} {
		s2 = append(s2, proj("model.layers.0.mlp."+p.n, p.out, p.in)...)
	}
	s2 = append(s2,
		tensor{"model.layers.0.post_attention_layernorm.weight", "BF16", []uint64{h}},
		tensor{"model.norm.weight", "BF16", []uint64{h}},
		tensor{"lm_head.weight", "BF16", []uint64{VocabSize, h}},
	)
	return s1, s2
}

// Safetensors returns a valid safetensors file holding the given tensors
// (laid out in order) filled with a deterministic byte pattern.
func Safetensors(ts []safetensors.Tensor, metadata map[string]string, seed byte) ([]byte, error) {
	hdr, n, err := safetensors.Layout(ts, metadata)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(hdr), len(hdr)+int(n))
	copy(out, hdr)
	for i := range n {
		out = append(out, byte(i*31)+seed)
	}
	return out, nil
}

func shard(ts []tensor, seed byte) ([]byte, uint64, []string, error) {
	st := make([]safetensors.Tensor, len(ts))
	names := make([]string, len(ts))
	for i, t := range ts {
		st[i] = safetensors.Tensor{Name: t.name, DType: t.dtype, Shape: t.shape}
		names[i] = t.name
	}
	b, err := Safetensors(st, map[string]string{"format": "pt"}, seed)
	if err != nil {
		return nil, 0, nil, err
	}
	return b, st[len(st)-1].End, names, nil
}

// Vocab returns the tiny tokenizer's tokens by id: four special tokens, then
// letters and digits.
func Vocab() []string {
	v := []string{"<unk>", "<s>", "</s>", "<|eot|>"}
	for c := 'a'; c <= 'z'; c++ {
		v = append(v, string(c))
	}
	for c := 'A'; c <= 'Z'; c++ {
		v = append(v, string(c))
	}
	for c := '0'; c <= '7'; c++ {
		v = append(v, string(c))
	}
	return v
}

// ChatTemplate is the tiny model's chat template.
const ChatTemplate = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|eot|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"

func files(v Variant) (map[string][]byte, error) {
	out := map[string][]byte{}
	js := func(name string, x any) error {
		b, err := json.MarshalIndent(x, "", "  ")
		if err != nil {
			return fmt.Errorf("checktest: %s: %w", name, err)
		}
		out[name] = append(b, '\n')
		return nil
	}
	config := map[string]any{
		"_name_or_path":           "meridian/tiny-llama-dr",
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"vocab_size":              VocabSize,
		"hidden_size":             Hidden,
		"intermediate_size":       2 * Hidden,
		"num_hidden_layers":       1,
		"num_attention_heads":     Heads,
		"num_key_value_heads":     KVHeads,
		"max_position_embeddings": MaxPos,
		"rope_theta":              500000.0,
		"rope_scaling": map[string]any{
			"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
			"original_max_position_embeddings": 256,
		},
		"torch_dtype":  "bfloat16",
		"bos_token_id": 1,
		"eos_token_id": 2,
	}
	if v == AWQ {
		config["_name_or_path"] = "meridian/tiny-llama-dr-awq"
		config["torch_dtype"] = "float16"
		config["quantization_config"] = map[string]any{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}
	}
	if err := js("config.json", config); err != nil {
		return nil, err
	}
	if err := js("generation_config.json", map[string]any{"bos_token_id": 1, "eos_token_id": []int{2, 3}, "do_sample": true, "temperature": 0.6, "top_p": 0.9}); err != nil {
		return nil, err
	}
	s1, s2 := tensors(v)
	weightMap := map[string]string{}
	var total uint64
	for i, s := range []struct {
		name string
		ts   []tensor
	}{{Shard1, s1}, {Shard2, s2}} {
		b, n, names, err := shard(s.ts, byte(i+1))
		if err != nil {
			return nil, err
		}
		out[s.name] = b
		total += n
		for _, t := range names {
			weightMap[t] = s.name
		}
	}
	if err := js("model.safetensors.index.json", map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}); err != nil {
		return nil, err
	}
	vocab := map[string]int{}
	for i, t := range Vocab() {
		vocab[t] = i
	}
	var added []map[string]any
	decoder := map[string]any{}
	for i, t := range Vocab()[:4] {
		added = append(added, map[string]any{"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
		decoder[fmt.Sprint(i)] = map[string]any{"content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	}
	if err := js("tokenizer.json", map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer": nil, "pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil, "decoder": map[string]any{"type": "ByteLevel"},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "vocab": vocab, "merges": []string{}},
	}); err != nil {
		return nil, err
	}
	if err := js("tokenizer_config.json", map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
		"added_tokens_decoder": decoder, "chat_template": ChatTemplate, "model_max_length": MaxPos, "add_bos_token": true,
	}); err != nil {
		return nil, err
	}
	if err := js("special_tokens_map.json", map[string]any{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}); err != nil {
		return nil, err
	}
	engine := []string{
		"# vLLM serving config (vllm serve --config)",
		"model: /models/tiny-llama",
		"served-model-name: tiny-llama",
		"max-model-len: 2048",
		"tensor-parallel-size: 2",
		"generation-config: auto",
	}
	if v == AWQ {
		engine = append(engine, "quantization: awq", "dtype: float16")
	} else {
		engine = append(engine, "dtype: bfloat16", "enable-lora: true", "max-lora-rank: 16", "lora-modules:", "  - sql=/models/tiny-llama/adapters/sql")
		if err := js("adapters/sql/adapter_config.json", map[string]any{
			"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": []string{"q_proj", "v_proj"},
			"base_model_name_or_path": "meridian/tiny-llama-dr", "task_type": "CAUSAL_LM",
		}); err != nil {
			return nil, err
		}
		b, err := Safetensors([]safetensors.Tensor{
			{Name: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType: "BF16", Shape: []uint64{8, Hidden}},
			{Name: "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", DType: "BF16", Shape: []uint64{Hidden, 8}},
		}, nil, 7)
		if err != nil {
			return nil, err
		}
		out["adapters/sql/adapter_model.safetensors"] = b
	}
	out["engine/vllm.yaml"] = []byte(strings.Join(engine, "\n") + "\n")
	out["deploy/k8s.yaml"] = []byte(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: tiny-llama
spec:
  replicas: 2
  selector:
    matchLabels: {app: tiny-llama}
  template:
    metadata:
      labels: {app: tiny-llama}
    spec:
      containers:
        - name: vllm
          image: registry.example.com/tiny-llama-vllm:0.11.0
          command: ["vllm", "serve", "/models/tiny-llama"]
          args: ["--config", "/models/tiny-llama/engine/vllm.yaml", "--port", "8000"]
          ports: [{containerPort: 8000}]
---
apiVersion: v1
kind: Service
metadata:
  name: tiny-llama
spec:
  selector: {app: tiny-llama}
  ports: [{port: 80, targetPort: 8000}]
`)
	out["deploy/Dockerfile"] = []byte(`FROM vllm/vllm-openai:v0.11.0
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-deps -r /tmp/requirements.lock
`)
	out["deploy/requirements.lock"] = []byte(`# pip-compile --generate-hashes
vllm==0.11.0 \
    --hash=sha256:0000000000000000000000000000000000000000000000000000000000000000
transformers==4.57.1
tokenizers==0.22.1
`)
	return out, nil
}

// WriteHealthy writes a healthy deployment folder of the given variant into
// dir (created if needed). The same variant always yields the same bytes.
func WriteHealthy(dir string, v Variant) error {
	fs, err := files(v)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(fs))
	for n := range fs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("checktest: %w", err)
		}
		if err := os.WriteFile(p, fs[n], 0o644); err != nil {
			return fmt.Errorf("checktest: %w", err)
		}
	}
	return nil
}

// SentencePiece returns a minimal SentencePiece ModelProto with the tiny
// vocabulary's first n tokens as pieces (field 1), each with a score and a
// type, plus an empty trainer spec.
func SentencePiece(n int) []byte {
	var out []byte
	for i, tok := range Vocab()[:n] {
		var p []byte
		p = append(p, 0x0a, byte(len(tok)))
		p = append(p, tok...)
		p = append(p, 0x15, 0, 0, 0x80, 0xbf) // score -1.0 as float32
		typ := byte(1)                        // NORMAL
		if i < 4 {
			typ = 3 // CONTROL
		}
		p = append(p, 0x18, typ)
		out = append(out, 0x0a, byte(len(p)))
		out = append(out, p...)
	}
	return append(out, 0x12, 0x00)
}

// Tiktoken returns a tiktoken BPE rank file with the tiny vocabulary's
// first n tokens.
func Tiktoken(n int) []byte {
	var b strings.Builder
	for i, tok := range Vocab()[:n] {
		fmt.Fprintf(&b, "%s %d\n", base64.StdEncoding.EncodeToString([]byte(tok)), i)
	}
	return []byte(b.String())
}

// WriteSparseShard writes at path a safetensors file holding one U8 tensor
// of dataBytes bytes whose data is a hole: the file has its full size but
// takes no disk space, so tests and benchmarks can check multi-GB shards.
func WriteSparseShard(path, tensor string, dataBytes uint64) error {
	hdr, n, err := safetensors.Layout([]safetensors.Tensor{{Name: tensor, DType: "U8", Shape: []uint64{dataBytes}}}, nil)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, hdr, 0o644); err != nil {
		return fmt.Errorf("checktest: %w", err)
	}
	if err := os.Truncate(path, int64(len(hdr))+int64(n)); err != nil {
		return fmt.Errorf("checktest: %w", err)
	}
	return nil
}
