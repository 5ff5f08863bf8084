package check

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// vocab is what one tokenizer file says about the vocabulary.
type vocab struct {
	path string
	// size is the largest token id + 1.
	size int64
	// tokens holds the token strings, when the file lists them.
	tokens map[string]bool
}

type tokenizerJSON struct {
	AddedTokens []struct {
		ID      int64  `json:"id"`
		Content string `json:"content"`
	} `json:"added_tokens"`
	Model *struct {
		Type  string          `json:"type"`
		Vocab json.RawMessage `json:"vocab"`
	} `json:"model"`
}

// parseTokenizerJSON reads a Hugging Face tokenizer.json's vocabulary:
// a token -> id object (BPE, WordPiece, WordLevel) or a [piece, score]
// list (Unigram), plus added_tokens.
func parseTokenizerJSON(b []byte) (vocab, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(b, &tj); err != nil {
		return vocab{}, fmt.Errorf("not a tokenizer.json: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if tj.Model == nil {
		return vocab{}, errors.New("no model section")
	}
	v := vocab{tokens: make(map[string]bool)}
	raw := bytes.TrimSpace(tj.Model.Vocab)
	switch {
	case len(raw) > 0 && raw[0] == '{':
		var m map[string]int64
		if err := json.Unmarshal(raw, &m); err != nil {
			return vocab{}, fmt.Errorf("model.vocab: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		for tok, id := range m {
			if id < 0 {
				return vocab{}, fmt.Errorf("model.vocab: token %q has negative id %d", tok, id)
			}
			v.tokens[tok] = true
			v.size = max(v.size, id+1)
		}
	case len(raw) > 0 && raw[0] == '[':
		var list [][]any
		if err := json.Unmarshal(raw, &list); err != nil {
			return vocab{}, fmt.Errorf("model.vocab: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		for _, e := range list {
			if len(e) > 0 {
				if s, ok := e[0].(string); ok {
					v.tokens[s] = true
				}
			}
		}
		v.size = int64(len(list))
	default:
		return vocab{}, fmt.Errorf("model (type %q) has no vocab", tj.Model.Type)
	}
	if v.size == 0 {
		return vocab{}, errors.New("model.vocab is empty")
	}
	for _, a := range tj.AddedTokens {
		v.tokens[a.Content] = true
		v.size = max(v.size, a.ID+1)
	}
	return v, nil
}

// sentencePieces counts the pieces of a SentencePiece ModelProto (field 1,
// repeated) by walking the protobuf wire format.
func sentencePieces(b []byte) (int64, error) {
	var n int64
	for i := 0; i < len(b); {
		key, k := binary.Uvarint(b[i:])
		if k <= 0 {
			return 0, fmt.Errorf("bad protobuf key at byte %d", i)
		}
		i += k
		switch key & 7 {
		case 0:
			_, k := binary.Uvarint(b[i:])
			if k <= 0 {
				return 0, fmt.Errorf("bad protobuf varint at byte %d", i)
			}
			i += k
		case 1:
			i += 8
		case 2:
			l, k := binary.Uvarint(b[i:])
			if k <= 0 || l > uint64(len(b)-i-k) {
				return 0, fmt.Errorf("bad protobuf length at byte %d", i)
			}
			i += k + int(l)
			if key>>3 == 1 {
				n++
			}
		case 5:
			i += 4
		default:
			return 0, fmt.Errorf("unsupported protobuf wire type %d at byte %d", key&7, i)
		}
		if i > len(b) {
			return 0, errors.New("protobuf runs past the end of the file")
		}
	}
	if n == 0 {
		return 0, errors.New("no pieces")
	}
	return n, nil
}

// tiktokenRanks reads a tiktoken BPE file: one "base64(token) rank" per line.
func tiktokenRanks(b []byte) (vocab, error) {
	v := vocab{tokens: make(map[string]bool)}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return vocab{}, fmt.Errorf("line %d: want \"base64-token rank\"", i+1)
		}
		tok, err := base64.StdEncoding.DecodeString(f[0])
		if err != nil {
			return vocab{}, fmt.Errorf("line %d: token is not base64", i+1)
		}
		r, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || r < 0 {
			return vocab{}, fmt.Errorf("line %d: rank %q is not a non-negative integer", i+1, f[1])
		}
		v.tokens[string(tok)] = true
		v.size = max(v.size, r+1)
	}
	if v.size == 0 {
		return vocab{}, errors.New("no ranks")
	}
	return v, nil
}

func looksText(b []byte) bool {
	for _, c := range b[:min(len(b), 4096)] {
		if c < 0x20 && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}

// tokenizerFiles groups what the model directory holds.
type tokenizerFiles struct {
	json, spm, tik []string
	bpe, wordpiece bool
}

func (t tokenizerFiles) any() bool {
	return len(t.json) > 0 || len(t.spm) > 0 || len(t.tik) > 0 || t.bpe || t.wordpiece
}

func (fo *folder) tokenizerFiles() tokenizerFiles {
	var t tokenizerFiles
	if p := fo.inModel("tokenizer.json"); fo.has(p) {
		t.json = append(t.json, p)
	}
	for _, name := range []string{"tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.model"} {
		if p := fo.inModel(name); fo.has(p) {
			t.spm = append(t.spm, p)
		}
	}
	for _, p := range fo.paths {
		if path.Dir(p) == fo.modelDir && (path.Base(p) == "tiktoken.model" || strings.HasSuffix(p, ".tiktoken")) {
			t.tik = append(t.tik, p)
		}
	}
	t.bpe = fo.has(fo.inModel("vocab.json")) && fo.has(fo.inModel("merges.txt"))
	t.wordpiece = fo.has(fo.inModel("vocab.txt"))
	return t
}

// tokenizerConfig is what tokenizer_config.json and special_tokens_map.json say.
type tokenizerConfig struct {
	path    string
	doc     map[string]any
	class   string
	added   map[int64]string // added_tokens_decoder
	special map[string][2]string
}

func specialContent(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case map[string]any:
		return str(x["content"])
	}
	return "", false
}

func (fo *folder) loadTokenizerConfig() tokenizerConfig {
	tc := tokenizerConfig{path: fo.inModel("tokenizer_config.json"), added: map[int64]string{}, special: map[string][2]string{}}
	tc.doc = fo.obj(tc.path)
	if tc.doc != nil {
		tc.class, _ = str(tc.doc["tokenizer_class"])
		if dec, ok := tc.doc["added_tokens_decoder"].(map[string]any); ok {
			for id, v := range dec {
				n, err := strconv.ParseInt(id, 10, 64)
				if err != nil || n < 0 {
					continue
				}
				c, _ := specialContent(v)
				tc.added[n] = c
			}
		}
	}
	for _, src := range []string{tc.path, fo.inModel("special_tokens_map.json")} {
		doc := fo.obj(src)
		for _, key := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
			if c, ok := specialContent(doc[key]); ok && c != "" {
				tc.special[src+"\x00"+key] = [2]string{src, c}
			}
		}
		if list, ok := doc["additional_special_tokens"].([]any); ok {
			for i, v := range list {
				if c, ok := specialContent(v); ok && c != "" {
					tc.special[fmt.Sprintf("%s\x00additional_special_tokens[%d]", src, i)] = [2]string{src, c}
				}
			}
		}
	}
	return tc
}

func (fo *folder) checkTokenizer() {
	tf := fo.tokenizerFiles()
	tc := fo.loadTokenizerConfig()
	if !tf.any() {
		fo.f.add(Blocking, CodeTokenizerMissing, fo.inModel("tokenizer.json"), "no tokenizer: need tokenizer.json, tokenizer.model or tiktoken.model (the engine cannot encode a prompt)")
	}
	var vocabs []vocab
	for _, p := range tf.json {
		b, ok := fo.read(p)
		if !ok || !json.Valid(b) {
			continue // json_invalid already reported
		}
		v, err := parseTokenizerJSON(b)
		if err != nil {
			fo.f.add(Blocking, CodeTokenizerInvalid, p, "%v", err)
			continue
		}
		v.path = p
		vocabs = append(vocabs, v)
	}
	for _, p := range append(slices.Clone(tf.spm), tf.tik...) {
		b, ok := fo.read(p)
		if !ok {
			continue
		}
		if looksText(b) {
			v, err := tiktokenRanks(b)
			if err != nil {
				fo.f.add(Blocking, CodeTokenizerInvalid, p, "not a tiktoken BPE file: %v", err)
				continue
			}
			v.path = p
			vocabs = append(vocabs, v)
			continue
		}
		n, err := sentencePieces(b)
		if err != nil {
			fo.f.add(Blocking, CodeTokenizerInvalid, p, "not a SentencePiece model: %v", err)
			continue
		}
		vocabs = append(vocabs, vocab{path: p, size: n})
	}
	if !fo.has(tc.path) && tf.any() && !fo.listed(tc.path) {
		fo.f.add(Warning, CodeTokenizerConfigMissing, tc.path, "no tokenizer_config.json: special tokens, BOS/EOS handling and the chat template fall back to defaults")
	}
	fo.checkTokenizerClass(tf, tc)
	fo.checkChatTemplate(tc)
	fo.checkVocab(vocabs, tc)
	fo.checkRemoteCode(tc)
}

var (
	spmClasses = []string{"Llama", "CodeLlama", "Gemma", "T5", "MT5", "XLMRoberta", "Albert", "Camembert", "Siglip", "MBart", "MBart50", "Pegasus", "XLNet", "BigBird", "Reformer", "Udop", "Nllb"}
	bpeClasses = []string{"GPT2", "Qwen2", "CodeGen", "Roberta", "Bart", "CLIP", "Whisper", "GPTNeoX", "Bloom", "Cohere", "Longformer", "LED", "Blenderbot", "Deberta", "GPTNeoXJapanese"}
	wpClasses  = []string{"Bert", "DistilBert", "Electra", "MobileBert", "Funnel", "Squeezebert"}
	tikClasses = []string{"TikTokenTokenizer", "TiktokenTokenizer", "QWenTokenizer"}
)

// checkTokenizerClass checks that the files the tokenizer class loads from
// are present.
func (fo *folder) checkTokenizerClass(tf tokenizerFiles, tc tokenizerConfig) {
	c := tc.class
	if c == "" || !tf.any() {
		return
	}
	fast := strings.HasSuffix(c, "Fast")
	base := strings.TrimSuffix(strings.TrimSuffix(c, "Fast"), "Tokenizer")
	var slowOK bool
	var slowFiles string
	switch {
	case c == "PreTrainedTokenizerFast":
		if len(tf.json) == 0 {
			fo.f.add(Blocking, CodeTokenizerClassMismatch, fo.inModel("tokenizer.json"), "tokenizer_config.json names PreTrainedTokenizerFast, which loads only tokenizer.json, and it is not in the folder")
		}
		return
	case slices.Contains(tikClasses, strings.TrimSuffix(c, "Fast")):
		if len(tf.tik) == 0 && !fo.spmIsTiktoken(tf) {
			fo.f.add(Blocking, CodeTokenizerClassMismatch, fo.inModel("tiktoken.model"), "tokenizer_config.json names %s, which loads a tiktoken file (tiktoken.model or *.tiktoken), and none is in the folder", c)
		}
		return
	case slices.Contains(spmClasses, base):
		slowOK, slowFiles = len(tf.spm) > 0, "tokenizer.model"
	case slices.Contains(bpeClasses, base):
		slowOK, slowFiles = tf.bpe, "vocab.json and merges.txt"
	case slices.Contains(wpClasses, base):
		slowOK, slowFiles = tf.wordpiece, "vocab.txt"
	default:
		if len(tf.json) == 0 {
			fo.f.add(Info, CodeTokenizerClassUnknown, tc.path, "tokenizer class %s is not one this check knows: which files it loads is not checked", c)
		}
		return
	}
	switch {
	case len(tf.json) > 0:
	case slowOK && fast:
		fo.f.add(Warning, CodeTokenizerConversion, fo.inModel("tokenizer.json"), "no tokenizer.json: %s will be converted from %s at every start (slow, and needs the sentencepiece/protobuf packages)", c, slowFiles)
	case !slowOK:
		fo.f.add(Blocking, CodeTokenizerClassMismatch, tc.path, "tokenizer class %s loads tokenizer.json or %s, and neither is in the folder", c, slowFiles)
	}
}

// spmIsTiktoken reports whether a tokenizer.model is in tiktoken format.
func (fo *folder) spmIsTiktoken(tf tokenizerFiles) bool {
	for _, p := range tf.spm {
		if b, ok := fo.read(p); ok && looksText(b) {
			return true
		}
	}
	return false
}

// chatTemplate returns where the chat template comes from, or "".
func (fo *folder) chatTemplate(tc tokenizerConfig) string {
	switch v := tc.doc["chat_template"].(type) {
	case string:
		if strings.TrimSpace(v) != "" {
			return tc.path
		}
	case []any:
		for _, e := range v {
			if m, ok := e.(map[string]any); ok {
				if s, _ := str(m["template"]); strings.TrimSpace(s) != "" {
					return tc.path
				}
			}
		}
	}
	if p := fo.inModel("chat_template.jinja"); fo.has(p) && fo.files[p].size > 0 {
		return p
	}
	if p := fo.inModel("chat_template.json"); fo.has(p) {
		if s, _ := str(fo.obj(p)["chat_template"]); strings.TrimSpace(s) != "" {
			return p
		}
	}
	for _, e := range fo.engines {
		if e.chatTemplate != "" {
			return e.origin
		}
	}
	return ""
}

func (fo *folder) checkChatTemplate(tc tokenizerConfig) {
	if fo.chatTemplate(tc) != "" {
		return
	}
	if fo.servesChat() {
		fo.f.add(Blocking, CodeChatTemplateMissing, tc.path, "the engine serves chat completions (%s) but there is no chat template: not in tokenizer_config.json, no chat_template.jinja, none set in the engine config", fo.chatOrigin())
		return
	}
	if fo.has(tc.path) {
		fo.f.add(Info, CodeChatTemplateAbsent, tc.path, "no chat template: only completions can be served")
	}
}

// checkVocab compares each tokenizer file's vocabulary with config.json's
// vocab_size and checks the special tokens exist.
func (fo *folder) checkVocab(vocabs []vocab, tc tokenizerConfig) {
	var addedMax int64 = -1
	for id := range tc.added {
		addedMax = max(addedMax, id)
	}
	known := make(map[string]bool)
	haveTokens := false
	for _, v := range vocabs {
		size := max(v.size, addedMax+1)
		if vs := fo.model.vocabSize; vs > 0 {
			switch {
			case size > vs:
				fo.f.add(Blocking, CodeVocabMismatch, v.path, "%d tokens (ids up to %d, with tokenizer_config.json's added tokens) but config.json vocab_size is %d: ids past the embedding crash or corrupt generation", size, size-1, vs)
			case size*10 < vs*9:
				fo.f.add(Warning, CodeVocabUndersized, v.path, "%d tokens, under 90%% of config.json vocab_size %d: is this the tokenizer of another model?", size, vs)
			}
		}
		if len(v.tokens) > 0 {
			haveTokens = true
			for t := range v.tokens {
				known[t] = true
			}
		}
	}
	if !haveTokens {
		return
	}
	for _, c := range tc.added {
		known[c] = true
	}
	keys := make([]string, 0, len(tc.special))
	for k := range tc.special {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	unknown := map[string][]string{} // file -> "field \"token\""
	var files []string
	for _, k := range keys {
		s := tc.special[k]
		if !known[s[1]] {
			field := k[strings.IndexByte(k, 0)+1:]
			if _, ok := unknown[s[0]]; !ok {
				files = append(files, s[0])
			}
			unknown[s[0]] = append(unknown[s[0]], fmt.Sprintf("%s %q", field, s[1]))
		}
	}
	for _, f := range files {
		u := unknown[f]
		verb := "is"
		if len(u) > 1 {
			verb = "are"
		}
		fo.f.add(Warning, CodeSpecialTokenUnknown, f, "%s %s not in the tokenizer's vocabulary", strings.Join(u, ", "), verb)
	}
}

// autoMapModules returns the local Python modules an auto_map names.
func autoMapModules(v any) []string {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	var out []string
	add := func(ref any) {
		s, ok := ref.(string)
		if !ok || s == "" || strings.Contains(s, "--") {
			return // null, or code from another repository
		}
		i := strings.LastIndexByte(s, '.')
		if i <= 0 {
			return
		}
		mod := strings.ReplaceAll(s[:i], ".", "/") + ".py"
		if !slices.Contains(out, mod) {
			out = append(out, mod)
		}
	}
	for _, ref := range m {
		if list, ok := ref.([]any); ok {
			for _, r := range list {
				add(r)
			}
		} else {
			add(ref)
		}
	}
	slices.Sort(out)
	return out
}

// checkRemoteCode checks that the Python modules auto_map names (loaded with
// trust_remote_code) are in the folder.
func (fo *folder) checkRemoteCode(tc tokenizerConfig) {
	for _, src := range []string{fo.model.configPath, tc.path} {
		doc := fo.obj(src)
		for _, mod := range autoMapModules(doc["auto_map"]) {
			p := fo.inModel(mod)
			if !fo.has(p) {
				fo.f.add(Blocking, CodeRemoteCodeMissing, p, "%s auto_map loads code from %s (trust_remote_code), which is not in the folder", path.Base(src), path.Base(mod))
			}
		}
	}
}
