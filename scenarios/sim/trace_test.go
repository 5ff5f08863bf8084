package sim

import (
	"errors"
	"strings"
	"testing"
)

func TestReadTrace(t *testing.T) {
	in := `{"timestamp": 10, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1, 2]}

{"timestamp": 3.5, "input_length": 512, "output_length": 0, "hash_ids": [0], "extra": "ignored"}
{"timestamp": 10, "input_length": 100, "output_length": 1, "hash_ids": [7]}
`
	recs, err := ReadTrace(strings.NewReader(in), 512)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	// Sorted by timestamp, stable for equal ones.
	if recs[0].Timestamp != 3 || recs[1].InputLength != 1025 || recs[2].HashIDs[0] != 7 {
		t.Errorf("records out of order: %+v", recs)
	}
}

// TestReadTraceErrors: each kind of bad input is refused with the line and
// what is wrong.
func TestReadTraceErrors(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n"
	for _, tc := range []struct {
		name, line, want string
	}{
		{"not json", `{"timestamp": 0,`, "not a trace record"},
		{"wrong type", `{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "not a trace record"},
		{"negative id", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`, "not a trace record"},
		{"no timestamp", `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`, "missing timestamp"},
		{"no input", `{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`, "missing input_length"},
		{"no output", `{"timestamp": 0, "input_length": 1, "hash_ids": [1]}`, "missing output_length"},
		{"no ids", `{"timestamp": 0, "input_length": 1, "output_length": 1}`, "missing hash_ids"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "timestamp = -1"},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}`, "input_length = 0"},
		{"negative output", `{"timestamp": 0, "input_length": 1, "output_length": -2, "hash_ids": [1]}`, "output_length = -2"},
		{"empty ids", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}`, "hash_ids has 0 ids"},
		{"too many ids", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]}`, "hash_ids has 3 ids for input_length 10, want 1"},
		{"too few ids", `{"timestamp": 0, "input_length": 5000, "output_length": 1, "hash_ids": [1, 2]}`, "hash_ids has 2 ids for input_length 5000, want 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(ok+tc.line+"\n"+ok), 512)
			var te *TraceError
			if !errors.As(err, &te) || !errors.Is(err, ErrBadTrace) {
				t.Fatalf("error %v, want a *TraceError wrapping ErrBadTrace", err)
			}
			if te.Line != 2 || !strings.Contains(te.Reason, tc.want) {
				t.Errorf("error %q, want line 2 and %q", err, tc.want)
			}
		})
	}
	if _, err := ReadTrace(strings.NewReader("\n\n"), 512); !errors.Is(err, ErrBadTrace) {
		t.Errorf("empty trace: error %v, want ErrBadTrace", err)
	}
	if _, err := ReadTrace(strings.NewReader(ok), 0); err == nil {
		t.Error("block size 0: no error")
	}
	if _, err := LoadTraceFile("testdata-does-not-exist.jsonl", 512); err == nil || !strings.Contains(err.Error(), "load trace") {
		t.Errorf("missing file: error %v", err)
	}
}

// TestReadTraceBlockSize: a trace with 256-token ids (GORGO's ART-Chat) is
// read with its own block size.
func TestReadTraceBlockSize(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1, 2, 3]}`
	if _, err := ReadTrace(strings.NewReader(in), 512); err == nil {
		t.Error("4 ids for 1000 tokens at 512: no error")
	}
	if _, err := ReadTrace(strings.NewReader(in), 256); err != nil {
		t.Errorf("at 256: %v", err)
	}
}
