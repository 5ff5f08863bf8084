package check

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ManifestVersion is the manifest format version this package reads and writes.
const ManifestVersion = 1

// DefaultManifestName is the file name `manifest init` writes and `check`
// looks for in the folder when no manifest is named.
const DefaultManifestName = "dr-manifest.yaml"

// Manifest lists what a region needs to serve one model. docs/dr.md gives
// the format.
type Manifest struct {
	Version int `yaml:"version"`
	// Model names the model, for people (for example its Hugging Face id).
	Model string `yaml:"model,omitempty"`
	// ModelDir is the folder-relative directory holding config.json, the
	// tokenizer and the weights. Default ".".
	ModelDir string `yaml:"model_dir,omitempty"`
	// Engine is "vllm" or "sglang"; empty means infer it from file names.
	Engine string `yaml:"engine,omitempty"`
	// ServesChat says whether the engine serves chat completions (and so
	// needs a chat template). Nil means: yes when an engine config is found
	// and it does not run a pooling/embedding task.
	ServesChat *bool   `yaml:"serves_chat,omitempty"`
	Files      []Entry `yaml:"files"`
}

// Entry is one file the region needs.
type Entry struct {
	// Path is slash-separated and relative to the folder.
	Path string `yaml:"path"`
	Kind Kind   `yaml:"kind"`
	// Size in bytes; nil when not recorded.
	Size *int64 `yaml:"size,omitempty"`
	// SHA256 is the lowercase hex digest; empty when not recorded.
	SHA256 string `yaml:"sha256,omitempty"`
	// Optional files may be absent (a warning instead of a blocking finding).
	Optional bool `yaml:"optional,omitempty"`

	line int
}

// ManifestError is a manifest that cannot be used; it names the file, line,
// field and offending value.
type ManifestError struct {
	File  string
	Line  int
	Field string
	Value string
	Msg   string
}

func (e *ManifestError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		if e.Value != "" {
			fmt.Fprintf(&b, " %q", e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var entryFields = []string{"path", "kind", "size", "sha256", "optional"}

// UnmarshalYAML decodes an entry, rejecting unknown keys and keeping the line.
func (e *Entry) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return &ManifestError{Line: n.Line, Field: "files[]", Msg: "each file must be a mapping with path and kind"}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(entryFields, k.Value) {
			return &ManifestError{Line: k.Line, Field: "files[]." + k.Value, Msg: "unknown field (want " + strings.Join(entryFields, ", ") + ")"}
		}
	}
	type plain Entry
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*e = Entry(p)
	e.line = n.Line
	return nil
}

// ParseManifest parses and validates a manifest; name is used in errors.
func ParseManifest(data []byte, name string) (*Manifest, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		var me *ManifestError
		if errors.As(err, &me) {
			me.File = name
			return nil, me
		}
		if errors.Is(err, io.EOF) {
			return nil, &ManifestError{File: name, Msg: "empty manifest"}
		}
		return nil, &ManifestError{File: name, Line: yamlErrLine(err), Msg: yamlErrMsg(err)}
	}
	if err := m.validate(name); err != nil {
		return nil, err
	}
	return &m, nil
}

// LoadManifest reads and parses the manifest at file.
func LoadManifest(file string) (*Manifest, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("load manifest: %w", err)
	}
	return ParseManifest(data, file)
}

func (m *Manifest) validate(name string) error {
	bad := func(line int, field, value, msg string) error {
		return &ManifestError{File: name, Line: line, Field: field, Value: value, Msg: msg}
	}
	if m.Version != ManifestVersion {
		return bad(0, "version", fmt.Sprint(m.Version), fmt.Sprintf("unsupported manifest version (this binary reads version %d)", ManifestVersion))
	}
	if m.ModelDir != "" {
		if err := checkRelPath(m.ModelDir); err != nil {
			return bad(0, "model_dir", m.ModelDir, err.Error())
		}
	}
	switch m.Engine {
	case "", "vllm", "sglang":
	default:
		return bad(0, "engine", m.Engine, "want vllm or sglang")
	}
	if len(m.Files) == 0 {
		return bad(0, "files", "", "empty: a manifest lists at least one file")
	}
	seen := make(map[string]int)
	for i, e := range m.Files {
		field := fmt.Sprintf("files[%d]", i)
		if e.Path == "" {
			return bad(e.line, field+".path", "", "missing")
		}
		if err := checkRelPath(e.Path); err != nil {
			return bad(e.line, field+".path", e.Path, err.Error())
		}
		if prev, dup := seen[e.Path]; dup {
			return bad(e.line, field+".path", e.Path, fmt.Sprintf("listed twice (also files[%d])", prev))
		}
		seen[e.Path] = i
		if e.Kind == "" {
			return bad(e.line, field+".kind", "", "missing")
		}
		if !e.Kind.Valid() {
			names := make([]string, len(kinds))
			for j, k := range kinds {
				names[j] = string(k)
			}
			return bad(e.line, field+".kind", string(e.Kind), "unknown kind (want one of "+strings.Join(names, ", ")+")")
		}
		if e.Size != nil && *e.Size < 0 {
			return bad(e.line, field+".size", fmt.Sprint(*e.Size), "negative")
		}
		if e.SHA256 != "" && !isHexDigest(e.SHA256) {
			return bad(e.line, field+".sha256", e.SHA256, "want 64 lowercase hex digits")
		}
	}
	return nil
}

func checkRelPath(p string) error {
	if strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return errors.New("must be a slash-separated path relative to the folder")
	}
	if c := path.Clean(p); c != p {
		return fmt.Errorf("not in clean form (want %q)", c)
	}
	if p == ".." || strings.HasPrefix(p, "../") {
		return errors.New("escapes the folder")
	}
	return nil
}

func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// yamlErrLine extracts "line N" from a yaml error message.
func yamlErrLine(err error) int {
	msg := err.Error()
	i := strings.Index(msg, "line ")
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range msg[i+5:] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

var linePrefix = regexp.MustCompile(`^line \d+: `)

// yamlErrMsg renders a yaml error without its "yaml: " and "line N: "
// prefixes (the line is reported separately) or Go type names.
func yamlErrMsg(err error) string {
	msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	if te, ok := err.(*yaml.TypeError); ok {
		msgs = te.Errors
	}
	for i, m := range msgs {
		m = linePrefix.ReplaceAllString(m, "")
		if j := strings.Index(m, " in type dr."); j >= 0 {
			m = m[:j]
		}
		msgs[i] = m
	}
	return strings.Join(msgs, "; ")
}

const manifestHeader = `# Meridian DR manifest: every file a region needs to serve this model.
# Written by "meridian dr manifest init"; keep it in git and check each region
# with "meridian dr check --manifest FILE DIR". Paths are relative to the folder.
`

// Marshal encodes the manifest as YAML with a header comment, files sorted
// by path.
func (m *Manifest) Marshal() ([]byte, error) {
	c := *m
	c.Files = slices.Clone(m.Files)
	slices.SortFunc(c.Files, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	var buf bytes.Buffer
	buf.WriteString(manifestHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return buf.Bytes(), nil
}

// byPath indexes the entries by path.
func (m *Manifest) byPath() map[string]Entry {
	out := make(map[string]Entry, len(m.Files))
	for _, e := range m.Files {
		out[e.Path] = e
	}
	return out
}
