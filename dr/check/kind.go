package check

import (
	"path"
	"strings"
)

// Kind says what role a file plays in serving the model. The manifest records
// it per file; without a manifest the check infers it from the file's name
// and place (see classify).
type Kind string

const (
	KindWeights          Kind = "weights"             // *.safetensors (and legacy *.bin) shards
	KindWeightsIndex     Kind = "weights_index"       // model.safetensors.index.json
	KindTokenizer        Kind = "tokenizer"           // tokenizer.json, tokenizer.model, tiktoken.model, vocab.json, merges.txt
	KindTokenizerConfig  Kind = "tokenizer_config"    // tokenizer_config.json
	KindSpecialTokens    Kind = "special_tokens"      // special_tokens_map.json, added_tokens.json
	KindChatTemplate     Kind = "chat_template"       // chat_template.jinja, chat_template.json
	KindModelConfig      Kind = "model_config"        // config.json
	KindQuantization     Kind = "quantization_config" // quantize_config.json, quant_config.json, hf_quant_config.json
	KindGenerationConfig Kind = "generation_config"   // generation_config.json
	KindRemoteCode       Kind = "remote_code"         // *.py named by auto_map
	KindEngineConfig     Kind = "engine_config"       // vLLM or SGLang serving config
	KindLoRAManifest     Kind = "lora_manifest"       // a list of LoRA adapters to load
	KindLoRAAdapter      Kind = "lora_adapter"        // files of a LoRA adapter directory
	KindDeployment       Kind = "deployment"          // Kubernetes YAML
	KindDockerfile       Kind = "dockerfile"          // Dockerfile, Containerfile
	KindDependencyLock   Kind = "dependency_lock"     // requirements*.txt, *.lock
	KindProcessorConfig  Kind = "processor_config"    // preprocessor_config.json and friends
	KindOther            Kind = "other"
)

var kinds = []Kind{
	KindWeights, KindWeightsIndex, KindTokenizer, KindTokenizerConfig, KindSpecialTokens,
	KindChatTemplate, KindModelConfig, KindQuantization, KindGenerationConfig, KindRemoteCode,
	KindEngineConfig, KindLoRAManifest, KindLoRAAdapter, KindDeployment, KindDockerfile,
	KindDependencyLock, KindProcessorConfig, KindOther,
}

// Valid reports whether k is one of the kinds above.
func (k Kind) Valid() bool {
	for _, x := range kinds {
		if k == x {
			return true
		}
	}
	return false
}

// MissingCode is the finding code used when a file of this kind is missing.
func (k Kind) MissingCode() Code {
	switch k {
	case KindWeights:
		return CodeShardMissing
	case KindWeightsIndex:
		return CodeWeightsIndexMissing
	case KindTokenizer:
		return CodeTokenizerMissing
	case KindTokenizerConfig:
		return CodeTokenizerConfigMissing
	case KindSpecialTokens:
		return CodeSpecialTokensMissing
	case KindChatTemplate:
		return CodeChatTemplateMissing
	case KindModelConfig:
		return CodeConfigMissing
	case KindQuantization:
		return CodeQuantConfigMissing
	case KindGenerationConfig:
		return CodeGenerationConfigMissing
	case KindRemoteCode:
		return CodeRemoteCodeMissing
	case KindEngineConfig:
		return CodeEngineConfigMissing
	case KindLoRAManifest:
		return CodeLoRAManifestMissing
	case KindLoRAAdapter:
		return CodeLoRAAdapterMissing
	case KindDeployment:
		return CodeDeploymentMissing
	case KindDockerfile:
		return CodeDockerfileMissing
	case KindDependencyLock:
		return CodeDependencyLockMissing
	}
	return CodeFileMissing
}

// classify infers the kind of the file at rel (slash path relative to the
// folder). modelDir is the folder-relative model directory ("." for the
// root); adapterDirs holds the directories that contain adapter_config.json.
func classify(rel, modelDir string, adapterDirs map[string]bool) Kind {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	lower := strings.ToLower(base)
	ext := path.Ext(lower)
	for d := dir; ; d = path.Dir(d) {
		if adapterDirs[d] {
			return KindLoRAAdapter
		}
		if d == "." || d == "/" {
			break
		}
	}
	if dir == modelDir {
		switch base {
		case "config.json":
			return KindModelConfig
		case "generation_config.json":
			return KindGenerationConfig
		case "model.safetensors.index.json", "pytorch_model.bin.index.json":
			return KindWeightsIndex
		case "tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json", "merges.txt",
			"vocab.txt", "spiece.model", "sentencepiece.bpe.model", "vocab.model":
			return KindTokenizer
		case "tokenizer_config.json":
			return KindTokenizerConfig
		case "special_tokens_map.json", "added_tokens.json":
			return KindSpecialTokens
		case "chat_template.jinja", "chat_template.json":
			return KindChatTemplate
		case "quantize_config.json", "quant_config.json", "hf_quant_config.json":
			return KindQuantization
		case "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json":
			return KindProcessorConfig
		}
		switch ext {
		case ".safetensors":
			return KindWeights
		case ".bin", ".pt", ".pth":
			if strings.HasPrefix(lower, "pytorch_model") || strings.HasPrefix(lower, "model") {
				return KindWeights
			}
		case ".tiktoken":
			return KindTokenizer
		case ".py":
			return KindRemoteCode
		}
	}
	switch {
	case lower == "dockerfile" || lower == "containerfile" || strings.HasPrefix(lower, "dockerfile.") || ext == ".dockerfile":
		return KindDockerfile
	case isLockName(lower):
		return KindDependencyLock
	case (ext == ".yaml" || ext == ".yml" || ext == ".json") && (strings.Contains(lower, "lora") || strings.Contains(lower, "adapters")):
		return KindLoRAManifest
	case (ext == ".yaml" || ext == ".yml" || ext == ".json") && (strings.Contains(lower, "vllm") || strings.Contains(lower, "sglang")):
		return KindEngineConfig
	case ext == ".safetensors":
		return KindWeights
	}
	return KindOther
}

func isLockName(lower string) bool {
	switch lower {
	case "uv.lock", "poetry.lock", "pipfile.lock", "pdm.lock", "conda-lock.yml", "conda-lock.yaml", "requirements.lock":
		return true
	}
	return (strings.HasPrefix(lower, "requirements") || strings.HasPrefix(lower, "constraints")) &&
		(strings.HasSuffix(lower, ".txt") || strings.HasSuffix(lower, ".lock"))
}
