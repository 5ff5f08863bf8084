package check

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"go.yaml.in/yaml/v3"
)

// read returns the contents of p, or false (with a finding) when it is too
// large to parse or unreadable.
func (fo *folder) read(p string) ([]byte, bool) {
	if b, ok := fo.texts[p]; ok {
		return b, true
	}
	f := fo.files[p]
	if f == nil {
		return nil, false
	}
	if f.size > fo.cfg.MaxParseBytes {
		fo.f.add(Warning, CodeFileTooLarge, p, "%d bytes, over the %d-byte parse limit: contents not checked", f.size, fo.cfg.MaxParseBytes)
		return nil, false
	}
	r, err := fo.fsys.Open(p)
	if err != nil {
		fo.f.add(Blocking, CodeFileUnreadable, p, "cannot open: %v", unwrapPathErr(err))
		return nil, false
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, fo.cfg.MaxParseBytes+1))
	if err != nil {
		fo.f.add(Blocking, CodeFileUnreadable, p, "cannot read: %v", unwrapPathErr(err))
		return nil, false
	}
	fo.texts[p] = b
	return b, true
}

// invalidSeverity: a broken file the region needs blocks; a broken file of
// no known role is a warning.
func invalidSeverity(k Kind) Severity {
	if k == KindOther {
		return Warning
	}
	return Blocking
}

// parseAll parses every JSON and YAML file once, reporting those that do not
// parse, and recognises Kubernetes manifests by content.
func (fo *folder) parseAll() {
	for _, p := range fo.paths {
		f := fo.files[p]
		switch strings.ToLower(path.Ext(p)) {
		case ".json":
			b, ok := fo.read(p)
			if !ok {
				continue
			}
			if !json.Valid(b) {
				var v any
				err := json.Unmarshal(b, &v)
				fo.f.add(invalidSeverity(f.kind), CodeJSONInvalid, p, "not valid JSON: %s", jsonErrPos(b, err))
				continue
			}
			if f.kind == KindTokenizer {
				continue // tokenizer.json is decoded into its own struct
			}
			var v any
			if err := json.Unmarshal(b, &v); err == nil {
				fo.docs[p] = v
			}
		case ".yaml", ".yml":
			b, ok := fo.read(p)
			if !ok {
				continue
			}
			docs, err := decodeYAML(b)
			if err != nil {
				if bytes.Contains(b, []byte("{{")) {
					fo.f.add(Info, CodeYAMLTemplated, p, "a template (holds {{ }}), not plain YAML: not checked")
					continue
				}
				fo.f.add(invalidSeverity(f.kind), CodeYAMLInvalid, p, "not valid YAML: line %d: %s", yamlErrLine(err), yamlErrMsg(err))
				continue
			}
			fo.yamls[p] = docs
			if f.kind == KindOther && !f.listed && isKubernetes(docs) {
				f.kind = KindDeployment
			}
		}
	}
}

func decodeYAML(b []byte) ([]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

// isKubernetes reports whether any document looks like a Kubernetes object
// (apiVersion or kind at the top; checkKubernetes then wants both).
func isKubernetes(docs []any) bool {
	for _, d := range docs {
		m, ok := d.(map[string]any)
		if !ok {
			continue
		}
		_, av := m["apiVersion"]
		_, kind := m["kind"]
		if av || kind {
			return true
		}
	}
	return false
}

// jsonErrPos renders a JSON decoding error with its line and column.
func jsonErrPos(b []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := lineCol(b, se.Offset)
		return fmt.Sprintf("line %d, column %d: %s", line, col, se.Error())
	}
	if err == nil {
		return "invalid"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func lineCol(b []byte, off int64) (int, int) {
	if off > int64(len(b)) {
		off = int64(len(b))
	}
	line, col := 1, 1
	for _, c := range b[:off] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return line, col
}

// obj returns the parsed JSON object at p, or nil.
func (fo *folder) obj(p string) map[string]any {
	m, _ := fo.docs[p].(map[string]any)
	return m
}

// Small accessors for decoded JSON/YAML values.

func str(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// num returns v as an int64 when it is an integral number (JSON float64 or
// YAML int).
func num(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		if x == float64(int64(x)) {
			return int64(x), true
		}
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x <= 1<<63-1 {
			return int64(x), true
		}
	case string:
		var n int64
		if _, err := fmt.Sscan(x, &n); err == nil && fmt.Sprint(n) == x {
			return n, true
		}
	}
	return 0, false
}

// float returns v as a float64 when it is a number.
func float(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

func truthy(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case string:
		switch strings.ToLower(x) {
		case "true", "1", "yes", "on":
			return true
		}
	}
	return false
}
