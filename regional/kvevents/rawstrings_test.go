package kvevents

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// RawStrings writes a msgpack array of strings that another implementation
// reads back, whatever the count (a fixarray holds at most 15 entries) and
// the string lengths; none is nil.
func TestRawStrings(t *testing.T) {
	if got := RawStrings(nil); !slices.Equal(got, Raw{mpNil}) {
		t.Fatalf("no strings: % x, want nil (c0)", got)
	}
	for _, n := range []int{1, 2, 15, 16, 17, 300, 1 << 16} {
		ss := make([]string, n)
		for i := range ss {
			ss[i] = fmt.Sprintf("key-%d", i)
		}
		ss[0] = strings.Repeat("s", 40)    // str8
		ss[n-1] = strings.Repeat("l", 300) // str16
		raw := RawStrings(ss)
		var got []string
		if err := msgpack.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%d strings: vmihailenco/msgpack: %v", n, err)
		}
		if !slices.Equal(got, ss) {
			t.Fatalf("%d strings: read back %d, differing", n, len(got))
		}
	}
	// The rekeyer reads the tuple the engine simulator writes: a LoRA name,
	// then the cache salt on a sequence's first block.
	if salt, opaque := classifyExtra(RawStrings([]string{"lora", "salt"}), "lora", true); opaque || salt != "salt" {
		t.Fatalf("classifyExtra: salt %q opaque %v", salt, opaque)
	}
}
