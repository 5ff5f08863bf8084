package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// FormatVersion is the record format written by this package (the "v" member).
const FormatVersion = 1

// Limits on entry fields; larger values are refused with an *EntryError.
const (
	MaxFieldBytes = 256      // any string field of an Entry
	MaxCostBytes  = 64 << 10 // the cost explanation, before canonicalisation
)

// timeLayout is the canonical time format: fixed width, UTC, nanoseconds.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// genesisPrev is the prev of the first record of every chain.
var genesisPrev = hex.EncodeToString(make([]byte, sha256.Size))

// Kind says what a record is about.
type Kind string

// Kinds written by Meridian. Other lowercase identifiers are accepted so that
// new decision kinds need no change here.
const (
	KindCrossRegion     Kind = "cross_region"     // the origin sent the request to another region
	KindResidencyDenied Kind = "residency_denied" // the request was refused by a residency rule
	KindForwardedIn     Kind = "forwarded_in"     // a request forwarded by another region was accepted here
	KindFallback        Kind = "fallback"         // a forward failed before the first byte; served elsewhere
	// KindAdminAction (admin.go) is a privileged action on the control plane.
)

func validKind(k Kind) bool {
	if len(k) == 0 || len(k) > 64 || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for i := 1; i < len(k); i++ {
		c := k[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// Entry is what a caller records about one decision. Tenant and Session are
// the raw identifiers: the log stores only their HMAC and never the raw value.
// There is deliberately no field for the prompt.
type Entry struct {
	Kind          Kind   // required
	DecisionID    string // required
	RequestID     string
	Tenant        string // raw; stored as HMAC-SHA256 (tenant_h)
	Session       string // raw; stored as HMAC-SHA256 (session_h)
	Origin        string // origin region; required
	Region        string // chosen region (required for cross_region, fallback, forwarded_in)
	Pod           string // chosen pod, when known
	DataClass     string
	Rule          string // residency rule that allowed or denied (required for residency_denied)
	PolicyVersion string // policy version the decision used (required for the kinds above)
	// Cost is the cost explanation as a JSON object (for example gorgo's
	// candidates and terms); required, non-empty, for cross_region and
	// fallback. An admin_action record holds its AdminDetail here. It is stored re-encoded canonically: keys sorted, no
	// insignificant space, numbers kept as their literal text. Empty is {}.
	Cost json.RawMessage
}

// Record is one stored line of the log.
type Record struct {
	V             int             `json:"v"`
	Controller    string          `json:"controller"`
	Seq           uint64          `json:"seq"`
	Time          time.Time       `json:"ts"`
	Kind          Kind            `json:"kind"`
	DecisionID    string          `json:"decision_id"`
	RequestID     string          `json:"request_id"`
	TenantHMAC    string          `json:"tenant_h"`
	SessionHMAC   string          `json:"session_h"`
	KeyID         string          `json:"kid"`
	Origin        string          `json:"origin"`
	Region        string          `json:"region"`
	Pod           string          `json:"pod"`
	DataClass     string          `json:"data_class"`
	Rule          string          `json:"rule"`
	PolicyVersion string          `json:"policy_version"`
	Cost          json.RawMessage `json:"cost"`
	Prev          string          `json:"prev"`
	Hash          string          `json:"hash"`
}

// EntryError reports an Entry that cannot be recorded; nothing was written.
type EntryError struct {
	Field  string // JSON name of the field
	Reason string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("audit entry: field %s: %s", e.Field, e.Reason)
}

// Hasher computes the HMACs stored instead of raw identifiers.
type Hasher struct {
	key   []byte
	keyID string
	macs  sync.Pool // of hash.Hash: HMAC-SHA256 under key
}

// MinKeyBytes is the shortest HMAC key accepted.
const MinKeyBytes = 16

// NewHasher returns a Hasher for key (at least MinKeyBytes bytes).
func NewHasher(key []byte) (*Hasher, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("audit hmac key: %d bytes, need at least %d", len(key), MinKeyBytes)
	}
	id := sha256.Sum256(append([]byte("meridian/audit/kid\x00"), key...))
	h := &Hasher{key: slices.Clone(key), keyID: hex.EncodeToString(id[:8])}
	h.macs.New = func() any { return hmac.New(sha256.New, h.key) }
	return h, nil
}

// DecodeKey decodes an HMAC key written the way the controller's
// audit.hmac_key and MERIDIAN_AUDIT_KEY are: base64 after a "base64:"
// prefix, else the bytes as written. It returns nil with the error.
func DecodeKey(s string) ([]byte, error) {
	b, ok := strings.CutPrefix(s, "base64:")
	if !ok {
		return []byte(s), nil
	}
	k, err := base64.StdEncoding.DecodeString(b)
	if err != nil {
		return nil, fmt.Errorf("audit hmac key: base64: %w", err)
	}
	return k, nil
}

// KeyID names the key without revealing it (stored in each record as kid),
// so a reader can tell whether a tenant search can match at all.
func (h *Hasher) KeyID() string { return h.keyID }

// Tenant returns the HMAC of a raw tenant id as stored in tenant_h ("" for "").
func (h *Hasher) Tenant(raw string) string { return string(h.appendSum(nil, "tenant", raw)) }

// Session returns the HMAC of a raw session id as stored in session_h.
func (h *Hasher) Session(raw string) string { return string(h.appendSum(nil, "session", raw)) }

// appendSum appends the hex HMAC of domain, 0, raw (nothing for raw "").
func (h *Hasher) appendSum(dst []byte, domain, raw string) []byte {
	if raw == "" {
		return dst
	}
	m := h.macs.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(domain))
	m.Write([]byte{0})
	m.Write([]byte(raw))
	var out [sha256.Size]byte
	sum := m.Sum(out[:0])
	h.macs.Put(m)
	return hex.AppendEncode(dst, sum)
}

// prepare validates e and encodes the members the writer does not assign:
// `,"kind":...,"cost":{...}`. It runs on the caller's goroutine.
func prepare(e *Entry, h *Hasher, dst []byte) ([]byte, error) {
	if !validKind(e.Kind) {
		return nil, &EntryError{Field: "kind", Reason: fmt.Sprintf("%q is not a lowercase identifier [a-z][a-z0-9_]* of at most 64 bytes", e.Kind)}
	}
	// Invariant 5 of DESIGN.md at the boundary: a decision of Meridian's own
	// kinds names its policy version, a crossing carries its cost breakdown
	// and a denial its rule. A caller that forgot gets an error and fails
	// closed rather than leaving an incomplete record.
	known := e.Kind == KindCrossRegion || e.Kind == KindResidencyDenied || e.Kind == KindForwardedIn || e.Kind == KindFallback
	crossing := e.Kind == KindCrossRegion || e.Kind == KindFallback
	fields := []struct {
		name, val string
		required  bool
	}{
		{"decision_id", e.DecisionID, true},
		{"request_id", e.RequestID, false},
		{"tenant", e.Tenant, false},
		{"session", e.Session, false},
		{"origin", e.Origin, true},
		{"region", e.Region, crossing || e.Kind == KindForwardedIn},
		{"pod", e.Pod, false},
		{"data_class", e.DataClass, false},
		{"rule", e.Rule, e.Kind == KindResidencyDenied},
		{"policy_version", e.PolicyVersion, known},
	}
	for _, f := range fields {
		switch {
		case f.required && f.val == "":
			return nil, &EntryError{Field: f.name, Reason: "empty"}
		case len(f.val) > MaxFieldBytes:
			return nil, &EntryError{Field: f.name, Reason: fmt.Sprintf("%d bytes, limit %d", len(f.val), MaxFieldBytes)}
		case !utf8.ValidString(f.val):
			return nil, &EntryError{Field: f.name, Reason: "not valid UTF-8"}
		}
	}
	cost, err := canonicalCost(e.Cost)
	if err != nil {
		return nil, &EntryError{Field: "cost", Reason: err.Error()}
	}
	if crossing && string(cost) == "{}" {
		return nil, &EntryError{Field: "cost", Reason: fmt.Sprintf("empty: a %s record carries the cost breakdown", e.Kind)}
	}
	if e.Kind == KindAdminAction {
		// Every privileged action on record names what was done, by whom
		// (and how they were authenticated) and with what outcome.
		if err := checkAdminCost(cost); err != nil {
			return nil, &EntryError{Field: "cost", Reason: err.Error()}
		}
	}
	b := dst
	if b == nil {
		b = make([]byte, 0, 512+len(cost))
	}
	b = appendMember(b, "kind", string(e.Kind))
	b = appendMember(b, "decision_id", e.DecisionID)
	b = appendMember(b, "request_id", e.RequestID)
	b = append(b, `,"tenant_h":"`...)
	b = h.appendSum(b, "tenant", e.Tenant)
	b = append(b, `","session_h":"`...)
	b = h.appendSum(b, "session", e.Session)
	b = append(b, '"')
	b = appendMember(b, "kid", h.KeyID())
	b = appendMember(b, "origin", e.Origin)
	b = appendMember(b, "region", e.Region)
	b = appendMember(b, "pod", e.Pod)
	b = appendMember(b, "data_class", e.DataClass)
	b = appendMember(b, "rule", e.Rule)
	b = appendMember(b, "policy_version", e.PolicyVersion)
	b = append(b, `,"cost":`...)
	b = append(b, cost...)
	return b, nil
}

// appendContent appends the hashed content of a record: the whole object
// without its hash member. body is the output of prepare.
func appendContent(b []byte, controller string, seq uint64, ts time.Time, body []byte, prev string) []byte {
	b = appendHeader(b, FormatVersion, controller, seq, ts)
	b = append(b, body...)
	b = appendMember(b, "prev", prev)
	return append(b, '}')
}

// appendHeader opens a record with the members the writer assigns, in
// canonical order: `{"v":...,"controller":...,"seq":...,"ts":"..."`.
func appendHeader(b []byte, v int64, controller string, seq uint64, ts time.Time) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, v, 10)
	b = appendMember(b, "controller", controller)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"ts":"`...)
	b = ts.UTC().AppendFormat(b, timeLayout)
	return append(b, '"')
}

// sealLine turns content (ending in '}') into a stored line: it appends the
// hash member and a newline, and returns the line and the hash.
func sealLine(content []byte) ([]byte, string) {
	sum := sha256.Sum256(content)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	line := append(content[:len(content)-1], `,"hash":"`...)
	line = append(line, hx[:]...)
	line = append(line, "\"}\n"...)
	return line, string(hx[:])
}

// AppendCanonical appends the canonical encoding of r (without a newline):
// exactly the bytes of its stored line, if r was read from a valid log.
func (r *Record) AppendCanonical(b []byte) ([]byte, error) {
	cost, err := canonicalCost(r.Cost)
	if err != nil {
		return b, fmt.Errorf("record seq %d: cost: %w", r.Seq, err)
	}
	b = appendHeader(b, int64(r.V), r.Controller, r.Seq, r.Time)
	b = appendMember(b, "kind", string(r.Kind))
	b = appendMember(b, "decision_id", r.DecisionID)
	b = appendMember(b, "request_id", r.RequestID)
	b = appendMember(b, "tenant_h", r.TenantHMAC)
	b = appendMember(b, "session_h", r.SessionHMAC)
	b = appendMember(b, "kid", r.KeyID)
	b = appendMember(b, "origin", r.Origin)
	b = appendMember(b, "region", r.Region)
	b = appendMember(b, "pod", r.Pod)
	b = appendMember(b, "data_class", r.DataClass)
	b = appendMember(b, "rule", r.Rule)
	b = appendMember(b, "policy_version", r.PolicyVersion)
	b = append(b, `,"cost":`...)
	b = append(b, cost...)
	b = appendMember(b, "prev", r.Prev)
	b = appendMember(b, "hash", r.Hash)
	return append(b, '}'), nil
}

// lineCheck is the result of checking one stored line.
type lineCheck struct {
	rec     Record
	parsed  bool   // the line is a JSON record
	hashOK  bool   // rec.Hash is the SHA-256 of the content
	problem string // why parsed, canonical or hashOK is false
}

// checkLine parses a stored line (without its newline) and checks that it is
// canonical and that its hash matches its content.
func checkLine(line []byte, scratch []byte) (lineCheck, []byte) {
	var c lineCheck
	if err := decodeRecord(line, &c.rec); err != nil {
		c.problem = "not a record: " + err.Error()
		return c, scratch
	}
	c.parsed = true
	canon, err := c.rec.AppendCanonical(scratch[:0])
	scratch = canon
	if err != nil {
		c.problem = err.Error()
		return c, scratch
	}
	if !bytes.Equal(canon, line) {
		c.problem = "not in canonical form (" + firstDiff(line, canon) + ")"
		return c, scratch
	}
	// content = line without `,"hash":"<64 hex>"` and with its closing brace.
	const suffix = len(`,"hash":""}`) + 2*sha256.Size
	if len(line) < suffix+1 {
		c.problem = "line too short"
		return c, scratch
	}
	if contentHash(line[:len(line)-suffix]) != c.rec.Hash {
		c.problem = "hash does not match content (content edited)"
		return c, scratch
	}
	c.hashOK = true
	return c, scratch
}

// contentHash is the hash of a record whose content without the closing
// brace is open: SHA-256(open + "}") in hex.
func contentHash(open []byte) string {
	h := sha256.New()
	h.Write(open)
	h.Write([]byte{'}'})
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

func decodeRecord(line []byte, r *Record) error {
	*r = Record{}
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(r); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("trailing data after the record")
	}
	return nil
}

func firstDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("differs at byte %d", i)
}

// appendMember appends `,"name":"value"`.
func appendMember(b []byte, name, val string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, val)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string in the canonical form: only '"',
// '\\' and control characters are escaped (\n, \r, \t, otherwise \u00xx);
// everything else is copied as UTF-8.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}
