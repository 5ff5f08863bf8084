package kvevents

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/meridian-llm/meridian/index"
)

var update = flag.Bool("update", false, "rewrite the want sections of testdata/vectors and the fuzz seed corpus")

// vector is one hand-built test vector: annotated hex and what it must decode to.
type vector struct {
	name     string
	path     string
	text     string
	msg      []byte
	want     string // the JSON line, when it decodes
	errWant  string // "reason offset", when it does not
	tiers    []string
	apply    string // the apply section: what re-keying the batch must index
	sections map[string]string
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	paths, err := filepath.Glob("testdata/vectors/*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vectors: %v", err)
	}
	var vs []vector
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		v := vector{name: strings.TrimSuffix(filepath.Base(p), ".txt"), path: p, text: string(raw),
			sections: map[string]string{}}
		cur := ""
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "-- ") && strings.HasSuffix(line, " --") {
				cur = strings.TrimSuffix(strings.TrimPrefix(line, "-- "), " --")
				continue
			}
			if cur == "" {
				continue
			}
			v.sections[cur] += line + "\n"
		}
		for _, line := range strings.Split(v.sections["hex"], "\n") {
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = line[:i]
			}
			b, err := hex.DecodeString(strings.Join(strings.Fields(line), ""))
			if err != nil {
				t.Fatalf("%s: bad hex line %q: %v", p, line, err)
			}
			v.msg = append(v.msg, b...)
		}
		v.want = strings.TrimSpace(v.sections["want"])
		v.errWant = strings.TrimSpace(v.sections["error"])
		if s, ok := v.sections["tiers"]; ok {
			v.tiers = strings.Fields(s)
		}
		v.apply = v.sections["apply"]
		if (v.want == "") == (v.errWant == "") {
			t.Fatalf("%s: want exactly one of a want or an error section", p)
		}
		vs = append(vs, v)
	}
	return vs
}

func newTestDecoder(t testing.TB) *Decoder {
	t.Helper()
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestVectors decodes each hand-built vector and compares the JSON with the
// hand-written expectation (or the error's reason and offset with the
// expected ones). Every well-formed vector is also checked with an
// independent msgpack implementation, so a vector cannot be wrong in a way
// our reader shares.
func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			d := newTestDecoder(t)
			b, err := d.Decode(v.msg)
			if v.errWant != "" {
				var de *DecodeError
				if err == nil {
					t.Fatalf("decoded, want error %q", v.errWant)
				}
				if !errorAs(err, &de) {
					t.Fatalf("error %v is not a *DecodeError", err)
				}
				if got := fmt.Sprintf("%s %d", de.Reason, de.Offset); got != v.errWant {
					t.Fatalf("error %q (%v), want %q", got, err, v.errWant)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			dec := msgpack.NewDecoder(bytes.NewReader(v.msg))
			if err := dec.Skip(); err != nil {
				t.Fatalf("vmihailenco/msgpack cannot parse the vector: %v", err)
			}
			if err := dec.Skip(); err != io.EOF {
				t.Fatalf("vmihailenco/msgpack finds more after the batch: %v", err)
			}
			got := string(AppendJSON(nil, b))
			if !json.Valid([]byte(got)) {
				t.Fatalf("invalid JSON %s", got)
			}
			if got != v.want {
				if *update {
					rewriteWant(t, v, got)
					return
				}
				t.Fatalf("got  %s\nwant %s", got, v.want)
			}
			if v.tiers != nil {
				if len(v.tiers) != len(b.Events) {
					t.Fatalf("%d tiers for %d events", len(v.tiers), len(b.Events))
				}
				for i, ev := range b.Events {
					tier, ok := TierOf(ev.(*BlockRemoved).Medium)
					got := tier.String()
					if !ok {
						got = "unknown"
					}
					if got != v.tiers[i] {
						t.Errorf("event %d medium %+v: tier %s, want %s", i, ev.(*BlockRemoved).Medium, got, v.tiers[i])
					}
				}
			}
			if v.apply != "" {
				checkApply(t, v, b)
			}
			// Our encoder, in every style, writes something that decodes to
			// the same batch.
			for _, enc := range allEncodings() {
				msg, err := enc.AppendBatch(nil, b)
				if err != nil {
					if errors.Is(err, errLoRAAndSalt) {
						continue // lora_name and cache_salt: map events only
					}
					t.Fatal(err)
				}
				b2, err := newTestDecoder(t).Decode(msg)
				if err != nil {
					t.Fatalf("%+v: decode of re-encoded: %v", enc, err)
				}
				assertSameBatch(t, b, b2)
			}
		})
	}
}

// checkApply re-keys the vector's batch with a fresh Rekeyer (model "m",
// the router block size of the apply section) and checks that the index it
// builds holds exactly the held lines, that the naive reference agrees, and
// the listed RekeyStats fields. An apply section:
//
//	block_size 4                                  router block size
//	held <tier> [salt=S] [lora=L] tokens t1 t2 ...  every full router block
//	                                              of these tokens, chained
//	                                              from the namespace's seed
//	stats Field=N ...                             RekeyStats fields
func checkApply(t *testing.T, v vector, b *Batch) {
	t.Helper()
	R := 0
	want := map[tierHash]int{}
	stats := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(v.apply), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "block_size":
			R, _ = strconv.Atoi(f[1])
		case len(f) >= 4 && f[0] == "held":
			ns := index.Namespace{Model: "m", BlockSize: R}
			tier := tierNamed(t, f[1])
			i := 2
			for ; f[i] != "tokens"; i++ {
				k, val, _ := strings.Cut(f[i], "=")
				switch k {
				case "salt":
					ns.CacheSalt = val
				case "lora":
					ns.LoRA = val
				default:
					t.Fatalf("%s: bad apply line %q", v.path, line)
				}
			}
			var toks []uint32
			for _, s := range f[i+1:] {
				n, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					t.Fatalf("%s: bad token %q", v.path, s)
				}
				toks = append(toks, uint32(n))
			}
			for _, h := range index.ChainHashes(ns, toks, nil) {
				want[tierHash{h, tier}]++
			}
		case len(f) >= 2 && f[0] == "stats":
			for _, kv := range f[1:] {
				k, val, _ := strings.Cut(kv, "=")
				n, err := strconv.ParseUint(val, 10, 64)
				if err != nil {
					t.Fatalf("%s: bad stats %q", v.path, kv)
				}
				stats[k] = n
			}
		default:
			t.Fatalf("%s: bad apply line %q", v.path, line)
		}
	}
	cfg := DefaultRekeyConfig()
	cfg.Model, cfg.BlockSize = "m", R
	r, err := NewRekeyer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	idx := &opIndex{m: map[tierHash]int{}}
	idx.apply(t, r.Apply(nil, b))
	if !maps.Equal(idx.m, want) {
		t.Errorf("re-keyed, the index holds %s\nwant %s", fmtHeld(idx.m), fmtHeld(want))
	}
	naive := newNaive("m", R)
	naive.apply(b)
	if got := naive.held(); !maps.Equal(got, want) {
		t.Errorf("the naive reference holds %s\nwant %s", fmtHeld(got), fmtHeld(want))
	}
	got := reflect.ValueOf(r.Stats())
	for k, n := range stats {
		fv := got.FieldByName(k)
		if !fv.IsValid() {
			t.Fatalf("%s: no RekeyStats field %s", v.path, k)
		}
		if fv.Uint() != n {
			t.Errorf("RekeyStats.%s = %d, want %d (%+v)", k, fv.Uint(), n, r.Stats())
		}
	}
}

func tierNamed(t *testing.T, name string) index.Tier {
	for tr := index.Tier(0); tr < index.NumTiers; tr++ {
		if tr.String() == name {
			return tr
		}
	}
	t.Fatalf("no tier %q", name)
	return 0
}

func allEncodings() []Encoding {
	var out []Encoding
	for _, ev := range []EventStyle{EventsArray, EventsMap} {
		for _, env := range []EnvelopeStyle{EnvelopeArray, EnvelopeMap} {
			for _, h := range []HashStyle{HashUint, HashInt, HashBytes} {
				out = append(out, Encoding{Events: ev, Envelope: env, Hashes: h})
			}
		}
	}
	return out
}

// assertSameBatch compares two batches, ignoring Skipped (the encoder does
// not write unknown events).
func assertSameBatch(t interface {
	Helper()
	Fatalf(string, ...any)
}, want, got *Batch) {
	t.Helper()
	w, g := *want, *got
	w.Skipped, g.Skipped = nil, nil
	if math.IsNaN(w.TS) && math.IsNaN(g.TS) {
		// No engine sends a NaN ts, but one decodes and re-encodes as
		// NaN, which DeepEqual calls unequal to itself.
		w.TS, g.TS = 0, 0
	}
	if w.Events == nil {
		w.Events = []Event{}
	}
	if g.Events == nil {
		g.Events = []Event{}
	}
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("batches differ:\n got  %s\n want %s", AppendJSON(nil, &g), AppendJSON(nil, &w))
	}
}

func rewriteWant(t *testing.T, v vector, got string) {
	t.Helper()
	i := strings.Index(v.text, "-- want --\n")
	text := v.text[:i] + "-- want --\n" + got + "\n"
	if err := os.WriteFile(v.path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote %s: review the diff", v.path)
}

func errorAs(err error, de **DecodeError) bool {
	d, ok := err.(*DecodeError)
	if ok {
		*de = d
	}
	return ok
}
