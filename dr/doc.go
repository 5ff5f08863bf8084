// Package dr is Meridian's disaster-recovery tooling. Its first job is the DR
// manifest check: given a region's copy of a model deployment (a Hugging
// Face style model folder plus engine and deployment files) and optionally
// a DR manifest, say whether that region could serve the model, and name
// every missing, broken or inconsistent file by its path. The seed incident
// it exists for: 32% of LLM DR failures restored the weights but not the
// tokenizer files, the quantisation config or the model and engine config.
// Its second job is the failover drill (Drill, below): fail a region over
// on a running cluster, time how long its traffic takes to move and to come
// back, and prove no request was served outside its residency zone.
//
// The check reads folders only (never writes them) and reads no tensor data
// except to hash. The drill talks to the cluster over HTTP only: the admin
// API through global's client, the controllers' public API as a client
// would. The package imports only its own sub-packages (dr/safetensors;
// dr/drtest in tests), global (the admin API client and its types) and
// residency (to evaluate the policy in force). It must not import regional,
// scenarios or cmd (a root test enforces it; tests may import anything).
//
// # The folder
//
// The model files (config.json, tokenizer, weights) sit at the top of the
// folder, or in the manifest's model_dir, or in the one sub-directory that
// holds config.json next to a tokenizer or weights. Engine and deployment
// files may be anywhere below. Hidden files and directories are skipped;
// file symlinks are followed (a dangling one is a finding), directory
// symlinks are not. Files are recognised by name (see Kind and classify):
//
//	weights            *.safetensors, model.safetensors.index.json (or the .bin equivalents)
//	tokenizer          tokenizer.json, tokenizer.model, tiktoken.model, *.tiktoken, vocab.json + merges.txt, vocab.txt
//	tokenizer config   tokenizer_config.json (class, special tokens, chat template), special_tokens_map.json,
//	                   chat_template.jinja / chat_template.json
//	model config       config.json (architecture, vocab_size, RoPE scaling, attention, auto_map)
//	quantisation       quantization_config in config.json, quantize_config.json, quant_config.json, hf_quant_config.json
//	generation         generation_config.json
//	remote code        the *.py modules config.json's or tokenizer_config.json's auto_map names
//	engine config      *vllm*.yaml|yml|json, *sglang*.yaml|yml|json (options as on the command line, - or _),
//	                   and containers of Kubernetes manifests that run vllm serve, vllm.entrypoints or
//	                   sglang.launch_server (their flags; --config FILE merges FILE's options)
//	LoRA               directories holding adapter_config.json; *lora*/*adapters* YAML/JSON manifests
//	                   (a list of name=path or {name, path}); the engine's lora-modules / lora-paths
//	deployment         YAML with apiVersion or kind (Kubernetes), Dockerfile / Containerfile,
//	                   requirements*.txt, constraints*.txt, uv.lock, poetry.lock, Pipfile.lock, pdm.lock
//
// # The manifest
//
// A DR manifest is YAML, kept in git next to the deployment, written by
// `meridian dr manifest init DIR` from a healthy folder:
//
//	version: 1                      # required; this package reads version 1
//	model: meridian/tiny-llama-dr   # for people; default config.json _name_or_path
//	model_dir: model                # optional; folder-relative directory of config.json etc. (default ".")
//	engine: vllm                    # optional; vllm | sglang (default: from the engine config's file name)
//	serves_chat: true               # optional; whether the engine serves chat completions, so needs a
//	                                # chat template (default: true when an engine config exists and does
//	                                # not run a pooling/embedding task)
//	files:                          # every file the region needs
//	  - path: config.json           # slash-separated, relative to the folder, clean, inside it, unique
//	    kind: model_config          # one of the Kind values (weights, weights_index, tokenizer, ...)
//	    size: 731                   # optional; bytes
//	    sha256: 5f0c...             # optional; 64 lowercase hex digits
//	    optional: false             # optional; a missing optional file is a warning, not blocking
//
// Unknown keys, unknown kinds, bad paths, duplicate paths and malformed
// digests are rejected with a *ManifestError naming the file, line, field and
// value. With a manifest, the check also reports every listed file missing
// (blocking; the code is the kind's, e.g. tokenizer_missing, shard_missing),
// every size that differs (size_mismatch), every recorded sha256 that differs
// (checksum_mismatch), and every file present but unlisted (file_unlisted,
// info). All other checks run with or without a manifest: a manifest that
// forgot the tokenizer does not make a folder without one healthy.
//
// # The checks
//
// Presence and parsing: config.json, weights and a tokenizer must exist;
// every JSON and YAML file must parse (json_invalid, yaml_invalid: blocking
// for files with a role, a warning otherwise).
//
// Weights: every safetensors file's header is read (8-byte little-endian
// length N, then N bytes of JSON; see dr/safetensors) and validated, and the
// file size must equal 8 + N + the end of the last tensor (shard_truncated,
// shard_size_mismatch, shard_header_invalid). Every shard the index names
// must exist (shard_missing) and hold the tensors the index places in it
// (tensor_missing); metadata.total_size must match the headers
// (weights_total_size_mismatch); the embedding and lm_head rows must equal
// vocab_size (embedding_vocab_mismatch).
//
// Tokenizer: tokenizer.json (BPE/WordPiece/WordLevel vocab objects, Unigram
// lists, added_tokens), SentencePiece models (protobuf pieces) and tiktoken
// files (base64 rank lines) are parsed for their vocabulary size; together
// with tokenizer_config.json's added_tokens_decoder it must not exceed
// config.json's vocab_size (vocab_mismatch), and under 90% of it is suspect
// (vocab_undersized). The tokenizer class must have the files it loads
// (tokenizer_class_mismatch: PreTrainedTokenizerFast needs tokenizer.json,
// TikTokenTokenizer a tiktoken file, LlamaTokenizer tokenizer.model or
// tokenizer.json, ...). Special tokens must be in the vocabulary
// (special_token_unknown). When the engine serves chat, a chat template must
// come from tokenizer_config.json, chat_template.jinja/json or the engine's
// chat-template (chat_template_missing). Modules named by auto_map must be
// present (remote_code_missing).
//
// Model config: architectures or model_type; RoPE scaling with the keys its
// type needs (rope_scaling_invalid); attention heads divisible by KV heads
// and hidden size by heads (attention_config_invalid); generation_config.json
// token ids inside the vocabulary.
//
// Quantisation: the checkpoint's method (config.json first, as vLLM reads
// it) against the engine's quantization option (quantization_mismatch;
// awq_marlin runs AWQ, gptq_marlin GPTQ, moe_wna16 both); an engine method
// that needs a checkpoint config with none present
// (quantization_config_missing; fp8, bitsandbytes and other load-time methods
// need none); packed .qweight tensors without a config, or an AWQ/GPTQ config
// over unpacked weights (quantized_weights_missing); bits and group size.
//
// Engine: max-model-len within what config.json allows (max_position_embeddings,
// times the factor of linear/dynamic/yarn RoPE scaling: max_model_len_exceeds);
// tensor-parallel-size dividing the attention heads (tensor_parallel_mismatch);
// LoRA adapters present (lora_adapter_missing), with weights and a config
// (lora_adapter_invalid), within max-lora-rank (lora_rank_exceeds, vLLM's
// default 16), enable-lora set (lora_disabled), not hub ids fetched at start
// (lora_adapter_remote); two sources setting one option differently
// (engine_config_conflict).
//
// Deployment: Kubernetes documents have apiVersion and kind; images and
// Dockerfile bases carry a tag other than latest or a digest
// (image_unpinned); requirements pin with == (dependency_unpinned); a missing
// Kubernetes manifest, Dockerfile or lock is a warning.
//
// Regions: with two or more copies (Request.Sources, `--compare
// us-east-1=DIR eu-west-1=DIR`), each copy is checked, then every path
// present in some copy but not all is named (region_file_missing) and every
// file whose copies differ in size, sha256 or safetensors header
// (region_file_differs); blocking unless the file has no known role.
//
// # Severity and codes
//
// Blocking: a region restored from the folder would fail to start or serve
// wrongly; the CLI exits 1. Warning: it starts, but differs from intent or
// depends on luck. Info: noted. A Finding carries severity, code, region,
// path and message. Codes are stable strings (the Code constants; a test
// keeps this list complete). B = blocking, W = warning, I = info; B/W means
// blocking for a file with a role, a warning otherwise.
//
//	file_missing                   B   a listed file of kind other is missing (listed files of other kinds use their kind's code)
//	file_unreadable                B   a file cannot be opened, read or hashed
//	dangling_symlink               B   a symlink whose target is missing
//	symlinked_dir_skipped          I   a symlink to a directory, not followed
//	json_invalid, yaml_invalid     B/W the file does not parse (with line and column)
//	yaml_templated                 I   a Helm-style template, not checked
//	file_too_large_to_parse        W   over Config.MaxParseBytes, contents not checked
//	size_mismatch                  B   size differs from the manifest
//	checksum_mismatch              B   sha256 differs from the manifest
//	checksum_missing               I   (checksums always) the manifest records no sha256 for the file
//	checksums_skipped              I   (checksums never) the manifest's checksums were not verified
//	file_unlisted                  I   present but not in the manifest
//	model_dir_detected             I   the model was found in a sub-directory
//	weights_missing                B   no weights at all
//	weights_index_missing          W   several shards, no index (B when listed)
//	weights_index_invalid          B   the index has no usable weight_map
//	weights_not_safetensors        I   .bin weights: checked by checksum only
//	weights_total_size_mismatch    W   index metadata.total_size differs from the headers
//	shard_missing                  B   a shard the index names is absent
//	shard_header_invalid           B/W a safetensors header that does not validate
//	shard_truncated                B   shorter than its header says
//	shard_size_mismatch            B   longer than its header says
//	shard_unreferenced             I   a shard the index does not name
//	tensor_missing                 B   the index places tensors in a shard whose header lacks them
//	embedding_vocab_mismatch       B   embedding/lm_head rows differ from vocab_size
//	tokenizer_missing              B   no tokenizer file
//	tokenizer_invalid              B   a tokenizer file that does not parse as its format
//	tokenizer_config_missing       W   no tokenizer_config.json (B when listed)
//	tokenizer_class_mismatch       B   the tokenizer class lacks the files it loads
//	tokenizer_class_unknown        I   a class this check does not know, without tokenizer.json
//	tokenizer_conversion           W   a fast tokenizer converted from slow files at every start
//	special_tokens_missing         B   a listed special_tokens_map.json / added_tokens.json is missing
//	special_token_unknown          W   a special token not in the vocabulary
//	chat_template_missing          B   the engine serves chat and no chat template exists
//	chat_template_absent           I   no chat template, and no chat is served
//	vocab_mismatch                 B   the tokenizer has more tokens than vocab_size
//	vocab_undersized               W   the tokenizer has under 90% of vocab_size
//	remote_code_missing            B   a module auto_map names is absent
//	generation_token_out_of_range  W   a generation_config.json token id outside the vocabulary
//	generation_config_missing      W   no generation_config.json (B when listed)
//	config_missing                 B   no config.json
//	config_field_missing           B/W no architectures/model_type (B); no vocab_size (W)
//	rope_scaling_invalid           B   RoPE scaling lacks its keys or has factor < 1
//	rope_scaling_unknown           W   a RoPE type this check does not know
//	attention_config_invalid       B   heads not divisible by KV heads, hidden size by heads
//	quantization_config_missing    B   the engine or the packed weights need a quantisation config
//	quantization_config_invalid    B   no quant_method; bits or group size engines reject
//	quantization_config_conflict   W   two quantisation configs disagree
//	quantization_mismatch          B   the engine's quantization is not the checkpoint's
//	quantization_method_unknown    W   a method this check does not know
//	quantization_dynamic           I   the engine quantises at load time
//	quantized_weights_missing      B   an AWQ/GPTQ config over unpacked weights
//	engine_config_missing          W   no engine config found (B when listed)
//	engine_config_invalid          B   not a mapping, or a non-integer max-model-len / tensor-parallel-size
//	engine_config_conflict         W   two engine sources set one option differently
//	max_model_len_exceeds          B   max-model-len over what config.json allows
//	tensor_parallel_mismatch       B   tensor-parallel-size does not divide the attention heads
//	lora_manifest_missing          B   a listed LoRA manifest is missing
//	lora_adapter_missing           B   an adapter (or its weights) is not in the folder
//	lora_adapter_invalid           B   an adapter without a usable adapter_config.json
//	lora_adapter_remote            W   an adapter given as a hub id, fetched at start
//	lora_rank_exceeds              B   an adapter's rank over max-lora-rank
//	lora_disabled                  W   adapters listed without enable-lora
//	deployment_manifest_missing    W   no Kubernetes manifest (B when listed)
//	deployment_manifest_invalid    B   a Kubernetes document without apiVersion or kind
//	dockerfile_missing             W   no Dockerfile (B when listed)
//	dockerfile_invalid             B   no FROM, or FROM without an image
//	dependency_lock_missing        W   no dependency lock (B when listed)
//	dependency_unpinned            W   requirements without an exact == pin
//	image_unpinned                 W   an image without a tag other than latest, or a digest
//	region_file_missing            B/W a file present in some regions' copies but not all
//	region_file_differs            B/W copies differ in size, sha256 or safetensors header
//
// # The failover drill
//
// A rehearsed us-east-1 failover took 22 minutes against a 30-minute SLA
// (the seed); `meridian dr drill` makes it a checked, timed, routine thing.
// Drill(ctx, DrillConfig) runs against a running cluster, given the admin
// API URL and token, every region's controller URL, and the region to fail:
//
//  1. It reads the residency policy in force (GET /v1/global/policy, parsed
//     with residency.Parse) and the region states; the region must be
//     active (ErrRegionNotActive otherwise).
//  2. Probes start and run until the end: each probe (origin x tenant x
//     data class; by default, for every region, DrillTenant public and pii
//     and eu-health phi, plus the operator's) sends a chat completion to
//     its origin's controller every Interval, one in flight at a time, and
//     reads where it was served (X-Meridian-Region) or why not (the error
//     code). BaselineRounds answers of each make the baseline; a baseline
//     with an error or a violation stops the drill before any change
//     (ErrBaseline).
//  3. Trigger: POST /v1/global/failover/trigger (failed, or draining with
//     Drain). The move is timed from the call returning.
//  4. Once every affected probe has been served as the policy allows
//     without the region for Hold (or MovedTimeout passed), recover: POST
//     /v1/global/failover/recover. The return is timed from that call
//     returning; the drill ends once every affected probe has been served
//     as in the baseline for Hold (or BackTimeout passed).
//
// What the policy allows: for each probe, residency.Evaluate on its tenant,
// data class and origin gives the allowed regions. Before and after, an
// answer is expected as in the baseline; while the region is out, a 200 in
// an allowed region other than it, or 503 residency_no_healthy_region when
// it was the only one (the EU health tenant's PHI when eu-west-1 is out),
// or 451 residency_denied when the policy allows nothing. A probe is
// affected when a baseline answer is not allowed while the region is out;
// only affected probes time the move and the return. Each answer is
// classed by when it completed (before the trigger was sent, until the
// recovery was sent, after): ok (the phase's expectation), stale (the
// previous phase's: not moved yet, not back yet), other (served in an
// allowed region, neither), error (refused or failed otherwise, transport
// errors, timeouts), violation (served in a region the policy forbids).
// A probe has moved (is back) from the first ok answer after its last
// answer of the phase that was not ok, so a flapping region is timed to
// its last settling, not its first.
//
// Pass: moved within TargetMoved (default 5 s), back within TargetBack
// (default 10 s), no residency violation, at least one probe affected, the
// region recovered, and, when MaxErrors >= 0, at most that many errors
// (errors are always counted; by default they are not judged, a transient
// refusal during the switch being a fact to report, not a verdict). The
// judge is a single-threaded state machine fed with results and the call
// times (no clock of its own), tested with scripts in testdata/drill; the
// probe goroutines and the coordinator loop are the outer layer.
//
// Safety: once the trigger was sent the region is recovered whatever
// happens, a cancelled ctx included (admin calls run on their own
// AdminTimeout); a failed recovery returns ErrNotRecovered, which says to
// run `meridian failover recover`. A policy applied during the drill is
// noted in the report (violations are judged against the policy read at
// the start).
//
// The DrillReport has the timeline (start, baseline, trigger_sent,
// trigger_returned, first_moved, moved, moved_timeout, first_error,
// last_error, first_refused, last_refused, violation, recover_sent,
// recover_returned, first_back, back, back_timeout, end; offsets from the
// trigger returning), each probe's expectations, outcome counts per phase
// and figures, the checks against the targets, error samples and every
// violation; WriteMarkdown and WriteJSON render it (durations in JSON are
// milliseconds).
//
// # Speed
//
// Only headers and small files are read: a safetensors shard costs 8 + N
// bytes. Checksums read everything, so they are chosen per run
// (ChecksumMode): auto verifies what the manifest records, always hashes
// every file, never hashes nothing. Shard headers and hashes are read by
// Config.Workers goroutines, all of which have returned when Check does.
package dr
