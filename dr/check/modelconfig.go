package check

import (
	"fmt"
	"slices"
	"strings"
)

// modelInfo is what the checks need from config.json and its neighbours.
type modelInfo struct {
	configPath string
	config     map[string]any // nil when missing or invalid
	vocabSize  int64          // 0 when unknown
}

// nestedConfigs are the sub-objects multimodal configs keep the language
// model's fields in.
var nestedConfigs = []string{"text_config", "llm_config", "language_config", "thinker_config"}

// field looks name up at the top of config.json, then in the language
// model's sub-config.
func (m *modelInfo) field(name string) (any, bool) {
	if m.config == nil {
		return nil, false
	}
	if v, ok := m.config[name]; ok && v != nil {
		return v, true
	}
	for _, sub := range nestedConfigs {
		if s, ok := m.config[sub].(map[string]any); ok {
			if v, ok := s[name]; ok && v != nil {
				return v, true
			}
		}
	}
	return nil, false
}

func (m *modelInfo) int(name string) (int64, bool) {
	v, ok := m.field(name)
	if !ok {
		return 0, false
	}
	return num(v)
}

func (fo *folder) loadModel() *modelInfo {
	m := &modelInfo{configPath: fo.inModel("config.json")}
	m.config = fo.obj(m.configPath)
	if v, ok := m.int("vocab_size"); ok && v > 0 {
		m.vocabSize = v
	}
	return m
}

func (fo *folder) checkModelConfig() {
	m := fo.model
	cp := m.configPath
	if !fo.has(cp) {
		fo.f.add(Blocking, CodeConfigMissing, cp, "no config.json: no engine can build the model")
		return
	}
	if m.config == nil {
		if _, parsed := fo.docs[cp]; parsed {
			fo.f.add(Blocking, CodeConfigFieldMissing, cp, "config.json is not a JSON object")
		}
		return
	}
	_, hasArch := m.config["architectures"]
	_, hasType := m.config["model_type"]
	if !hasArch && !hasType {
		fo.f.add(Blocking, CodeConfigFieldMissing, cp, "neither architectures nor model_type: engines cannot tell which model to build")
	}
	if m.vocabSize == 0 {
		fo.f.add(Warning, CodeConfigFieldMissing, cp, "no vocab_size: the tokenizer cannot be checked against the model")
	}
	fo.checkRope()
	fo.checkAttention()
	fo.checkGenerationConfig()
}

// ropeRequired lists the keys each RoPE scaling type needs (transformers'
// rope validation).
var ropeRequired = map[string][]string{
	"default":       {},
	"linear":        {"factor"},
	"dynamic":       {"factor"},
	"yarn":          {"factor"},
	"longrope":      {"short_factor", "long_factor"},
	"su":            {"short_factor", "long_factor"},
	"llama3":        {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
	"mrope":         {},
	"deepseek_yarn": {"factor"},
}

// rope returns the RoPE scaling object and its type, reading either
// rope_scaling or (newer transformers) rope_parameters.
func (m *modelInfo) rope() (map[string]any, string, string) {
	for _, key := range []string{"rope_scaling", "rope_parameters"} {
		v, ok := m.field(key)
		if !ok {
			continue
		}
		r, ok := v.(map[string]any)
		if !ok {
			return nil, key, ""
		}
		t, _ := str(r["rope_type"])
		if t == "" {
			t, _ = str(r["type"])
		}
		return r, key, t
	}
	return nil, "", ""
}

func (fo *folder) checkRope() {
	m := fo.model
	r, key, typ := m.rope()
	if key == "" {
		return
	}
	cp := m.configPath
	if r == nil {
		fo.f.add(Blocking, CodeRopeScalingInvalid, cp, "%s is not an object", key)
		return
	}
	if typ == "" {
		fo.f.add(Blocking, CodeRopeScalingInvalid, cp, "%s has neither rope_type nor type", key)
		return
	}
	need, known := ropeRequired[typ]
	if !known {
		fo.f.add(Warning, CodeRopeScalingUnknown, cp, "%s type %q is not one this check knows: engines may reject it", key, typ)
		return
	}
	var missing []string
	for _, k := range need {
		if _, ok := r[k]; !ok {
			if k == "original_max_position_embeddings" {
				if _, ok := m.field(k); ok {
					continue
				}
			}
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		fo.f.add(Blocking, CodeRopeScalingInvalid, cp, "%s type %q lacks %s", key, typ, strings.Join(missing, ", "))
		return
	}
	if _, ok := r["factor"]; ok && slices.Contains(need, "factor") {
		f, ok := float(r["factor"])
		if !ok || f < 1 {
			fo.f.add(Blocking, CodeRopeScalingInvalid, cp, "%s factor %v: want a number of at least 1", key, r["factor"])
		}
	}
}

// maxModelLen is the longest context the engine derives from config.json
// (vLLM's rule): max_position_embeddings, times the RoPE factor for linear,
// dynamic and yarn scaling (yarn counting from its original length).
func (m *modelInfo) maxModelLen() (int64, string, bool) {
	base, ok := m.int("max_position_embeddings")
	if !ok || base <= 0 {
		return 0, "", false
	}
	r, _, typ := m.rope()
	switch typ {
	case "linear", "dynamic", "yarn", "deepseek_yarn":
		f, ok := float(r["factor"])
		if !ok || f < 1 {
			return base, "max_position_embeddings", true
		}
		if strings.HasSuffix(typ, "yarn") {
			if o, ok := num(r["original_max_position_embeddings"]); ok && o > 0 {
				base = o
			}
		}
		return int64(float64(base) * f), fmt.Sprintf("max_position_embeddings with %s RoPE factor %g", typ, f), true
	}
	return base, "max_position_embeddings", true
}

func (fo *folder) checkAttention() {
	m := fo.model
	cp := m.configPath
	heads, okH := m.int("num_attention_heads")
	if !okH {
		return
	}
	if heads <= 0 {
		fo.f.add(Blocking, CodeAttentionConfigInvalid, cp, "num_attention_heads %d", heads)
		return
	}
	if kv, ok := m.int("num_key_value_heads"); ok {
		if kv <= 0 || heads%kv != 0 {
			fo.f.add(Blocking, CodeAttentionConfigInvalid, cp, "num_attention_heads %d is not a multiple of num_key_value_heads %d", heads, kv)
		}
	}
	if _, ok := m.int("head_dim"); !ok {
		if hidden, ok := m.int("hidden_size"); ok && hidden%heads != 0 {
			fo.f.add(Blocking, CodeAttentionConfigInvalid, cp, "hidden_size %d is not a multiple of num_attention_heads %d and there is no head_dim", hidden, heads)
		}
	}
}

func (fo *folder) checkGenerationConfig() {
	gp := fo.inModel("generation_config.json")
	if !fo.has(gp) {
		if !fo.listed(gp) {
			fo.f.add(Warning, CodeGenerationConfigMissing, gp, "no generation_config.json: the engine falls back to its own sampling defaults and stop tokens")
		}
		return
	}
	g := fo.obj(gp)
	if g == nil || fo.model.vocabSize == 0 {
		return
	}
	for _, key := range []string{"bos_token_id", "eos_token_id", "pad_token_id"} {
		var ids []int64
		switch v := g[key].(type) {
		case []any:
			for _, x := range v {
				if n, ok := num(x); ok {
					ids = append(ids, n)
				}
			}
		default:
			if n, ok := num(v); ok {
				ids = append(ids, n)
			}
		}
		for _, id := range ids {
			if id < 0 || id >= fo.model.vocabSize {
				fo.f.add(Warning, CodeGenerationTokenRange, gp, "%s %d is outside the vocabulary (config.json vocab_size %d)", key, id, fo.model.vocabSize)
			}
		}
	}
}

// listed reports whether the manifest lists p.
func (fo *folder) listed(p string) bool {
	if fo.man == nil {
		return false
	}
	_, ok := fo.entries[p]
	return ok
}
