package kvevents

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// msgOf builds a message with our encoder (for tests of limits and errors,
// where the exact bytes are not the point; the vectors pin the bytes).
func msgOf(t testing.TB, enc Encoding, evs ...Event) []byte {
	t.Helper()
	msg, err := enc.AppendBatch(nil, &Batch{TS: 1.5, Events: evs, DataParallelRank: Some[int64](0)})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func decodeWith(t *testing.T, cfg DecoderConfig, msg []byte) (*Batch, error) {
	t.Helper()
	d, err := NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d.Decode(msg)
}

func wantReason(t *testing.T, err error, reason Reason, detail string) {
	t.Helper()
	if err == nil {
		t.Fatalf("decoded, want %s", reason)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %v is not a *DecodeError", err)
	}
	if de.Reason != reason || !strings.Contains(de.Detail, detail) {
		t.Fatalf("error %v, want reason %s and detail containing %q", err, reason, detail)
	}
	if !strings.Contains(err.Error(), "at byte ") {
		t.Fatalf("error %q does not name the byte offset", err)
	}
}

func TestDecodeLimits(t *testing.T) {
	stored := &BlockStored{BlockHashes: []uint64{1, 2, 3}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2,
		LoRAName: Some("a-long-lora-name"), ExtraKeys: []Raw{{mpNil}, {mpNil}, appendArrayHeader(appendArrayHeader(nil, 1), 0)}}
	msg := msgOf(t, Encoding{}, stored, stored)
	limit := func(f func(*DecoderConfig)) DecoderConfig {
		c := DefaultDecoderConfig()
		f(&c)
		return c
	}
	cases := []struct {
		name   string
		cfg    DecoderConfig
		msg    []byte
		reason Reason
		detail string
	}{
		{"events", limit(func(c *DecoderConfig) { c.MaxEvents = 1 }), msg, ReasonTooLarge, "2 events, limit 1"},
		{"hashes", limit(func(c *DecoderConfig) { c.MaxBlocksPerEvent = 2 }), msg, ReasonTooLarge, "3 hashes, limit 2"},
		{"tokens", limit(func(c *DecoderConfig) { c.MaxTokensPerEvent = 5 }), msg, ReasonTooLarge, "6 tokens, limit 5"},
		{"string", limit(func(c *DecoderConfig) { c.MaxStringBytes = 8 }), msg, ReasonTooLarge, "limit 8"},
		{"depth", limit(func(c *DecoderConfig) { c.MaxDepth = 1 }), msg, ReasonTooDeep, "nested"},
		{"message", limit(func(c *DecoderConfig) { c.MaxMessageBytes = len(msg) - 1 }), msg, ReasonTooLarge, "limit"},
		{"hash bytes", limit(func(c *DecoderConfig) { c.MaxHashBytes = 8 }),
			msgOf(t, Encoding{}, &BlockRemoved{BlockHashes: []uint64{1}}), ReasonTooLarge, ""},
	}
	// A bytes hash longer than MaxHashBytes is a bad hash.
	long := msgOf(t, Encoding{Hashes: HashBytes}, &BlockRemoved{BlockHashes: []uint64{1}})
	i := strings.Index(string(long), "\xc4\x08")
	long = append(long[:i:i], append([]byte{mpBin8, 9, 0}, long[i+2:]...)...)
	cases[len(cases)-1] = struct {
		name   string
		cfg    DecoderConfig
		msg    []byte
		reason Reason
		detail string
	}{"hash bytes", limit(func(c *DecoderConfig) { c.MaxHashBytes = 8 }), long, ReasonBadHash, "9 bytes, limit 8"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := decodeWith(t, c.cfg, c.msg)
			switch c.name {
			case "hashes", "tokens", "string", "hash bytes":
				// A limit of one event skips that event only.
				if err != nil || len(b.Skipped) == 0 || b.Skipped[0].Reason != c.reason || !strings.Contains(b.Skipped[0].Detail, c.detail) {
					t.Fatalf("got %v, skipped %+v; want the event skipped with %s %q", err, b, c.reason, c.detail)
				}
			default:
				wantReason(t, err, c.reason, c.detail)
			}
		})
	}
	// Within the limits the same message decodes.
	if _, err := decodeWith(t, DefaultDecoderConfig(), msg); err != nil {
		t.Fatal(err)
	}
}

// TestDecodePrefixLimit: in a stream, a batch that would run past
// MaxMessageBytes is too large, not truncated.
func TestDecodePrefixLimit(t *testing.T) {
	one := msgOf(t, Encoding{}, &BlockStored{BlockHashes: []uint64{1}, TokenIDs: make([]uint32, 64), BlockSize: 64})
	stream := append(append([]byte{}, one...), one...)
	cfg := DefaultDecoderConfig()
	cfg.MaxMessageBytes = len(one) - 1
	d, _ := NewDecoder(cfg)
	_, _, err := d.DecodePrefix(stream)
	wantReason(t, err, ReasonTooLarge, "size limit")
	cfg.MaxMessageBytes = len(one)
	d, _ = NewDecoder(cfg)
	for off := 0; off < len(stream); {
		_, n, err := d.DecodePrefix(stream[off:])
		if err != nil || n != len(one) {
			t.Fatalf("at %d: n=%d err=%v", off, n, err)
		}
		off += n
	}
}

func TestDecodeErrors(t *testing.T) {
	hdr := []byte{0x93, mpFloat64, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0} // [1.5, ...
	batch := func(events ...[]byte) []byte {
		m := append(append([]byte{}, hdr...), appendArrayHeader(nil, len(events))...)
		for _, e := range events {
			m = append(m, e...)
		}
		return append(m, 0)
	}
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	str := func(s string) []byte { return appendStr(nil, s) }
	// Failures of the batch: the envelope, or an event whose end cannot be
	// found.
	cases := []struct {
		name   string
		msg    []byte
		reason Reason
		detail string
	}{
		{"envelope of one", []byte{0x91, 0x00}, ReasonBadEnvelope, "want at least 2"},
		{"ts string", []byte{0x92, 0xa1, 'x', 0x90}, ReasonBadEnvelope, "ts"},
		{"events map", []byte{0x92, 0x00, 0x80}, ReasonBadEnvelope, "events"},
		{"events nil", []byte{0x92, 0x00, mpNil}, ReasonBadEnvelope, "events"},
		{"rank string", []byte{0x93, 0x00, 0x90, 0xa1, 'x'}, ReasonBadEnvelope, "data_parallel_rank"},
		{"map without events", cat([]byte{0x81}, str("ts"), []byte{0}), ReasonBadEnvelope, "no events"},
		{"map key int", []byte{0x81, 0x01, 0x02}, ReasonBadEnvelope, "key"},
		{"ext where a value is skipped", batch(cat([]byte{0x92}, str(TagAllBlocksCleared), []byte{mpExt8, 5, 1, 1})), ReasonTruncated, "ext"},
		{"deep unknown field", batch(cat([]byte{0x92}, str(TagAllBlocksCleared), []byte(strings.Repeat("\x91", 40)), []byte{0})), ReasonTooDeep, "nested"},
		{"array32 claims too much", []byte{0x92, 0x00, mpArray32, 0x7f, 0xff, 0xff, 0xff}, ReasonTruncated, "2147483647 elements"},
		{"str32 claims too much", batch(cat([]byte{0x92}, str(TagAllBlocksCleared), []byte{mpStr32, 0x7f, 0xff, 0xff, 0xff})), ReasonTruncated, "bytes"},
		{"bad msgpack in a token list", batch(cat([]byte{0x94}, str(TagBlockStored), []byte{0x90, mpNil, 0x91, 0xc1})), ReasonBadMsgpack, "0xc1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeWith(t, DefaultDecoderConfig(), c.msg)
			wantReason(t, err, c.reason, c.detail)
		})
	}
	// Failures of one event: it is skipped with its reason, and the events
	// around it decode.
	good := cat([]byte{0x93}, str(TagBlockRemoved), []byte{0x91, 0x07}, str("GPU"))
	events := []struct {
		name   string
		event  []byte
		reason Reason
		detail string
	}{
		{"event int", []byte{0x05}, ReasonBadEvent, "want array"},
		{"event empty", []byte{0x90}, ReasonBadEvent, "empty"},
		{"tag int", []byte{0x91, 0x05}, ReasonBadEvent, "tag"},
		{"map key int after type", cat([]byte{0x82}, str("type"), str(TagBlockRemoved), []byte{0x01, 0x02}), ReasonBadEvent, "key"},
		{"map key int before type", cat([]byte{0x82}, []byte{0x01, 0x02}, str("type"), str(TagBlockRemoved)), ReasonBadEvent, "key"},
		{"map without type", cat([]byte{0x81}, str("medium"), str("GPU")), ReasonBadEvent, "no \"type\""},
		{"block_size string", cat([]byte{0x95}, str(TagBlockStored), []byte{0x90, mpNil, 0x90}, str("x")), ReasonBadFieldType, "block_size"},
		{"medium int", cat([]byte{0x93}, str(TagBlockRemoved), []byte{0x90, 0x07}), ReasonBadFieldType, "medium"},
		{"medium bytes", cat([]byte{0x93}, str(TagBlockRemoved), []byte{0x90, mpBin8, 1, 'G'}), ReasonBadFieldType, "medium"},
		{"hashes map", cat([]byte{0x92}, str(TagBlockRemoved), []byte{0x80}), ReasonBadFieldType, "block_hashes"},
		{"hash nil", cat([]byte{0x92}, str(TagBlockRemoved), []byte{0x91, mpNil}), ReasonBadHash, "found nil"},
		{"hash string", cat([]byte{0x92}, str(TagBlockRemoved), []byte{0x91}, str("ab")), ReasonBadHash, "string"},
		{"token too big", cat([]byte{0x94}, str(TagBlockStored), []byte{0x90, mpNil, 0x91, mpUint64, 0, 0, 0, 1, 0, 0, 0, 0}), ReasonBadFieldType, "out of range"},
		{"token float", cat([]byte{0x94}, str(TagBlockStored), []byte{0x90, mpNil, 0x91, mpFloat32, 0, 0, 0, 0}), ReasonBadFieldType, "token id"},
		{"lora_id too big", cat([]byte{0x96}, str(TagBlockStored), []byte{0x90, mpNil, 0x90, 0x02, mpUint64, 0xff, 0, 0, 0, 0, 0, 0, 0}), ReasonBadFieldType, "int64"},
		{"lora_name array", cat([]byte{0x98}, str(TagBlockStored), []byte{0x90, mpNil, 0x90, 0x02, mpNil, mpNil, 0x90}), ReasonBadFieldType, "SGLang's metadata map, found array"},
		{"pod up without pod", cat([]byte{0x91}, str(TagPodUp)), ReasonMissingField, "pod name"},
		{"pod down without pod", cat([]byte{0x81}, str("type"), str(TagPodDown)), ReasonMissingField, "pod name"},
		{"negative epoch", cat([]byte{0x93}, str(TagPodDown), str("p"), []byte{0xff}), ReasonBadFieldType, "epoch"},
		{"negative kv_blocks", cat([]byte{0x83}, str("type"), str(TagPodUp), str("pod"), str("p"), str("kv_blocks"), []byte{0xff}), ReasonBadFieldType, "kv_blocks"},
		{"block size 0 with tokens", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x01, 0x02, 0x00}), ReasonBadBlockSize, "block_size 0"},
		{"negative block size", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x01, 0x02, 0xfe}), ReasonBadBlockSize, "block_size -2"},
		{"tokens not a multiple", cat([]byte{0x95}, str(TagBlockStored), []byte{0x92, 0x01, 0x02, mpNil, 0x93, 0x01, 0x02, 0x03, 0x02}), ReasonBadTokenCount, "3 token ids for 2 blocks of 2"},
		{"tokens without hashes", cat([]byte{0x95}, str(TagBlockStored), []byte{0x90, mpNil, 0x92, 0x01, 0x02, 0x02}), ReasonBadTokenCount, "for 0 blocks"},
		{"mm_keys not one per block", cat([]byte{0x83}, str("type"), str(TagBlockStored), str("block_hashes"), []byte{0x92, 0x01, 0x02}, str("mm_keys"), []byte{0x91, 0x90}), ReasonBadTokenCount, "mm_keys has 1 entries for 2 blocks"},
		{"pair after a token", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x01, 0x92, 0x02, 0x03, 0x02}), ReasonBadTokenPairs, "after plain"},
		{"token after a pair", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x92, 0x01, 0x02, 0x02, 0x02}), ReasonBadTokenPairs, "1 pairs among 2"},
		{"pairs that do not chain", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x92, 0x01, 0x02, 0x92, 0x05, 0x06, 0x02}), ReasonBadTokenPairs, "starts with 5, the previous pair ended with 2"},
		{"string among pairs", cat([]byte{0x95}, str(TagBlockStored), []byte{0x91, 0x01, mpNil, 0x92, 0x92, 0x01, 0x02}, str("x"), []byte{0x02}), ReasonBadTokenPairs, "1 pairs among 2"},
		{"hash bytes over the limit", cat([]byte{0x92}, str(TagBlockRemoved), []byte{0x91, mpBin8, 65}, make([]byte, 65)), ReasonBadHash, "65 bytes, limit 64"},
	}
	for _, c := range events {
		t.Run(c.name, func(t *testing.T) {
			b, err := decodeWith(t, DefaultDecoderConfig(), batch(good, c.event, good))
			if err != nil {
				t.Fatalf("the batch failed: %v", err)
			}
			if len(b.Events) != 2 || len(b.Skipped) != 1 {
				t.Fatalf("%d events, %d skipped, want 2 and 1: %s", len(b.Events), len(b.Skipped), AppendJSON(nil, b))
			}
			s := b.Skipped[0]
			if s.Index != 1 || s.Offset != len(hdr)+1+len(good) || s.Reason != c.reason || !strings.Contains(s.Detail, c.detail) || !s.Malformed() {
				t.Fatalf("skipped %+v, want event 1 at %d with %s and %q", s, len(hdr)+1+len(good), c.reason, c.detail)
			}
			if s.ErrOffset < s.Offset || s.ErrOffset >= s.Offset+len(c.event) {
				t.Fatalf("error offset %d outside the event [%d, %d)", s.ErrOffset, s.Offset, s.Offset+len(c.event))
			}
		})
	}
}

// TestEveryPrefixIsTruncated: msgpack is prefix-free, so every strict prefix
// of a valid message must fail, as truncated, without panicking.
func TestEveryPrefixIsTruncated(t *testing.T) {
	d := newTestDecoder(t)
	for _, v := range loadVectors(t) {
		if v.want == "" {
			continue
		}
		for n := 0; n < len(v.msg); n++ {
			_, err := d.Decode(v.msg[:n])
			if ReasonOf(err) != ReasonTruncated {
				t.Fatalf("%s: prefix of %d/%d bytes: %v, want truncated", v.name, n, len(v.msg), err)
			}
		}
	}
}

// TestDecodeAllocs: a Decoder that has seen a message's shape before decodes
// it again without allocating.
func TestDecodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	msg := benchBatch(t, 16, 4, 16, Encoding{})
	mapMsg := benchBatch(t, 16, 4, 16, Encoding{Events: EventsMap})
	d := newTestDecoder(t)
	for _, m := range [][]byte{msg, mapMsg} {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(50, func() {
			if _, err := d.Decode(m); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Fatalf("%v allocations per decode, want 0", n)
		}
	}
}

// TestHostileAllocs: a message that claims huge lists allocates nothing
// beyond its error, whatever it claims.
func TestHostileAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	hostile := [][]byte{
		{0x92, 0x00, mpArray32, 0xff, 0xff, 0xff, 0xff},
		append(append([]byte{0x92, 0x00, 0x91, 0x94}, appendStr(nil, TagBlockStored)...), 0x90, mpNil, mpArray32, 0xff, 0xff, 0xff, 0xf0, 1, 2, 3),
		append(append([]byte{0x92, 0x00, 0x91, 0x92}, appendStr(nil, TagBlockStored)...), mpArray32, 0x0f, 0xff, 0xff, 0xff),
	}
	d := newTestDecoder(t)
	for i, m := range hostile {
		if n := testing.AllocsPerRun(20, func() {
			if _, err := d.Decode(m); err == nil {
				t.Fatalf("hostile %d decoded", i)
			}
		}); n > 10 {
			t.Fatalf("hostile %d: %v allocations per decode", i, n)
		}
		if cap(d.tokens) > 1<<10 || cap(d.hashes) > 1<<10 {
			t.Fatalf("hostile %d grew buffers to %d tokens, %d hashes", i, cap(d.tokens), cap(d.hashes))
		}
	}
}

func TestDecoderConfigValidate(t *testing.T) {
	if err := DefaultDecoderConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultDecoderConfig()
	c.MaxTokensPerEvent = 0
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxTokensPerEvent = 0") {
		t.Fatalf("got %v", err)
	}
	c = DefaultDecoderConfig()
	c.MaxMessageBytes = 2 << 30
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "MaxMessageBytes") {
		t.Fatalf("got %v", err)
	}
	if _, err := NewDecoder(DecoderConfig{}); err == nil {
		t.Fatal("zero config accepted")
	}
}

func TestRawJSON(t *testing.T) {
	for _, c := range []struct {
		raw  []byte
		want string
	}{
		{[]byte{mpNil}, "null"},
		{[]byte{mpTrue}, "true"},
		{[]byte{0xff}, "-1"},
		{[]byte{mpFloat32, 0x3f, 0xc0, 0, 0}, "1.5"},
		{[]byte{0x92, 0xa1, 'a', 0x05}, `["a",5]`},
		{[]byte{mpBin8, 2, 0xab, 0xcd}, `{"bin":"abcd"}`},
		{[]byte{0x81, 0xa1, 'k', 0x01}, `{"k":1}`},
		{[]byte{0x81, 0x02, 0x01}, `{"map":[[2,1]]}`},
		{[]byte{0xd4, 0x07, 0xee}, `{"ext":7,"data":"ee"}`},
		{[]byte{mpExt8, 2, 0x01, 0xaa, 0xbb}, `{"ext":1,"data":"aabb"}`},
		{[]byte{0x92, 0x01}, `{"invalid":"9201"}`},
	} {
		if got := string(AppendRawJSON(nil, c.raw)); got != c.want {
			t.Errorf("%x: got %s, want %s", c.raw, got, c.want)
		}
	}
}

// TestRepeatedTokenIDs: a map event that repeats token_ids keeps the last
// list whole, with its own strings and pairs and none of an earlier list's
// (found by FuzzDecode: an earlier list's string token stayed attached to
// a position of the last, so the event no longer re-encoded to itself).
func TestRepeatedTokenIDs(t *testing.T) {
	ints := func(dst []byte, toks ...uint64) []byte {
		dst = appendArrayHeader(dst, len(toks))
		for _, v := range toks {
			dst = appendUint(dst, v)
		}
		return dst
	}
	withString := appendArrayHeader(nil, 8)
	for i := range 8 {
		if i == 5 {
			withString = appendStr(withString, "<image>")
			continue
		}
		withString = appendUint(withString, uint64(10+i))
	}
	pairs := appendArrayHeader(nil, 8)
	for i := range 8 {
		pairs = appendUint(appendUint(append(pairs, 0x92), uint64(20+i)), uint64(21+i))
	}
	event := func(lists ...[]byte) []byte {
		ev := appendMapHeader(nil, 3+len(lists))
		ev = appendStr(appendStr(ev, "type"), "BlockStored")
		ev = ints(appendStr(ev, "block_hashes"), 101, 102)
		ev = appendUint(appendStr(ev, "block_size"), 4)
		for _, l := range lists {
			ev = append(appendStr(ev, "token_ids"), l...)
		}
		msg := appendFloat64(appendArrayHeader(nil, 3), 1.5)
		msg = append(appendArrayHeader(msg, 1), ev...)
		return appendUint(msg, 0)
	}
	for _, tc := range []struct {
		name    string
		msg     []byte
		tokens  []uint32
		strings []StringToken
		pairs   bool
	}{
		{"strings then plain", event(withString, ints(nil, 30, 31, 32, 33, 34, 35, 36, 37)), []uint32{30, 31, 32, 33, 34, 35, 36, 37}, nil, false},
		{"plain then strings", event(ints(nil, 30, 31, 32, 33, 34, 35, 36, 37), withString), []uint32{10, 11, 12, 13, 14, 0, 16, 17}, []StringToken{{Pos: 5, Value: "<image>"}}, false},
		{"strings then empty", event(withString, ints(nil)), nil, nil, false},
		{"pairs then plain", event(pairs, ints(nil, 30, 31, 32, 33, 34, 35, 36, 37)), []uint32{30, 31, 32, 33, 34, 35, 36, 37}, nil, false},
		{"plain then pairs", event(ints(nil, 30, 31, 32, 33, 34, 35, 36, 37), pairs), []uint32{20, 21, 22, 23, 24, 25, 26, 27}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := decodeWith(t, DefaultDecoderConfig(), tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			ev := b.Events[0].(*BlockStored)
			if !slices.Equal(ev.TokenIDs, tc.tokens) || !slices.Equal(ev.StringTokens, tc.strings) || ev.Pairs != tc.pairs {
				t.Fatalf("tokens %v, strings %v, pairs %v; want %v, %v, %v", ev.TokenIDs, ev.StringTokens, ev.Pairs, tc.tokens, tc.strings, tc.pairs)
			}
			// The event re-encodes to itself, as FuzzDecode requires.
			for _, enc := range allEncodings() {
				msg, err := enc.AppendBatch(nil, b)
				if err != nil {
					t.Fatal(err)
				}
				b2, err := decodeWith(t, DefaultDecoderConfig(), msg)
				if err != nil {
					t.Fatalf("%+v: %v", enc, err)
				}
				assertSameBatch(t, b, b2)
			}
		})
	}
}
