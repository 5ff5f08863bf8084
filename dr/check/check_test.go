package check

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/dr/check/checktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for _, c := range []struct {
		edit  func(*Config)
		field string
	}{
		{func(c *Config) { c.Checksums = 9 }, "Checksums"},
		{func(c *Config) { c.Workers = 0 }, "Workers"},
		{func(c *Config) { c.SmallFileBytes = -1 }, "SmallFileBytes"},
		{func(c *Config) { c.MaxParseBytes = 0 }, "MaxParseBytes"},
	} {
		cfg := DefaultConfig()
		c.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Validate() = %v, want an error naming %s", err, c.field)
		}
	}
	if _, err := ParseChecksumMode("sometimes"); err == nil {
		t.Error("ParseChecksumMode accepted sometimes")
	}
}

func TestManifestErrors(t *testing.T) {
	const good = "version: 1\nfiles:\n  - path: config.json\n    kind: model_config\n"
	if _, err := ParseManifest([]byte(good), "m.yaml"); err != nil {
		t.Fatalf("good manifest: %v", err)
	}
	cases := []struct {
		name, text, want string
	}{
		{"empty", "", "m.yaml: empty manifest"},
		{"version", "version: 2\nfiles: []\n", `m.yaml: version "2": unsupported manifest version`},
		{"no files", "version: 1\nfiles: []\n", `m.yaml: files: empty`},
		{"unknown top field", "version: 1\nfilez: []\n", "m.yaml:2: field filez not found"},
		{"unknown entry field", "version: 1\nfiles:\n  - path: a\n    kind: other\n    sha: x\n", "m.yaml:5: files[].sha: unknown field"},
		{"entry not a mapping", "version: 1\nfiles:\n  - config.json\n", "m.yaml:3: files[]: each file must be a mapping"},
		{"missing path", "version: 1\nfiles:\n  - kind: other\n", `m.yaml:3: files[0].path: missing`},
		{"absolute path", "version: 1\nfiles:\n  - path: /etc/passwd\n    kind: other\n", `m.yaml:3: files[0].path "/etc/passwd": must be a slash-separated path`},
		{"escaping path", "version: 1\nfiles:\n  - path: ../x\n    kind: other\n", `files[0].path "../x": escapes the folder`},
		{"unclean path", "version: 1\nfiles:\n  - path: a//b\n    kind: other\n", `files[0].path "a//b": not in clean form (want "a/b")`},
		{"duplicate", "version: 1\nfiles:\n  - path: a\n    kind: other\n  - path: a\n    kind: other\n", `m.yaml:5: files[1].path "a": listed twice (also files[0])`},
		{"bad kind", "version: 1\nfiles:\n  - path: a\n    kind: weight\n", `m.yaml:3: files[0].kind "weight": unknown kind`},
		{"missing kind", "version: 1\nfiles:\n  - path: a\n", `files[0].kind: missing`},
		{"bad digest", "version: 1\nfiles:\n  - path: a\n    kind: other\n    sha256: ABC\n", `files[0].sha256 "ABC": want 64 lowercase hex digits`},
		{"negative size", "version: 1\nfiles:\n  - path: a\n    kind: other\n    size: -1\n", `files[0].size "-1": negative`},
		{"bad engine", "version: 1\nengine: tgi\nfiles: [{path: a, kind: other}]\n", `engine "tgi": want vllm or sglang`},
		{"bad model dir", "version: 1\nmodel_dir: /models\nfiles: [{path: a, kind: other}]\n", `model_dir "/models"`},
		{"bad yaml", "version: 1\nfiles: [\n", "m.yaml:"},
		{"wrong type", "version: one\nfiles: []\n", "m.yaml:1: cannot unmarshal !!str `one` into int"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(c.text), "m.yaml")
			var me *ManifestError
			if !errors.As(err, &me) {
				t.Fatalf("error %v (%T), want a *ManifestError", err, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestManifestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.AWQ); err != nil {
		t.Fatal(err)
	}
	m, rep, err := InitManifest(context.Background(), DefaultConfig(), Source{Dir: dir}, InitOptions{Checksums: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || len(rep.Findings) != 0 {
		t.Fatalf("healthy folder has findings: %v", rep.Findings)
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := ParseManifest(b, "m.yaml")
	if err != nil {
		t.Fatalf("parse written manifest: %v\n%s", err, b)
	}
	if !manifestsEqual(m, m2) {
		t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
	}
	if m.Engine != "vllm" || m.ServesChat == nil || !*m.ServesChat || len(m.Files) != 12 {
		t.Fatalf("manifest %+v", m)
	}
	for _, e := range m.Files {
		if e.Size == nil || !isHexDigest(e.SHA256) {
			t.Fatalf("entry without size or checksum: %+v", e)
		}
	}
}

func manifestsEqual(a, b *Manifest) bool {
	strip := func(m *Manifest) Manifest {
		c := *m
		c.Files = slices.Clone(m.Files)
		if len(c.Files) == 0 {
			c.Files = nil
		}
		for i := range c.Files {
			c.Files[i].line = 0
		}
		slices.SortFunc(c.Files, func(x, y Entry) int { return strings.Compare(x.Path, y.Path) })
		return c
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte("version: 1\nfiles:\n  - path: config.json\n    kind: model_config\n    size: 10\n    sha256: " + strings.Repeat("ab", 32) + "\n"))
	f.Add([]byte("version: 1\nmodel: x\nmodel_dir: m\nengine: sglang\nserves_chat: false\nfiles:\n  - {path: a/b, kind: other, optional: true}\n"))
	f.Add([]byte("version: 1\nfiles: [{path: a, kind: weights}, {path: a, kind: weights}]\n"))
	f.Add([]byte("version: 1\nfiles:\n  - path: ../a\n    kind: other\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data, "fuzz.yaml")
		if err != nil {
			var me *ManifestError
			if !errors.As(err, &me) {
				t.Fatalf("error %v is not a *ManifestError", err)
			}
			return
		}
		b, err := m.Marshal()
		if err != nil {
			t.Fatalf("marshal a parsed manifest: %v", err)
		}
		m2, err := ParseManifest(b, "fuzz.yaml")
		if err != nil {
			t.Fatalf("parse a marshalled manifest: %v\n%s", err, b)
		}
		if !manifestsEqual(m, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
		}
	})
}

func TestSentencePieces(t *testing.T) {
	n, err := sentencePieces(checktest.SentencePiece(40))
	if err != nil || n != 40 {
		t.Fatalf("sentencePieces = %d, %v; want 40", n, err)
	}
	for _, bad := range [][]byte{{}, {0x0a, 0x7f}, {0x0b}, {0x12, 0x00}, {0x80}} {
		if _, err := sentencePieces(bad); err == nil {
			t.Errorf("sentencePieces(%x) accepted", bad)
		}
	}
}

func TestTiktokenRanks(t *testing.T) {
	v, err := tiktokenRanks(checktest.Tiktoken(30))
	if err != nil || v.size != 30 || !v.tokens["<s>"] {
		t.Fatalf("tiktokenRanks = %d, %v", v.size, err)
	}
	for _, bad := range []string{"", "YQ==\n", "YQ== -1\n", "!! 0\n", "YQ== x\n"} {
		if _, err := tiktokenRanks([]byte(bad)); err == nil {
			t.Errorf("tiktokenRanks(%q) accepted", bad)
		}
	}
}

func TestParseTokenizerJSON(t *testing.T) {
	v, err := parseTokenizerJSON([]byte(`{"added_tokens":[{"id":9,"content":"<eos>"}],"model":{"type":"Unigram","vocab":[["a",-1],["b",-2]]}}`))
	if err != nil || v.size != 10 || !v.tokens["a"] || !v.tokens["<eos>"] {
		t.Fatalf("unigram: size %d, %v", v.size, err)
	}
	for _, bad := range []string{`{}`, `{"model":{"type":"BPE"}}`, `{"model":{"vocab":{}}}`, `{"model":{"vocab":{"a":-1}}}`, `{"model":{"vocab":[]}}`, `[]`} {
		if _, err := parseTokenizerJSON([]byte(bad)); err == nil {
			t.Errorf("parseTokenizerJSON(%s) accepted", bad)
		}
	}
}

func TestClassify(t *testing.T) {
	adapters := map[string]bool{"adapters/sql": true}
	for _, c := range []struct {
		path, modelDir string
		want           Kind
	}{
		{"config.json", ".", KindModelConfig},
		{"model/config.json", "model", KindModelConfig},
		{"model/config.json", ".", KindOther},
		{"model-00001-of-00002.safetensors", ".", KindWeights},
		{"pytorch_model-00001-of-00002.bin", ".", KindWeights},
		{"tokenizer.model", ".", KindTokenizer},
		{"qwen.tiktoken", ".", KindTokenizer},
		{"quant_config.json", ".", KindQuantization},
		{"modeling_kimi.py", ".", KindRemoteCode},
		{"adapters/sql/adapter_model.safetensors", ".", KindLoRAAdapter},
		{"adapters/sql/sub/x.json", ".", KindLoRAAdapter},
		{"deploy/Dockerfile", ".", KindDockerfile},
		{"deploy/serve.Dockerfile", ".", KindDockerfile},
		{"deploy/requirements-gpu.txt", ".", KindDependencyLock},
		{"uv.lock", ".", KindDependencyLock},
		{"engine/vllm-prod.yaml", ".", KindEngineConfig},
		{"sglang.json", ".", KindEngineConfig},
		{"engine/lora-modules.yaml", ".", KindLoRAManifest},
		{"deploy/k8s.yaml", ".", KindOther}, // recognised by content
		{"README.md", ".", KindOther},
	} {
		if got := classify(c.path, c.modelDir, adapters); got != c.want {
			t.Errorf("classify(%q, %q) = %s, want %s", c.path, c.modelDir, got, c.want)
		}
	}
	for _, k := range kinds {
		if !k.Valid() || k.MissingCode() == "" {
			t.Errorf("kind %s", k)
		}
	}
}

func TestParseFlags(t *testing.T) {
	got := parseFlags(strings.Fields("/models/x --tp 4 --max_model_len=8192 --enable-lora --lora-modules a=/l/a b=/l/b --trust-remote-code"))
	want := map[string]any{
		"model": "/models/x", "tensor-parallel-size": "4", "max-model-len": "8192", "enable-lora": true,
		"lora-modules": []any{"a=/l/a", "b=/l/b"}, "trust-remote-code": true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseFlags = %v\nwant %v", got, want)
	}
	if e, rest := findEngine(strings.Fields("python3 -m vllm.entrypoints.openai.api_server --model m")); e != "vllm" || len(rest) != 2 {
		t.Fatalf("findEngine = %s %v", e, rest)
	}
	if e, _ := findEngine([]string{"nginx"}); e != "" {
		t.Fatalf("findEngine(nginx) = %s", e)
	}
}

func TestImagePinned(t *testing.T) {
	for ref, want := range map[string]bool{
		"vllm/vllm-openai:v0.11.0": true, "vllm/vllm-openai": false, "vllm/vllm-openai:latest": false,
		"registry:5000/img": false, "registry:5000/img:1.2": true, "img@sha256:abcd": true,
	} {
		if got := imagePinned(ref); got != want {
			t.Errorf("imagePinned(%q) = %v, want %v", ref, got, want)
		}
	}
}

// countingFS counts the bytes read from each file.
type countingFS struct {
	fs.FS
	mu   sync.Mutex
	read map[string]int64
}

func (c *countingFS) Open(name string) (fs.File, error) {
	f, err := c.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, fs: c, name: name}, nil
}

func (c *countingFS) ReadDir(name string) ([]fs.DirEntry, error) { return fs.ReadDir(c.FS, name) }
func (c *countingFS) Stat(name string) (fs.FileInfo, error)      { return fs.Stat(c.FS, name) }

type countingFile struct {
	fs.File
	fs   *countingFS
	name string
}

func (f *countingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.fs.mu.Lock()
	f.fs.read[f.name] += int64(n)
	f.fs.mu.Unlock()
	return n, err
}

// TestCheckReadsOnlyHeaders: a 4 GiB shard costs its header and nothing
// more unless checksums are asked for.
func TestCheckReadsOnlyHeaders(t *testing.T) {
	dir := t.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "model-00003-of-00003.safetensors")
	if err := checktest.WriteSparseShard(big, "model.layers.1.mlp.up_proj.weight", 4<<30); err != nil {
		t.Fatal(err)
	}
	cfs := &countingFS{FS: os.DirFS(dir), read: map[string]int64{}}
	rep, err := Run(context.Background(), DefaultConfig(), Request{Sources: []Source{{Dir: dir, FS: cfs}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Folders[0].Shards; got != 3 {
		t.Fatalf("shards read = %d, want 3", got)
	}
	st, err := os.Stat(big)
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range cfs.read {
		if strings.HasSuffix(name, ".safetensors") && n > 4096 {
			t.Errorf("read %d bytes of %s: more than its header", n, name)
		}
	}
	if n := cfs.read["model-00003-of-00003.safetensors"]; n == 0 || n >= st.Size() {
		t.Errorf("read %d of %d bytes of the big shard", n, st.Size())
	}
}

func TestCheckChecksumsAlwaysReadsEverything(t *testing.T) {
	dir := t.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		t.Fatal(err)
	}
	cfs := &countingFS{FS: os.DirFS(dir), read: map[string]int64{}}
	cfg := DefaultConfig()
	cfg.Checksums = ChecksumAlways
	rep, err := Run(context.Background(), cfg, Request{Sources: []Source{{Dir: dir, FS: cfs}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Folders[0].Hashed != rep.Folders[0].Files {
		t.Fatalf("hashed %d of %d files", rep.Folders[0].Hashed, rep.Folders[0].Files)
	}
	st, _ := os.Stat(filepath.Join(dir, checktest.Shard1))
	if n := cfs.read[checktest.Shard1]; n < st.Size() {
		t.Fatalf("read %d of %d bytes with checksums always", n, st.Size())
	}
}

func TestCheckRequestErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]Request{
		"no source":        {},
		"missing dir":      {Sources: []Source{{Dir: filepath.Join(dir, "nope")}}},
		"not a dir":        {Sources: []Source{{Dir: filepath.Join(dir, "config.json")}}},
		"unnamed region":   {Sources: []Source{{Region: "a", Dir: dir}, {Dir: dir}}},
		"duplicate region": {Sources: []Source{{Region: "a", Dir: dir}, {Region: "a", Dir: dir}}},
	} {
		if _, err := Run(ctx, DefaultConfig(), req); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Run(ctx, Config{}, Request{Sources: []Source{{Dir: dir}}}); err == nil {
		t.Error("zero config accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Run(cctx, DefaultConfig(), Request{Sources: []Source{{Dir: dir}}}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

func TestForEach(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	if err := forEach(context.Background(), 3, 100, func(i int) {
		mu.Lock()
		seen[i]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if seen[i] != 1 {
			t.Fatalf("item %d ran %d times", i, seen[i])
		}
	}
	if err := forEach(context.Background(), 4, 0, func(int) { t.Fatal("called") }); err != nil {
		t.Fatal(err)
	}
}

func TestReportJSONRoundTrip(t *testing.T) {
	rep := &Report{Checksums: "auto", Findings: []Finding{
		{Severity: Info, Code: CodeFileUnlisted, Path: "b"},
		{Severity: Blocking, Code: CodeShardMissing, Region: "eu", Path: "a"},
		{Severity: Warning, Code: CodeImageUnpinned, Path: "c"},
	}}
	rep.finish()
	if rep.OK() || rep.Counts != (Counts{1, 1, 1}) || rep.Findings[0].Severity != Blocking || rep.Findings[2].Severity != Info {
		t.Fatalf("report %+v", rep)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(rep.WriteJSON(pw)) }()
	b, err := io.ReadAll(pr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"severity": "blocking"`) {
		t.Fatalf("json %s", b)
	}
}

// TestDocListsEveryCode keeps the code table in docs/dr.md complete.
func TestDocListsEveryCode(t *testing.T) {
	doc, err := os.ReadFile("../../docs/dr.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "finding.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				code, _ := strconv.Unquote(v.(*ast.BasicLit).Value)
				n++
				if !strings.Contains(string(doc), "\n| `"+code+"` |") {
					t.Errorf("docs/dr.md does not list code %s in its table", code)
				}
			}
		}
	}
	if n < 60 {
		t.Fatalf("found only %d codes in finding.go", n)
	}
}
