package check

import (
	"fmt"
	"slices"
	"strings"
)

// quantSource is one place the checkpoint's quantisation is described.
type quantSource struct {
	path      string
	method    string // normalised: lower case, dashes
	bits      int64  // 0 when not given
	groupSize int64  // 0 when not given
	hasGroup  bool
}

func normMethod(m string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(m)), "_", "-")
}

// quantFamily maps engine kernels and checkpoint formats onto the checkpoint
// format they load: awq_marlin runs AWQ checkpoints, gptq_marlin GPTQ ones.
func quantFamily(m string) string {
	switch m {
	case "awq", "awq-marlin":
		return "awq"
	case "gptq", "gptq-marlin", "gptq-marlin-24", "gptq-bitblas", "marlin", "bitblas":
		return "gptq"
	case "fp8", "fbgemm-fp8", "ptpc-fp8":
		return "fp8"
	case "modelopt", "modelopt-fp4", "nvfp4":
		return "modelopt"
	case "bitsandbytes", "bnb":
		return "bitsandbytes"
	}
	return m
}

// dynamicQuant lists engine methods that quantise unquantised weights at
// load time and so need no quantisation config in the checkpoint.
var dynamicQuant = []string{"fp8", "ptpc-fp8", "bitsandbytes", "experts-int8", "deepspeedfp", "torchao", "rtn"}

// multiFormat lists engine methods that accept several checkpoint formats.
var multiFormat = map[string][]string{"moe-wna16": {"awq", "gptq"}}

var knownQuant = []string{
	"awq", "awq-marlin", "gptq", "gptq-marlin", "gptq-marlin-24", "gptq-bitblas", "marlin", "bitblas",
	"fp8", "fbgemm-fp8", "ptpc-fp8", "modelopt", "modelopt-fp4", "compressed-tensors", "bitsandbytes",
	"gguf", "aqlm", "hqq", "squeezellm", "mxfp4", "auto-round", "quark", "torchao", "experts-int8",
	"deepspeedfp", "moe-wna16", "qqq", "tpu-int8", "ipex", "inc", "rtn", "w8a8-int8", "w8a8-fp8", "fp-quant",
	"petit-nvfp4", "bitnet", "eetq", "higgs", "vptq", "spqr",
}

// quantSources reads the quantisation config from config.json and the
// standalone files AutoGPTQ, AutoAWQ and ModelOpt write.
func (fo *folder) quantSources() []quantSource {
	var out []quantSource
	read := func(p string, m map[string]any, defMethod string) {
		q := quantSource{path: p}
		if s, ok := str(m["quant_method"]); ok {
			q.method = normMethod(s)
		}
		if q.method == "" {
			if _, ok := m["w_bit"]; ok {
				q.method = "awq"
			} else {
				q.method = defMethod
			}
		}
		for _, k := range []string{"bits", "w_bit"} {
			if n, ok := num(m[k]); ok {
				q.bits = n
			}
		}
		for _, k := range []string{"group_size", "q_group_size"} {
			if n, ok := num(m[k]); ok {
				q.groupSize, q.hasGroup = n, true
			}
		}
		out = append(out, q)
	}
	if qc, ok := fo.model.config["quantization_config"].(map[string]any); ok {
		read(fo.model.configPath, qc, "")
	}
	for _, name := range []string{"quantize_config.json", "quant_config.json"} {
		p := fo.inModel(name)
		if m := fo.obj(p); m != nil {
			read(p, m, "gptq")
		}
	}
	if p := fo.inModel("hf_quant_config.json"); fo.obj(p) != nil {
		out = append(out, quantSource{path: p, method: "modelopt"})
	}
	return out
}

func (fo *folder) checkQuantization() {
	srcs := fo.quantSources()
	for _, q := range srcs {
		fo.validateQuant(q)
	}
	var ckpt *quantSource
	if len(srcs) > 0 {
		ckpt = &srcs[0] // config.json's quantization_config wins, as in vLLM
		for _, q := range srcs[1:] {
			if quantFamily(q.method) != quantFamily(ckpt.method) || (q.bits != 0 && ckpt.bits != 0 && q.bits != ckpt.bits) ||
				(q.hasGroup && ckpt.hasGroup && q.groupSize != ckpt.groupSize) {
				fo.f.add(Warning, CodeQuantConfigConflict, q.path, "says %s, but %s says %s: engines read %s", q.describe(), ckpt.path, ckpt.describe(), ckpt.path)
			}
		}
	}
	for _, e := range fo.engines {
		raw := settingStr(e.own["quantization"])
		want := normMethod(raw)
		if want == "" || want == "none" || want == "null" {
			continue
		}
		if ckpt == nil {
			if slices.Contains(dynamicQuant, want) {
				fo.f.add(Info, CodeQuantDynamic, e.path, "%s quantises to %s at load time (the checkpoint is unquantised)", e.origin, raw)
				continue
			}
			fo.f.add(Blocking, CodeQuantConfigMissing, fo.inModel(quantConfigFile(want)), "%s sets quantization %s but the model has no quantisation config: not in config.json, no quantize_config.json or quant_config.json (the engine refuses to start)", e.origin, raw)
			continue
		}
		if !quantCompatible(want, ckpt.method) {
			fo.f.add(Blocking, CodeQuantMismatch, e.path, "%s sets quantization %s but the checkpoint is %s (%s): the engine refuses to load it", e.origin, raw, ckpt.method, ckpt.path)
		}
	}
	packed, gidx, complete := fo.quantizedTensors()
	switch {
	case ckpt == nil && packed > 0:
		family := "awq"
		if gidx > 0 {
			family = "gptq"
		}
		fo.f.addOnce(Blocking, CodeQuantConfigMissing, fo.inModel(quantConfigFile(family)), "the weights hold %d packed .qweight tensors (AWQ/GPTQ) but there is no quantisation config: not in config.json, no quantize_config.json or quant_config.json", packed)
	case ckpt != nil && (quantFamily(ckpt.method) == "awq" || quantFamily(ckpt.method) == "gptq") && packed == 0 && complete:
		fo.f.add(Blocking, CodeQuantizedWeightMissing, ckpt.path, "quantisation is %s but no shard holds packed .qweight tensors: these are unquantised weights (restored from another copy?)", ckpt.method)
	}
}

func quantConfigFile(method string) string {
	if quantFamily(method) == "awq" {
		return "quant_config.json"
	}
	return "quantize_config.json"
}

func quantCompatible(engine, ckpt string) bool {
	if accepts, ok := multiFormat[engine]; ok {
		return slices.Contains(accepts, quantFamily(ckpt))
	}
	return quantFamily(engine) == quantFamily(ckpt)
}

func (q quantSource) describe() string {
	s := q.method
	if q.bits != 0 {
		s += fmt.Sprintf(" %d-bit", q.bits)
	}
	if q.hasGroup {
		s += fmt.Sprintf(" group %d", q.groupSize)
	}
	return s
}

func (fo *folder) validateQuant(q quantSource) {
	switch {
	case q.method == "":
		fo.f.add(Blocking, CodeQuantConfigInvalid, q.path, "quantization_config has no quant_method")
		return
	case !slices.Contains(knownQuant, q.method):
		fo.f.add(Warning, CodeQuantMethodUnknown, q.path, "quantisation method %q is not one this check knows", q.method)
		return
	}
	switch quantFamily(q.method) {
	case "awq":
		if q.bits != 0 && q.bits != 4 {
			fo.f.add(Blocking, CodeQuantConfigInvalid, q.path, "AWQ with %d bits: engines support 4-bit AWQ only", q.bits)
		}
	case "gptq":
		if q.bits != 0 && !slices.Contains([]int64{2, 3, 4, 8}, q.bits) {
			fo.f.add(Blocking, CodeQuantConfigInvalid, q.path, "GPTQ with %d bits: want 2, 3, 4 or 8", q.bits)
		}
	}
	if q.hasGroup && q.groupSize != -1 && q.groupSize <= 0 {
		fo.f.add(Blocking, CodeQuantConfigInvalid, q.path, "group_size %d: want -1 or a positive size", q.groupSize)
	}
}
