package check

import (
	"maps"
	"path"
	"slices"
)

// loraManifestRefs reads a LoRA manifest file: a list of "name=path" strings
// or {name, path} mappings (optionally under adapters, loras or
// lora_modules), or a mapping of name to path.
func (fo *folder) loraManifestRefs(p string) []loraRef {
	var docs []any
	if d, ok := fo.yamls[p]; ok {
		docs = d
	} else if d, ok := fo.docs[p]; ok {
		docs = []any{d}
	}
	var out []loraRef
	for _, doc := range docs {
		var items []any
		switch x := doc.(type) {
		case []any:
			items = x
		case map[string]any:
			found := false
			for _, key := range []string{"adapters", "loras", "lora_modules", "lora-modules"} {
				if list, ok := x[key].([]any); ok {
					items, found = list, true
					break
				}
			}
			if !found {
				for _, k := range slices.Sorted(maps.Keys(x)) {
					items = append(items, map[string]any{"name": k, "path": x[k]})
				}
			}
		}
		for _, it := range items {
			if r, ok := parseLoRARef(it); ok {
				r.origin = p
				out = append(out, r)
			}
		}
	}
	if len(docs) > 0 && len(out) == 0 {
		fo.f.add(Blocking, CodeLoRAAdapterInvalid, p, "a LoRA manifest naming no adapters (want a list of name=path or {name, path})")
	}
	return out
}

func (fo *folder) checkLoRA() {
	type use struct {
		ref    loraRef
		engine *engineSource
		from   string
	}
	var uses []use
	for _, e := range fo.engines {
		for _, r := range e.loras {
			uses = append(uses, use{r, e, path.Dir(e.path)})
		}
		if len(e.loras) > 0 && e.engine == "vllm" && !truthy(e.settings["enable-lora"]) {
			fo.f.add(Warning, CodeLoRADisabled, e.path, "%s lists LoRA adapters but does not set enable-lora", e.origin)
		}
	}
	for _, p := range fo.paths {
		if fo.files[p].kind == KindLoRAManifest {
			for _, r := range fo.loraManifestRefs(p) {
				uses = append(uses, use{r, nil, path.Dir(p)})
			}
		}
	}
	for _, u := range uses {
		rel, ok, remote := fo.resolve(u.ref.path, u.from)
		switch {
		case remote:
			fo.f.add(Warning, CodeLoRAAdapterRemote, u.ref.origin, "adapter %s is the hub id %s, not a copy in the folder: the region downloads it at start", u.ref.name, u.ref.path)
			continue
		case !ok:
			fo.f.add(Blocking, CodeLoRAAdapterMissing, u.ref.origin, "adapter %s at %s is not in the folder", u.ref.name, u.ref.path)
			continue
		case !fo.adapterDirs[rel]:
			fo.f.add(Blocking, CodeLoRAAdapterInvalid, u.ref.origin, "adapter %s at %s has no adapter_config.json", u.ref.name, rel)
			continue
		}
		if u.engine == nil {
			continue
		}
		r, okR := num(fo.obj(path.Join(rel, "adapter_config.json"))["r"])
		limit, set := num(u.engine.settings["max-lora-rank"])
		if !set && u.engine.engine == "vllm" {
			limit, set = 16, true // vLLM's default
		}
		if okR && set && r > limit {
			fo.f.add(Blocking, CodeLoRARankExceeds, u.engine.path, "%s: adapter %s has rank %d, over max-lora-rank %d: the engine refuses to load it", u.engine.origin, u.ref.name, r, limit)
		}
	}
	dirs := make([]string, 0, len(fo.adapterDirs))
	for d := range fo.adapterDirs {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		cfg := path.Join(d, "adapter_config.json")
		if doc := fo.obj(cfg); doc != nil {
			if _, ok := num(doc["r"]); !ok {
				if _, ok := doc["peft_type"]; !ok {
					fo.f.add(Blocking, CodeLoRAAdapterInvalid, cfg, "neither r nor peft_type: not a PEFT adapter config")
				}
			}
		}
		if !fo.has(path.Join(d, "adapter_model.safetensors")) && !fo.has(path.Join(d, "adapter_model.bin")) {
			fo.f.add(Blocking, CodeLoRAAdapterMissing, path.Join(d, "adapter_model.safetensors"), "adapter %s has a config but no weights", d)
		}
	}
}
