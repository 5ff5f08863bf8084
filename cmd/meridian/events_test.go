package main

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

func runEvents(t *testing.T, stdin []byte, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	app := newApp()
	var out, errw bytes.Buffer
	app.Writer, app.ErrWriter, app.Reader = &out, &errw, bytes.NewReader(stdin)
	err = app.Run(append([]string{"meridian", "events", "decode"}, args...))
	return out.String(), errw.String(), err
}

func encodeBatch(t *testing.T, enc kvevents.Encoding, evs ...kvevents.Event) []byte {
	t.Helper()
	msg, err := enc.AppendBatch(nil, &kvevents.Batch{TS: 2, Events: evs, DataParallelRank: kvevents.Some[int64](0)})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestEventsDecodeBinary(t *testing.T) {
	a := encodeBatch(t, kvevents.Encoding{}, &kvevents.BlockRemoved{BlockHashes: []uint64{1 << 63}, Medium: kvevents.Some("GPU")})
	b := encodeBatch(t, kvevents.Encoding{Events: kvevents.EventsMap}, &kvevents.AllBlocksCleared{})
	file := filepath.Join(t.TempDir(), "payloads.bin")
	if err := os.WriteFile(file, append(append([]byte{}, a...), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{file}, {"-"}, {}} {
		stdout, stderr, err := runEvents(t, append(append([]byte{}, a...), b...), args...)
		if err != nil || stderr != "" {
			t.Fatalf("%v: err %v, stderr %q", args, err, stderr)
		}
		want := `{"ts":2,"events":[{"type":"BlockRemoved","block_hashes":[9223372036854775808],"medium":"GPU","group_idx":null,"locality":null}],"data_parallel_rank":0}` + "\n" +
			`{"ts":2,"events":[{"type":"AllBlocksCleared"}],"data_parallel_rank":0}` + "\n"
		if stdout != want {
			t.Fatalf("%v: stdout\n%s\nwant\n%s", args, stdout, want)
		}
	}
}

// TestEventsDecodeBinaryBad: a malformed event is named (index, reason,
// file offset) and its payload's good events are printed; a payload that
// cannot be framed is reported with its file offset and ends the input;
// what came before is printed; exit status 1.
func TestEventsDecodeBinaryBad(t *testing.T) {
	a := encodeBatch(t, kvevents.Encoding{}, &kvevents.AllBlocksCleared{})
	// Payload 2 is [0, [5, ["AllBlocksCleared"]]]: its event 0 is an int.
	in := append(append([]byte{}, a...), 0x92, 0x00, 0x92, 0x05, 0x91, 0xa0|byte(len(kvevents.TagAllBlocksCleared)))
	in = append(in, kvevents.TagAllBlocksCleared...)
	second := len(a)
	in = append(in, 0x92, 0xcb, 0x3f) // a third payload, truncated
	stdout, stderr, err := runEvents(t, in)
	if err == nil || exitCode(err) != 1 {
		t.Fatalf("err %v, want exit status 1", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 || lines[1] != `{"ts":0,"events":[{"type":"AllBlocksCleared"}],"data_parallel_rank":null,"skipped":[{"index":0,"offset":3,"tag":"","reason":"bad_event","error_offset":3,"detail":"event 0: want array [tag, fields...] or map with \"type\", found integer"}]}` {
		t.Fatalf("stdout %q: want the first batch, then the second with its good event", stdout)
	}
	for _, want := range []string{
		"payload 2 at file byte " + strconv.Itoa(second) + ": event 0 ((no tag)) skipped: bad_event at byte 3 (file byte " + strconv.Itoa(second+3) + ")",
		"payload 3 at file byte " + strconv.Itoa(len(in)-3) + ": truncated at byte 1",
	} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr %q, want it to contain %q", stderr, want)
		}
	}
}

// TestEventsDecodeHex: one payload per line; a bad line is reported with
// its line number, byte offset and reason, and the next lines still decode.
func TestEventsDecodeHex(t *testing.T) {
	good := hex.EncodeToString(encodeBatch(t, kvevents.Encoding{}, &kvevents.PodDown{Pod: "p", Epoch: 3, Reason: "drain"}))
	spaced := "92 00 90" // [0, []]
	in := strings.Join([]string{
		"# a comment",
		good,
		"zz",                         // line 3: not hex
		"9300",                       // line 4: truncated
		"",                           //
		"  " + spaced + "  ",         // line 6
		"93cb3ff8000000000000910500", // line 7: event 0 is an int
		"9300",                       // line 8: truncated
	}, "\n")
	stdout, stderr, err := runEvents(t, []byte(in), "--hex")
	if err == nil || !strings.Contains(err.Error(), "3 payload(s) failed to decode, 3 decoded, 1 malformed event(s) skipped") {
		t.Fatalf("err %v", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 || lines[0] != `{"ts":2,"events":[{"type":"PodDown","pod":"p","epoch":3,"reason":"drain"}],"data_parallel_rank":0}` ||
		lines[1] != `{"ts":0,"events":[],"data_parallel_rank":null}` || !strings.HasPrefix(lines[2], `{"ts":1.5,"events":[],"data_parallel_rank":0,"skipped":[{"index":0`) {
		t.Fatalf("stdout %q", stdout)
	}
	for _, want := range []string{"line 3: bad hex", "line 4: truncated at byte 0", "line 7: event 0 ((no tag)) skipped: bad_event at byte 11", "line 8: truncated"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
}

func TestEventsDecodeUsage(t *testing.T) {
	_, _, err := runEvents(t, nil, "a", "b")
	if exitCode(err) != 2 {
		t.Fatalf("two files: %v", err)
	}
	_, _, err = runEvents(t, nil, "--max-bytes", "0")
	if exitCode(err) != 2 {
		t.Fatalf("--max-bytes 0: %v", err)
	}
	_, _, err = runEvents(t, nil, filepath.Join(t.TempDir(), "missing"))
	if err == nil || exitCode(err) != 1 {
		t.Fatalf("missing file: %v", err)
	}
}

// TestEventsCommandExtra: later subcommands (events tail) plug in.
func TestEventsCommandExtra(t *testing.T) {
	c := eventsCommand(&cli.Command{Name: "tail"})
	if len(c.Subcommands) != 2 || c.Subcommands[0].Name != "decode" || c.Subcommands[1].Name != "tail" {
		t.Fatalf("subcommands %v", c.Subcommands)
	}
}
