package check

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

const (
	indexName   = "model.safetensors.index.json"
	ptIndexName = "pytorch_model.bin.index.json"
	singleName  = "model.safetensors"
)

// modelShards returns the safetensors files directly in the model directory.
func (fo *folder) modelShards() []*file {
	var out []*file
	for _, p := range fo.paths {
		f := fo.files[p]
		if f.isSafetensors() && path.Dir(p) == fo.modelDir && f.kind == KindWeights {
			out = append(out, f)
		}
	}
	return out
}

func (fo *folder) checkWeights() {
	idx := fo.inModel(indexName)
	shards := fo.modelShards()
	switch {
	case fo.has(idx):
		fo.checkIndex(idx, true)
	case fo.has(fo.inModel(ptIndexName)):
		fo.checkIndex(fo.inModel(ptIndexName), false)
	case fo.has(fo.inModel(singleName)):
	case len(shards) > 1:
		fo.f.add(Warning, CodeWeightsIndexMissing, idx, "%d safetensors shards but no %s: loaders that need the index (transformers) will not load them", len(shards), indexName)
	case len(shards) == 1:
	default:
		var bins int
		for _, p := range fo.paths {
			if f := fo.files[p]; f.kind == KindWeights && path.Dir(p) == fo.modelDir {
				bins++
			}
		}
		if bins > 0 {
			fo.f.add(Info, CodeWeightsNotSafetensors, fo.inModel("pytorch_model.bin"), "weights are not safetensors: their integrity is checked by checksum only")
		} else {
			fo.f.add(Blocking, CodeWeightsMissing, fo.inModel(singleName), "no weights: neither %s nor %s nor any shard", singleName, indexName)
		}
	}
	fo.checkEmbeddings(shards)
}

// checkIndex checks that every shard the index names is present, holds the
// tensors the index places in it and that the index's total size adds up.
func (fo *folder) checkIndex(idx string, safetensors bool) {
	doc := fo.obj(idx)
	if doc == nil {
		if _, parsed := fo.docs[idx]; parsed {
			fo.f.add(Blocking, CodeWeightsIndexInvalid, idx, "not a JSON object")
		}
		return
	}
	wm, ok := doc["weight_map"].(map[string]any)
	if !ok || len(wm) == 0 {
		fo.f.add(Blocking, CodeWeightsIndexInvalid, idx, "no weight_map (tensor name -> shard file)")
		return
	}
	byShard := make(map[string][]string)
	for tensor, v := range wm {
		s, ok := str(v)
		if !ok || s == "" || checkRelPath(s) != nil {
			fo.f.add(Blocking, CodeWeightsIndexInvalid, idx, "weight_map[%q] = %v is not a shard file name in this directory", tensor, v)
			return
		}
		byShard[s] = append(byShard[s], tensor)
	}
	allRead := true
	var dataLen uint64
	for _, name := range slices.Sorted(maps.Keys(byShard)) {
		tensors := byShard[name]
		slices.Sort(tensors)
		p := fo.inModel(name)
		f := fo.files[p]
		if f == nil {
			fo.f.add(Blocking, CodeShardMissing, p, "%s places %s in this shard but it is not in the folder", path.Base(idx), plural(len(tensors), "tensor"))
			allRead = false
			continue
		}
		if !safetensors {
			continue
		}
		if f.hdr == nil {
			allRead = false
			continue
		}
		dataLen += f.hdr.DataLen
		have := make(map[string]bool, len(f.hdr.Tensors))
		for _, t := range f.hdr.Tensors {
			have[t.Name] = true
		}
		var lack []string
		for _, t := range tensors {
			if !have[t] {
				lack = append(lack, t)
			}
		}
		if len(lack) > 0 {
			fo.f.add(Blocking, CodeTensorMissing, p, "%s places %s in this shard that its header lacks: %s", path.Base(idx), plural(len(lack), "tensor"), sample(lack, 3))
		}
	}
	if !safetensors {
		return
	}
	for _, f := range fo.modelShards() {
		if _, ok := byShard[path.Base(f.rel)]; !ok {
			fo.f.add(Info, CodeShardUnreferenced, f.rel, "not named in %s: engines using the index ignore it", path.Base(idx))
		}
	}
	if md, ok := doc["metadata"].(map[string]any); ok && allRead {
		if total, ok := num(md["total_size"]); ok && total > 0 && uint64(total) != dataLen {
			fo.f.add(Warning, CodeWeightsTotalSizeMismatch, idx, "metadata.total_size %d, but the shards' headers describe %d bytes of tensors", total, dataLen)
		}
	}
}

// sample renders up to n names and how many more there are.
func sample(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// isEmbedding reports whether a tensor holds one row per vocabulary entry.
func isEmbedding(name string) bool {
	return strings.HasSuffix(name, "embed_tokens.weight") || strings.HasSuffix(name, "wte.weight") ||
		strings.HasSuffix(name, "lm_head.weight") || strings.HasSuffix(name, "word_embeddings.weight")
}

// checkEmbeddings compares the rows of the embedding and output tensors
// with config.json's vocab_size.
func (fo *folder) checkEmbeddings(shards []*file) {
	v := fo.model.vocabSize
	if v == 0 {
		return
	}
	for _, f := range shards {
		if f.hdr == nil {
			continue
		}
		for _, t := range f.hdr.Tensors {
			if !isEmbedding(t.Name) || len(t.Shape) != 2 {
				continue
			}
			if int64(t.Shape[0]) != v {
				fo.f.add(Blocking, CodeEmbeddingVocabMismatch, f.rel, "tensor %s has %d rows but config.json vocab_size is %d: weights and config are from different models", t.Name, t.Shape[0], v)
			}
		}
	}
}

// quantizedTensors counts packed-weight tensors (AWQ/GPTQ .qweight) and
// GPTQ's .g_idx tensors in the model's shards and reports whether every
// shard's header was read.
func (fo *folder) quantizedTensors() (n, gidx int, complete bool) {
	complete = true
	shards := fo.modelShards()
	if len(shards) == 0 {
		return 0, 0, false
	}
	for _, f := range shards {
		if f.hdr == nil {
			complete = false
			continue
		}
		for _, t := range f.hdr.Tensors {
			switch {
			case strings.HasSuffix(t.Name, ".qweight"):
				n++
			case strings.HasSuffix(t.Name, ".g_idx"):
				gidx++
			}
		}
	}
	return n, gidx, complete
}
