package check

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Severity ranks a finding. A region restored from a folder with a Blocking
// finding would fail to start or would serve the model wrongly; a Warning is
// a risk or a drift from intent that still starts; Info is noted only.
type Severity int

const (
	Info Severity = iota
	Warning
	Blocking
)

func (s Severity) String() string {
	switch s {
	case Blocking:
		return "blocking"
	case Warning:
		return "warning"
	case Info:
		return "info"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText encodes the severity as its name.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText decodes a severity name.
func (s *Severity) UnmarshalText(b []byte) error {
	switch string(b) {
	case "blocking":
		*s = Blocking
	case "warning":
		*s = Warning
	case "info":
		*s = Info
	default:
		return fmt.Errorf("unknown severity %q", b)
	}
	return nil
}

// Code is the stable identifier of a kind of finding. Codes never change
// meaning; scripts and alerts may match on them. docs/dr.md lists them all.
type Code string

// Presence, parsing and the manifest.
const (
	CodeFileMissing      Code = "file_missing"
	CodeFileUnreadable   Code = "file_unreadable"
	CodeDanglingSymlink  Code = "dangling_symlink"
	CodeSymlinkedDir     Code = "symlinked_dir_skipped"
	CodeJSONInvalid      Code = "json_invalid"
	CodeYAMLInvalid      Code = "yaml_invalid"
	CodeYAMLTemplated    Code = "yaml_templated"
	CodeFileTooLarge     Code = "file_too_large_to_parse"
	CodeSizeMismatch     Code = "size_mismatch"
	CodeChecksumMismatch Code = "checksum_mismatch"
	CodeChecksumMissing  Code = "checksum_missing"
	CodeChecksumsSkipped Code = "checksums_skipped"
	CodeFileUnlisted     Code = "file_unlisted"
	CodeModelDirDetected Code = "model_dir_detected"
)

// Weights.
const (
	CodeWeightsMissing           Code = "weights_missing"
	CodeWeightsIndexMissing      Code = "weights_index_missing"
	CodeWeightsIndexInvalid      Code = "weights_index_invalid"
	CodeWeightsNotSafetensors    Code = "weights_not_safetensors"
	CodeWeightsTotalSizeMismatch Code = "weights_total_size_mismatch"
	CodeShardMissing             Code = "shard_missing"
	CodeShardHeaderInvalid       Code = "shard_header_invalid"
	CodeShardTruncated           Code = "shard_truncated"
	CodeShardSizeMismatch        Code = "shard_size_mismatch"
	CodeShardUnreferenced        Code = "shard_unreferenced"
	CodeTensorMissing            Code = "tensor_missing"
	CodeEmbeddingVocabMismatch   Code = "embedding_vocab_mismatch"
)

// Tokenizer.
const (
	CodeTokenizerMissing        Code = "tokenizer_missing"
	CodeTokenizerInvalid        Code = "tokenizer_invalid"
	CodeTokenizerConfigMissing  Code = "tokenizer_config_missing"
	CodeTokenizerClassMismatch  Code = "tokenizer_class_mismatch"
	CodeTokenizerClassUnknown   Code = "tokenizer_class_unknown"
	CodeTokenizerConversion     Code = "tokenizer_conversion"
	CodeSpecialTokensMissing    Code = "special_tokens_missing"
	CodeSpecialTokenUnknown     Code = "special_token_unknown"
	CodeChatTemplateMissing     Code = "chat_template_missing"
	CodeChatTemplateAbsent      Code = "chat_template_absent"
	CodeVocabMismatch           Code = "vocab_mismatch"
	CodeVocabUndersized         Code = "vocab_undersized"
	CodeRemoteCodeMissing       Code = "remote_code_missing"
	CodeGenerationTokenRange    Code = "generation_token_out_of_range"
	CodeGenerationConfigMissing Code = "generation_config_missing"
)

// Model configuration.
const (
	CodeConfigMissing          Code = "config_missing"
	CodeConfigFieldMissing     Code = "config_field_missing"
	CodeRopeScalingInvalid     Code = "rope_scaling_invalid"
	CodeRopeScalingUnknown     Code = "rope_scaling_unknown"
	CodeAttentionConfigInvalid Code = "attention_config_invalid"
)

// Quantisation.
const (
	CodeQuantConfigMissing     Code = "quantization_config_missing"
	CodeQuantConfigInvalid     Code = "quantization_config_invalid"
	CodeQuantConfigConflict    Code = "quantization_config_conflict"
	CodeQuantMismatch          Code = "quantization_mismatch"
	CodeQuantMethodUnknown     Code = "quantization_method_unknown"
	CodeQuantDynamic           Code = "quantization_dynamic"
	CodeQuantizedWeightMissing Code = "quantized_weights_missing"
)

// Engine configuration and LoRA adapters.
const (
	CodeEngineConfigMissing  Code = "engine_config_missing"
	CodeEngineConfigInvalid  Code = "engine_config_invalid"
	CodeEngineConfigConflict Code = "engine_config_conflict"
	CodeMaxModelLenExceeds   Code = "max_model_len_exceeds"
	CodeTensorParallel       Code = "tensor_parallel_mismatch"
	CodeLoRAManifestMissing  Code = "lora_manifest_missing"
	CodeLoRAAdapterMissing   Code = "lora_adapter_missing"
	CodeLoRAAdapterInvalid   Code = "lora_adapter_invalid"
	CodeLoRAAdapterRemote    Code = "lora_adapter_remote"
	CodeLoRARankExceeds      Code = "lora_rank_exceeds"
	CodeLoRADisabled         Code = "lora_disabled"
)

// Deployment files.
const (
	CodeDeploymentMissing     Code = "deployment_manifest_missing"
	CodeDeploymentInvalid     Code = "deployment_manifest_invalid"
	CodeDockerfileMissing     Code = "dockerfile_missing"
	CodeDockerfileInvalid     Code = "dockerfile_invalid"
	CodeDependencyLockMissing Code = "dependency_lock_missing"
	CodeDependencyUnpinned    Code = "dependency_unpinned"
	CodeImageUnpinned         Code = "image_unpinned"
)

// Region comparison.
const (
	CodeRegionFileMissing Code = "region_file_missing"
	CodeRegionFileDiffers Code = "region_file_differs"
)

// Finding is one result of a check.
type Finding struct {
	Severity Severity `json:"severity"`
	Code     Code     `json:"code"`
	// Region is the region whose copy the finding is about; empty for a
	// single-folder check and for cross-region findings.
	Region string `json:"region,omitempty"`
	// Path is the file, slash-separated and relative to the folder checked.
	// For a missing file it is the name the region needs.
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (f Finding) String() string {
	loc := f.Path
	if f.Region != "" {
		loc = f.Region + ":" + f.Path
	}
	return fmt.Sprintf("%s %s %s: %s", f.Severity, f.Code, loc, f.Message)
}

// compareFindings orders by severity (blocking first), region, path, code,
// message: the order of both reports.
func compareFindings(a, b Finding) int {
	return cmp.Or(
		cmp.Compare(b.Severity, a.Severity),
		strings.Compare(a.Region, b.Region),
		strings.Compare(a.Path, b.Path),
		strings.Compare(string(a.Code), string(b.Code)),
		strings.Compare(a.Message, b.Message),
	)
}

// findings collects the findings of one folder, dropping exact repeats.
type findings struct {
	region string
	list   []Finding
	seen   map[[3]string]bool
}

func (fs *findings) add(sev Severity, code Code, path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	key := [3]string{string(code), path, msg}
	if fs.seen == nil {
		fs.seen = make(map[[3]string]bool)
	}
	if fs.seen[key] {
		return
	}
	fs.seen[key] = true
	fs.list = append(fs.list, Finding{Severity: sev, Code: code, Region: fs.region, Path: path, Message: msg})
}

// addOnce adds the finding unless one with the same code and path exists:
// for a second route to the same problem (the manifest and the index both
// missing a shard), the first, more specific, message stands.
func (fs *findings) addOnce(sev Severity, code Code, path, format string, args ...any) {
	if fs.hasAt(path, code) {
		return
	}
	fs.add(sev, code, path, format, args...)
}

func (fs *findings) hasAt(path string, codes ...Code) bool {
	return slices.ContainsFunc(fs.list, func(f Finding) bool { return f.Path == path && slices.Contains(codes, f.Code) })
}
