package check

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
)

// engineSource is one place the serving engine is configured: a vLLM or
// SGLang config file, or the command line of a Kubernetes container.
type engineSource struct {
	path   string // the file
	origin string // the file, plus the container for Kubernetes
	engine string // "vllm" or "sglang"
	// own holds the settings this source gives itself, by canonical key
	// (see canonicalKey); checks report on these. settings adds, for a
	// container started with --config FILE, the settings of FILE.
	own, settings map[string]any
	// chatTemplate is the chat-template setting, if any.
	chatTemplate string
	loras        []loraRef
}

// loraRef is one adapter an engine is told to load.
type loraRef struct {
	name, path string
	origin     string
}

// canonicalKey maps vLLM and SGLang option names (with dashes or
// underscores) onto one spelling.
func canonicalKey(k string) string {
	k = strings.ReplaceAll(strings.ToLower(strings.TrimLeft(k, "-")), "_", "-")
	switch k {
	case "tp", "tp-size":
		return "tensor-parallel-size"
	case "context-length":
		return "max-model-len"
	case "model-path":
		return "model"
	case "lora-paths":
		return "lora-modules"
	}
	return k
}

func engineFromName(p string) string {
	l := strings.ToLower(p)
	switch {
	case strings.Contains(l, "sglang"):
		return "sglang"
	case strings.Contains(l, "vllm"):
		return "vllm"
	}
	return ""
}

func (fo *folder) loadEngines() []*engineSource {
	var out []*engineSource
	for _, p := range fo.paths {
		f := fo.files[p]
		switch f.kind {
		case KindEngineConfig:
			var doc any
			if d, ok := fo.yamls[p]; ok && len(d) > 0 {
				doc = d[0]
			} else if d, ok := fo.docs[p]; ok {
				doc = d
			} else {
				continue // unparseable: already reported
			}
			m, ok := doc.(map[string]any)
			if !ok {
				fo.f.add(Blocking, CodeEngineConfigInvalid, p, "not a mapping of option: value")
				continue
			}
			e := &engineSource{path: p, origin: p, engine: engineFromName(p), own: map[string]any{}}
			if fo.man != nil && fo.man.Engine != "" {
				e.engine = fo.man.Engine
			}
			if e.engine == "" {
				e.engine = "vllm"
			}
			for k, v := range m {
				e.own[canonicalKey(k)] = v
			}
			e.settings = e.own
			fo.finishEngine(e)
			out = append(out, e)
		}
	}
	// Containers come after the config files they may load with --config.
	for _, p := range fo.paths {
		if fo.files[p].kind == KindDeployment {
			out = append(out, fo.kubernetesEngines(p, out)...)
		}
	}
	return out
}

// finishEngine extracts the chat template and LoRA adapters from settings.
func (fo *folder) finishEngine(e *engineSource) {
	if s, ok := str(e.own["chat-template"]); ok {
		e.chatTemplate = s
	}
	var items []any
	switch v := e.own["lora-modules"].(type) {
	case []any:
		items = v
	case string:
		items = []any{v}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			items = append(items, map[string]any{"name": k, "path": v[k]})
		}
	}
	for _, it := range items {
		if r, ok := parseLoRARef(it); ok {
			r.origin = e.origin
			e.loras = append(e.loras, r)
		}
	}
}

// parseLoRARef accepts "name=path", a JSON object string, a bare path or a
// {name, path} mapping (vLLM --lora-modules, SGLang --lora-paths).
func parseLoRARef(v any) (loraRef, bool) {
	switch x := v.(type) {
	case string:
		x = strings.TrimSpace(x)
		if strings.HasPrefix(x, "{") {
			var m map[string]any
			if json.Unmarshal([]byte(x), &m) == nil {
				return parseLoRARef(m)
			}
		}
		if name, p, ok := strings.Cut(x, "="); ok {
			return loraRef{name: name, path: p}, p != ""
		}
		return loraRef{name: path.Base(x), path: x}, x != ""
	case map[string]any:
		p, _ := str(x["path"])
		if p == "" {
			p, _ = str(x["lora_path"])
		}
		name, _ := str(x["name"])
		if name == "" {
			name, _ = str(x["lora_name"])
		}
		return loraRef{name: name, path: p}, p != ""
	}
	return loraRef{}, false
}

// kubernetesEngines finds containers that run vLLM or SGLang in a
// Kubernetes YAML and parses their command lines; a --config naming one of
// files (an engine config in the folder) supplies the settings the command
// line does not override.
func (fo *folder) kubernetesEngines(p string, files []*engineSource) []*engineSource {
	var out []*engineSource
	for _, doc := range fo.yamls[p] {
		walkContainers(doc, func(c map[string]any) {
			var words []string
			for _, key := range []string{"command", "args"} {
				if list, ok := c[key].([]any); ok {
					for _, w := range list {
						if s, ok := w.(string); ok {
							words = append(words, strings.Fields(s)...)
						}
					}
				}
			}
			engine, rest := findEngine(words)
			if engine == "" {
				return
			}
			name, _ := str(c["name"])
			e := &engineSource{path: p, origin: fmt.Sprintf("%s container %s", p, name), engine: engine, own: parseFlags(rest)}
			e.settings = e.own
			if cfg, ok := str(e.own["config"]); ok {
				if rel, ok, _ := fo.resolve(cfg, path.Dir(p)); ok {
					for _, f := range files {
						if f.path == rel {
							e.settings = maps.Clone(f.own)
							maps.Copy(e.settings, e.own)
						}
					}
				}
			}
			fo.finishEngine(e)
			out = append(out, e)
		})
	}
	return out
}

// walkContainers calls fn for every container and init container mapping.
func walkContainers(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		for _, key := range slices.Sorted(maps.Keys(x)) {
			if key == "containers" || key == "initContainers" {
				if list, ok := x[key].([]any); ok {
					for _, c := range list {
						if m, ok := c.(map[string]any); ok {
							fn(m)
						}
					}
				}
				continue
			}
			walkContainers(x[key], fn)
		}
	case []any:
		for _, e := range x {
			walkContainers(e, fn)
		}
	}
}

// findEngine locates "vllm serve", the vLLM API server module or SGLang's
// launch_server in a command line and returns the words after it.
func findEngine(words []string) (string, []string) {
	for i, w := range words {
		switch {
		case strings.Contains(w, "sglang.launch_server") || path.Base(w) == "sglang":
			return "sglang", words[i+1:]
		case strings.Contains(w, "vllm.entrypoints"):
			return "vllm", words[i+1:]
		case path.Base(w) == "vllm":
			rest := words[i+1:]
			if len(rest) > 0 && rest[0] == "serve" {
				rest = rest[1:]
			}
			return "vllm", rest
		}
	}
	return "", nil
}

var multiValue = map[string]bool{"lora-modules": true}

// parseFlags reads --key=value, --key value and --flag words; the first
// bare word is the model.
func parseFlags(words []string) map[string]any {
	out := map[string]any{}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			if _, ok := out["model"]; !ok {
				out["model"] = w
			}
			continue
		}
		k, v, hasValue := strings.Cut(w, "=")
		k = canonicalKey(k)
		if hasValue {
			out[k] = v
			continue
		}
		if multiValue[k] {
			var vals []any
			for i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
				i++
				vals = append(vals, words[i])
			}
			out[k] = vals
			continue
		}
		if i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
			i++
			out[k] = words[i]
			continue
		}
		out[k] = true
	}
	return out
}

// pooling reports whether the engine runs an embedding/pooling task (no chat).
func (e *engineSource) pooling() bool {
	for _, k := range []string{"task", "runner", "convert"} {
		if s, ok := str(e.settings[k]); ok {
			switch strings.ToLower(s) {
			case "embed", "embedding", "pooling", "classify", "score", "reward":
				return true
			}
		}
	}
	return truthy(e.settings["is-embedding"])
}

// servesChat reports whether the deployment serves chat completions.
func (fo *folder) servesChat() bool {
	if fo.man != nil && fo.man.ServesChat != nil {
		return *fo.man.ServesChat
	}
	for _, e := range fo.engines {
		if !e.pooling() {
			return true
		}
	}
	return false
}

func (fo *folder) chatOrigin() string {
	if fo.man != nil && fo.man.ServesChat != nil {
		return "manifest serves_chat: true"
	}
	for _, e := range fo.engines {
		if !e.pooling() {
			return e.origin
		}
	}
	return ""
}

// settingStr renders a scalar setting; "" when unset or null.
func settingStr(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(x)
	}
	return ""
}

func (fo *folder) checkEngines() {
	if len(fo.engines) == 0 {
		if !fo.hasListedKind(KindEngineConfig) {
			fo.f.add(Warning, CodeEngineConfigMissing, "", "no engine config (vllm*.yaml, sglang*.yaml, or a Kubernetes container running vLLM or SGLang): the region would serve with whatever defaults the engine has")
		}
		return
	}
	m := fo.model
	limit, limitWhy, hasLimit := m.maxModelLen()
	heads, hasHeads := m.int("num_attention_heads")
	for _, e := range fo.engines {
		if v := settingStr(e.own["max-model-len"]); v != "" && hasLimit {
			n, ok := num(e.own["max-model-len"])
			if !ok {
				fo.f.add(Blocking, CodeEngineConfigInvalid, e.path, "%s: max-model-len %q is not an integer", e.origin, v)
			} else if n > limit {
				fo.f.add(Blocking, CodeMaxModelLenExceeds, e.path, "%s: max-model-len %d exceeds the %d tokens config.json allows (%s): the engine refuses to start", e.origin, n, limit, limitWhy)
			}
		}
		if v := settingStr(e.own["tensor-parallel-size"]); v != "" && hasHeads {
			tp, ok := num(e.own["tensor-parallel-size"])
			if !ok || tp <= 0 {
				fo.f.add(Blocking, CodeEngineConfigInvalid, e.path, "%s: tensor-parallel-size %q is not a positive integer", e.origin, v)
			} else if heads%tp != 0 {
				fo.f.add(Blocking, CodeTensorParallel, e.path, "%s: tensor-parallel-size %d does not divide num_attention_heads %d: the engine refuses to shard the model", e.origin, tp, heads)
			}
		}
		if t := e.chatTemplate; t != "" && !isInlineTemplate(t) {
			if _, ok, _ := fo.resolve(t, path.Dir(e.path)); !ok {
				fo.f.add(Blocking, CodeChatTemplateMissing, e.path, "%s: chat-template %s is not in the folder", e.origin, t)
			}
		}
	}
	fo.checkEngineConflicts()
}

func isInlineTemplate(s string) bool { return strings.Contains(s, "{{") || strings.Contains(s, "{%") }

// checkEngineConflicts warns when two sources configure the same engine
// differently.
func (fo *folder) checkEngineConflicts() {
	for _, key := range []string{"quantization", "max-model-len", "tensor-parallel-size", "chat-template", "dtype", "kv-cache-dtype"} {
		first := map[string]*engineSource{}
		for _, e := range fo.engines {
			v := settingStr(e.own[key])
			if v == "" {
				continue
			}
			prev, ok := first[e.engine]
			if !ok {
				first[e.engine] = e
				continue
			}
			if pv := settingStr(prev.own[key]); pv != v {
				fo.f.add(Warning, CodeEngineConfigConflict, e.path, "%s sets %s %s but %s sets %s: the copies of the engine settings disagree (on a command line, flags override --config)", e.origin, key, v, prev.origin, pv)
			}
		}
	}
}

// hasListedKind reports whether the manifest lists a file of kind k.
func (fo *folder) hasListedKind(k Kind) bool {
	if fo.man == nil {
		return false
	}
	return slices.ContainsFunc(fo.man.Files, func(e Entry) bool { return e.Kind == k })
}

var hubID = regexp.MustCompile(`^[A-Za-z0-9][\w.-]*/[\w.-]+$`)

// resolve maps a path from an engine config (as the container sees it) onto
// the folder: a relative path is tried from the config's directory and from
// the root; an absolute one by its longest suffix present in the folder.
// remote is true for a Hugging Face hub id that is not in the folder.
func (fo *folder) resolve(p, from string) (rel string, ok, remote bool) {
	exists := func(q string) bool { return fo.has(q) || fo.dirs[q] }
	clean := strings.TrimPrefix(path.Clean(p), "./")
	if !strings.HasPrefix(p, "/") {
		for _, q := range []string{path.Join(from, clean), clean} {
			if checkRelPath(q) == nil && exists(q) {
				return q, true, false
			}
		}
		if hubID.MatchString(p) {
			return "", false, true
		}
		return "", false, false
	}
	parts := strings.Split(strings.Trim(clean, "/"), "/")
	for i := range parts {
		q := strings.Join(parts[i:], "/")
		if q != "" && exists(q) {
			return q, true, false
		}
	}
	return "", false, false
}
