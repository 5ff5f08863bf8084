package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// AppendJSON appends b as one JSON object, for operators (`meridian events
// decode`, `events tail`): the wire field names, every field present (null
// when absent), events as objects with "type" whatever their wire style,
// hashes as unsigned decimal integers, extra_keys and mm_keys as JSON values
// (bytes as {"bin": hex}), token ids as sent (numbers, strings, or [token,
// next] pairs). Events the decoder skipped (unknown or malformed) are listed
// under "skipped", malformed ones with what was wrong.
func AppendJSON(dst []byte, b *Batch) []byte {
	dst = append(dst, `{"ts":`...)
	dst = appendJSONFloat(dst, b.TS)
	dst = append(dst, `,"events":[`...)
	for i, ev := range b.Events {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendEventJSON(dst, ev)
	}
	dst = append(dst, `],"data_parallel_rank":`...)
	dst = appendJSONOptInt(dst, b.DataParallelRank)
	if len(b.Skipped) > 0 {
		dst = append(dst, `,"skipped":[`...)
		for i, s := range b.Skipped {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = fmt.Appendf(dst, `{"index":%d,"offset":%d,"tag":`, s.Index, s.Offset)
			dst = appendJSONString(dst, s.Tag)
			dst = append(dst, `,"reason":`...)
			dst = appendJSONString(dst, string(s.Reason))
			if s.Malformed() {
				dst = fmt.Appendf(dst, `,"error_offset":%d,"detail":`, s.ErrOffset)
				dst = appendJSONString(dst, s.Detail)
			}
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func appendEventJSON(dst []byte, ev Event) []byte {
	dst = append(dst, `{"type":`...)
	dst = appendJSONString(dst, ev.Kind().String())
	key := func(k string) { dst = append(append(append(dst, `,"`...), k...), `":`...) }
	switch ev := ev.(type) {
	case *BlockStored:
		key("block_hashes")
		dst = appendJSONHashes(dst, ev.BlockHashes)
		key("parent_block_hash")
		if ev.ParentBlockHash.Valid {
			dst = strconv.AppendUint(dst, ev.ParentBlockHash.V, 10)
		} else {
			dst = append(dst, "null"...)
		}
		key("token_ids")
		dst = appendJSONTokens(dst, ev)
		key("block_size")
		dst = strconv.AppendInt(dst, ev.BlockSize, 10)
		key("lora_id")
		dst = appendJSONOptInt(dst, ev.LoRAID)
		key("medium")
		dst = appendJSONOptStr(dst, ev.Medium)
		key("lora_name")
		dst = appendJSONOptStr(dst, ev.LoRAName)
		key("extra_keys")
		dst = appendJSONRaws(dst, ev.ExtraKeys)
		key("group_idx")
		dst = appendJSONOptInt(dst, ev.GroupIdx)
		key("kv_cache_spec_kind")
		dst = appendJSONOptStr(dst, ev.KVCacheSpecKind)
		key("kv_cache_spec_sliding_window")
		dst = appendJSONOptInt(dst, ev.KVCacheSpecSlidingWindow)
		key("locality")
		dst = appendJSONOptStr(dst, ev.Locality)
		key("mm_keys")
		dst = appendJSONRaws(dst, ev.MMKeys)
		key("cache_salt")
		dst = appendJSONOptStr(dst, ev.CacheSalt)
	case *BlockRemoved:
		key("block_hashes")
		dst = appendJSONHashes(dst, ev.BlockHashes)
		key("medium")
		dst = appendJSONOptStr(dst, ev.Medium)
		key("group_idx")
		dst = appendJSONOptInt(dst, ev.GroupIdx)
		key("locality")
		dst = appendJSONOptStr(dst, ev.Locality)
	case *PodUp:
		for _, f := range [][2]string{{"pod", ev.Pod}, {"endpoint", ev.Endpoint}, {"model", ev.Model},
			{"hardware", ev.Hardware}, {"region", ev.Region}} {
			key(f[0])
			dst = appendJSONString(dst, f[1])
		}
		key("epoch")
		dst = strconv.AppendUint(dst, ev.Epoch, 10)
		key("engine")
		dst = appendJSONString(dst, ev.Engine)
		key("kv_blocks")
		dst = strconv.AppendUint(dst, ev.KVBlocks, 10)
		if ev.TTL > 0 {
			key("ttl_ms")
			dst = strconv.AppendInt(dst, ev.TTL.Milliseconds(), 10)
		}
	case *PodDown:
		key("pod")
		dst = appendJSONString(dst, ev.Pod)
		key("epoch")
		dst = strconv.AppendUint(dst, ev.Epoch, 10)
		key("reason")
		dst = appendJSONString(dst, ev.Reason)
	}
	return append(dst, '}')
}

func appendJSONTokens(dst []byte, ev *BlockStored) []byte {
	dst = append(dst, '[')
	strs := ev.StringTokens
	for i, t := range ev.TokenIDs {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case ev.Pairs:
			next := ev.PairNext
			if i+1 < len(ev.TokenIDs) {
				next = ev.TokenIDs[i+1]
			}
			dst = fmt.Appendf(dst, "[%d,%d]", t, next)
		case len(strs) > 0 && strs[0].Pos == i:
			dst = appendJSONString(dst, strs[0].Value)
			strs = strs[1:]
		default:
			dst = strconv.AppendUint(dst, uint64(t), 10)
		}
	}
	return append(dst, ']')
}

func appendJSONRaws(dst []byte, rs []Raw) []byte {
	if rs == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, r := range rs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendRawJSON(dst, r)
	}
	return append(dst, ']')
}

func appendJSONHashes(dst []byte, hs []uint64) []byte {
	dst = append(dst, '[')
	for i, h := range hs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, h, 10)
	}
	return append(dst, ']')
}

func appendJSONOptInt(dst []byte, v Opt[int64]) []byte {
	if !v.Valid {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, v.V, 10)
}

func appendJSONOptStr(dst []byte, v Opt[string]) []byte {
	if !v.Valid {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, v.V)
}

func appendJSONString(dst []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(dst, q...)
}

func appendJSONFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendJSONString(dst, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}

// AppendRawJSON appends one msgpack value as JSON: nil, bools, numbers and
// strings as themselves, bin as {"bin": hex}, ext as {"ext": type, "data":
// hex}, arrays as arrays, maps with string keys as objects and other maps as
// {"map": [[key, value], ...]}. A value that is not well-formed msgpack
// appears as {"invalid": hex}.
func AppendRawJSON(dst []byte, raw Raw) []byte {
	r := reader{b: raw}
	out, err := appendValueJSON(dst, &r, 64)
	if err != nil || r.i != len(raw) {
		dst = append(dst, `{"invalid":"`...)
		dst = hex.AppendEncode(dst, raw)
		return append(dst, `"}`...)
	}
	return out
}

func appendValueJSON(dst []byte, r *reader, depth int) ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return dst, err
	}
	switch {
	case c == mpNil:
		r.i++
		return append(dst, "null"...), nil
	case c == mpTrue || c == mpFalse:
		r.i++
		return strconv.AppendBool(dst, c == mpTrue), nil
	case c == mpFloat32 || c == mpFloat64:
		f, err := r.number("value")
		return appendJSONFloat(dst, f), err
	case typeName(c) == "integer":
		v, signed, err := r.intBits("value")
		if signed {
			return strconv.AppendInt(dst, int64(v), 10), err
		}
		return strconv.AppendUint(dst, v, 10), err
	case typeName(c) == "string" || typeName(c) == "bytes":
		p, isStr, err := r.bytes("value", math.MaxInt32)
		if err != nil {
			return dst, err
		}
		if isStr {
			return appendJSONString(dst, string(p)), nil
		}
		dst = append(dst, `{"bin":"`...)
		return append(hex.AppendEncode(dst, p), `"}`...), nil
	case typeName(c) == "array" || typeName(c) == "map":
		if depth <= 0 {
			return dst, r.fail(r.i, ReasonTooDeep, "too deep")
		}
		isMap, n, err := r.container("value")
		if err != nil {
			return dst, err
		}
		if !isMap {
			dst = append(dst, '[')
			for k := 0; k < n; k++ {
				if k > 0 {
					dst = append(dst, ',')
				}
				if dst, err = appendValueJSON(dst, r, depth-1); err != nil {
					return dst, err
				}
			}
			return append(dst, ']'), nil
		}
		return appendMapJSON(dst, r, n, depth)
	case typeName(c) == "ext":
		start := r.i
		if err := r.skip(1); err != nil {
			return dst, err
		}
		p := r.b[start:r.i]
		// Header: fixext has 1 byte; ext8/16/32 have 1+1/2/4; then the type.
		hdr := 1
		switch c {
		case mpExt8:
			hdr = 2
		case mpExt16:
			hdr = 3
		case mpExt32:
			hdr = 5
		}
		dst = fmt.Appendf(dst, `{"ext":%d,"data":"`, int8(p[hdr]))
		return append(hex.AppendEncode(dst, p[hdr+1:]), `"}`...), nil
	}
	return dst, r.fail(r.i, ReasonBadMsgpack, "byte 0x%02x starts no msgpack value", c)
}

// appendMapJSON writes a map as an object when every key is a string, else as
// {"map": [[k, v], ...]}.
func appendMapJSON(dst []byte, r *reader, n, depth int) ([]byte, error) {
	start := r.i
	allStr := true
	for k := 0; k < n && allStr; k++ {
		c, err := r.peek()
		if err != nil {
			return dst, err
		}
		if typeName(c) != "string" {
			allStr = false
			break
		}
		if err := r.skip(depth); err != nil {
			return dst, err
		}
		if err := r.skip(depth); err != nil {
			return dst, err
		}
	}
	r.i = start
	var err error
	if allStr {
		dst = append(dst, '{')
	} else {
		dst = append(dst, `{"map":[`...)
	}
	for k := 0; k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		if !allStr {
			dst = append(dst, '[')
		}
		if dst, err = appendValueJSON(dst, r, depth-1); err != nil {
			return dst, err
		}
		if allStr {
			dst = append(dst, ':')
		} else {
			dst = append(dst, ',')
		}
		if dst, err = appendValueJSON(dst, r, depth-1); err != nil {
			return dst, err
		}
		if !allStr {
			dst = append(dst, ']')
		}
	}
	if allStr {
		return append(dst, '}'), nil
	}
	return append(dst, "]}"...), nil
}
