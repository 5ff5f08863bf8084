// Package tokenize turns an OpenAI-compatible request into token ids exactly
// as the engine computes them. The regional router and the engine simulator
// (scenarios/enginesim) both call it, so for the same request and the same
// Model they produce the same ids by construction; the tests check it.
//
// A Model is a Tokenizer (a tiktoken-format byte-pair encoding whose ranks are
// compiled into the binary, so nothing is fetched over the network) plus a chat Template (Jinja, rendered with gonja the way
// Hugging Face transformers renders `chat_template`: trim_blocks and
// lstrip_blocks on, `raise_exception` and `strftime_now` defined). A Model is
// loaded from a model directory's `tokenizer_config.json` or named in Config;
// without a template it uses a built-in ChatML template.
//
// The templates of the common model families (ChatML, Qwen2.5, Llama 3,
// Mistral and Mixtral, Gemma, DeepSeek-R1) are recognised by their exact
// source when a Template is built and rendered by Go code instead
// (compiled.go: no interpreter, no per-message maps); TestCompiledMatchesGonja
// and FuzzCompiledTemplates require the same bytes, and the same refusals,
// as gonja's rendering of the same source. Any other template, or an edited
// copy of a known one, is rendered by gonja.
//
// How the engine tokenizes, and therefore how this package does:
//   - chat: the messages are rendered with the template (add_generation_prompt
//     true unless the request says otherwise) and the text is encoded without
//     adding BOS (the template writes it, as vLLM does with
//     add_special_tokens=False);
//   - completions: BOS is prepended when the model adds it (add_bos_token),
//     then the prompt text is encoded; `prompt_token_ids`, or `prompt` given as
//     a list of ints, are used as they are;
//   - special tokens (base ones of the encoding, the ChatML extension, and the
//     model's added tokens) are recognised anywhere in the text, longest match
//     first, as Hugging Face tokenizers and tiktoken's allowed_special="all"
//     do; the text between them is byte-pair encoded.
//
// # Byte-pair encoding
//
// For cl100k_base and o200k_base the text is split and merged by this
// package's own code (fastbpe.go): the encoding's split pattern written out
// as a scanner, and tiktoken's merge rule over the encoding's ranks,
// embedded in the binary (vocab.go: made from, and checked against,
// github.com/tiktoken-go/tokenizer's, which is not loaded at run time, so
// that its ~8 MB of maps are not on the heap the collector marks). It
// allocates nothing
// and runs about 7x faster than the library. It follows standard regex
// semantics, as tiktoken does; the library's compiled-in split code
// (v0.10.0) deviates on one construct (\s*[\r\n]+ takes the first newline
// of a whitespace run instead of the last, so "\n  \n" splits differently),
// which TestLibrarySplitDeviation pins. For cl100k_base the commonest
// pre-token of prose, a word of ASCII letters with its leading space, is
// split and ranked from one 8-byte load when it has at most 7 bytes and
// from two when it has at most 15, without reading its bytes again
// (asciiWord, checked against the scanner by TestASCIIWordMatchesSplit); a
// word that is not a token is merged as any other piece. Its tests compare
// it with regexp2's interpreter running the same patterns and with a naive
// merge (rapid properties, a fuzz target with a committed corpus, real
// files), and with the library itself wherever the library's split is
// standard.
// Text that is not valid UTF-8 is encoded as the library encodes it: each
// stray byte as U+FFFD (TestInvalidUTF8MatchesLibrary). Other encodings
// (p50k_base, r50k_base) go through the library.
//
// # Request bodies
//
// ParseBody reads what routing needs of a request body (model, stream and
// the prompt fields) in one pass, checking the rest for syntax without
// decoding it; the body is forwarded as it came. It fails on exactly the
// bodies json.Unmarshal fails on and otherwise decodes the same values,
// which TestPropertyParseBody and FuzzParseBody check against
// encoding/json itself.
//
// Invariants:
//   - Encode is deterministic and safe for concurrent use; two Models built
//     from the same Config produce identical ids.
//   - Extend (the multi-turn shortcut) returns exactly the ids a full Encode of
//     the new text would: it reuses the previous ids only up to a point where
//     tokenization restarts (the end of a special token far enough inside the
//     common prefix), so no byte-pair merge can cross the reuse boundary.
//   - An Encoding is immutable. Extend and EncodeCached (the prefix cache)
//     share the ids they reuse with the encoding they take them from,
//     holding them in parts rather than copying them; a reader gets them
//     through Len, AppendParts and AppendIDs. ExtendChat and
//     EncodeChatCached render the messages against that encoding
//     (renderSink): the text it already holds is compared, not copied, and
//     shared in pieces; only what follows its last safe restart point is
//     copied, scanned, hashed and encoded.
//   - Encoding.Chain hashes an encoding's blocks with the caller's
//     BlockHasher once and keeps the hashes with it; an encoding that reuses
//     another's ids takes over the hashes of the blocks within them when
//     hasher, seed and block size are the same.
//
// It imports nothing of ours, nor anything that pulls in net/http, Kafka or
// Prometheus (the root's deps_test.go checks both): the engine simulator
// links it as the router does.
package tokenize
