package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Limits of a keys file.
const (
	// MinKeyBytes is the shortest API key accepted: `meridian auth keygen`
	// makes keys of 32 random bytes (43 characters of base64url).
	MinKeyBytes = 32
	// maxKeyBytes bounds a presented key (longer ones are refused before
	// hashing).
	maxKeyBytes = 512
	// MaxKeys is the most entries a keys file may hold.
	MaxKeys = 100_000
	// MaxKeysFileBytes is the largest keys file read.
	MaxKeysFileBytes = 16 << 20
)

// KeyEntry is one entry of a keys file:
//
//	keys:
//	  - name: acme-prod            # 1-128 of letters, digits, . _ -; unique
//	    sha256: 9f86d0...          # hex SHA-256 of the key text; unique
//	    tenant: acme
//	    data_classes: [general, phi]
//	    default_data_class: general # one of data_classes, or omitted
//	    rate_limit: {requests_per_second: 20, burst: 40}   # optional
//
// JSON with the same fields is accepted too. An optional top-level
// "version: 1" may precede the keys.
type KeyEntry struct {
	Name             string     `yaml:"name" json:"name"`
	SHA256           string     `yaml:"sha256" json:"sha256"`
	Tenant           string     `yaml:"tenant" json:"tenant"`
	DataClasses      []string   `yaml:"data_classes,omitempty" json:"data_classes,omitempty"`
	DefaultDataClass string     `yaml:"default_data_class,omitempty" json:"default_data_class,omitempty"`
	RateLimit        *RateLimit `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
}

type keysFile struct {
	Version int        `yaml:"version"`
	Keys    []KeyEntry `yaml:"keys"`
}

// KeySet is a parsed keys file: entries normalised (tenants and classes in
// lower case, digests decoded) and checked.
type KeySet struct {
	keys []keyRec
	// cmp compares two digests; subtle.ConstantTimeCompare (tests count
	// its calls).
	cmp func(a, b []byte) int
}

type keyRec struct {
	digest [sha256.Size]byte
	entry  KeyEntry // normalised
}

// Len is the number of keys.
func (ks *KeySet) Len() int { return len(ks.keys) }

// Entries returns the normalised entries, in file order.
func (ks *KeySet) Entries() []KeyEntry {
	out := make([]KeyEntry, len(ks.keys))
	for i, k := range ks.keys {
		out[i] = k.entry
	}
	return out
}

// KeysError is a problem of a keys file; Line is 0 when it has none.
type KeysError struct {
	Line    int
	Message string
}

func (e *KeysError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Message)
	}
	return e.Message
}

// ParseKeys reads a keys file (see KeyEntry). Errors name the line and the
// offending value; every problem is reported (errors.Join of *KeysError).
func ParseKeys(data []byte) (*KeySet, error) {
	if len(data) > MaxKeysFileBytes {
		return nil, &KeysError{Message: fmt.Sprintf("keys file is %d bytes, more than %d", len(data), MaxKeysFileBytes)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &KeysError{Message: "keys file is empty (an interrupted write?); want a keys: list"}
	}
	var f keysFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, &KeysError{Message: fmt.Sprintf("keys file: %v", err)}
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		return nil, &KeysError{Message: "keys file holds more than one YAML document"}
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	lines := entryLines(&root)
	line := func(i int) int {
		if i < len(lines) {
			return lines[i]
		}
		return 0
	}
	var errs []error
	bad := func(i int, format string, args ...any) {
		errs = append(errs, &KeysError{Line: line(i), Message: fmt.Sprintf(format, args...)})
	}
	if f.Version != 0 && f.Version != 1 {
		errs = append(errs, &KeysError{Message: fmt.Sprintf("version %d: this controller reads version 1", f.Version)})
	}
	if f.Keys == nil {
		errs = append(errs, &KeysError{Message: "keys file has no keys: list"})
	}
	if len(f.Keys) > MaxKeys {
		return nil, &KeysError{Message: fmt.Sprintf("%d keys, more than %d", len(f.Keys), MaxKeys)}
	}
	ks := &KeySet{keys: make([]keyRec, 0, len(f.Keys)), cmp: subtle.ConstantTimeCompare}
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	for i, e := range f.Keys {
		rec, problems := normaliseEntry(e)
		for _, p := range problems {
			bad(i, "key %d (%q): %s", i, clip(e.Name), p)
		}
		if len(problems) > 0 {
			continue
		}
		if j, dup := names[rec.entry.Name]; dup {
			bad(i, "key %d: name %q is also key %d's", i, rec.entry.Name, j)
			continue
		}
		if j, dup := digests[rec.digest]; dup {
			bad(i, "key %d (%q): sha256 is also key %d's (%q): one key, one entry", i, rec.entry.Name, j, f.Keys[j].Name)
			continue
		}
		names[rec.entry.Name], digests[rec.digest] = i, i
		ks.keys = append(ks.keys, rec)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ks, nil
}

// entryLines returns the line of each entry of the keys: sequence.
func entryLines(root *yaml.Node) []int {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil
	}
	m := root.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "keys" && m.Content[i+1].Kind == yaml.SequenceNode {
			var out []int
			for _, e := range m.Content[i+1].Content {
				out = append(out, e.Line)
			}
			return out
		}
	}
	return nil
}

func normaliseEntry(e KeyEntry) (keyRec, []string) {
	var problems []string
	var rec keyRec
	if err := validName(e.Name); err != nil {
		problems = append(problems, err.Error())
	}
	sum := strings.ToLower(strings.TrimSpace(e.SHA256))
	if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
		problems = append(problems, fmt.Sprintf("sha256 %q: want the 64 hex digits of the key's SHA-256 (meridian auth keygen prints it); keys are never stored in clear", clip(e.SHA256)))
	} else {
		copy(rec.digest[:], b)
	}
	tenant, ok := normValue(e.Tenant)
	if !ok {
		problems = append(problems, fmt.Sprintf("tenant %q: want 1-%d of letters, digits and - _ . : @ / +", clip(e.Tenant), MaxValueLen))
	}
	var classes []string
	for _, c := range e.DataClasses {
		n, ok := normValue(c)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("data class %q: want 1-%d of letters, digits and - _ . : @ / +", clip(c), MaxValueLen))
		case contains(classes, n):
			problems = append(problems, fmt.Sprintf("data class %q listed twice", n))
		default:
			classes = append(classes, n)
		}
	}
	def := ""
	if strings.TrimSpace(e.DefaultDataClass) != "" {
		n, ok := normValue(e.DefaultDataClass)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("default_data_class %q: want 1-%d of letters, digits and - _ . : @ / +", clip(e.DefaultDataClass), MaxValueLen))
		case !contains(classes, n):
			problems = append(problems, fmt.Sprintf("default_data_class %q is not one of data_classes %v", n, classes))
		default:
			def = n
		}
	}
	if e.RateLimit != nil {
		if err := e.RateLimit.validate("rate_limit"); err != nil {
			problems = append(problems, err.Error())
		}
	}
	rec.entry = KeyEntry{Name: e.Name, SHA256: sum, Tenant: tenant, DataClasses: classes, DefaultDataClass: def, RateLimit: e.RateLimit}
	return rec, problems
}

func validName(s string) error {
	ok := len(s) > 0 && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("name %q: want 1-128 of letters, digits, '.', '_' and '-'", clip(s))
	}
	return nil
}

// lookup finds the entry whose digest is sum. Every entry is compared, in
// constant time, whatever matches: the time taken says nothing about which
// entry (or how much of a digest) matched.
func (ks *KeySet) lookup(sum [sha256.Size]byte) (KeyEntry, bool) {
	idx := -1
	for i := range ks.keys {
		eq := ks.cmp(ks.keys[i].digest[:], sum[:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
	}
	if idx < 0 {
		return KeyEntry{}, false
	}
	return ks.keys[idx].entry, true
}

// KeyDigest is the hex SHA-256 of a key, as the keys file holds it.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
