package safetensors

import (
	"bytes"
	"slices"
	"testing"
)

// naiveValid is the reference for validate: paint every data byte each
// tensor claims and require each byte painted exactly once, every empty
// tensor to sit at 0 or at the end of a non-empty tensor, and every span to
// match its dtype and shape. Only for small buffers.
func naiveValid(ts []Tensor) bool {
	var end uint64
	for _, t := range ts {
		if t.End < t.Begin {
			return false
		}
		if n, ok := ByteLen(t.DType, t.Shape); !ok || n != t.End-t.Begin {
			return false
		}
		end = max(end, t.End)
	}
	paint := make([]int, end)
	boundary := map[uint64]bool{0: true}
	for _, t := range ts {
		for i := t.Begin; i < t.End; i++ {
			paint[i]++
		}
		if t.End > t.Begin {
			boundary[t.End] = true
		}
	}
	for _, c := range paint {
		if c != 1 {
			return false
		}
	}
	for _, t := range ts {
		if t.Begin == t.End && !boundary[t.Begin] {
			return false
		}
	}
	return true
}

func FuzzParse(f *testing.F) {
	for _, h := range []string{
		`{}`,
		`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`,
		`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}}`,
		`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`,
		`{"e":{"dtype":"U8","shape":[0],"data_offsets":[1,1]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`,
		`{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`,
	} {
		b := make([]byte, 8)
		b[0] = byte(len(h))
		f.Add(append(append(b, h...), make([]byte, 8)...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < PrefixLen {
			if _, err := Parse(data); err == nil {
				t.Fatal("short input parsed")
			}
			return
		}
		n, err := headerLen(data[:PrefixLen], int64(len(data)))
		if err != nil {
			return
		}
		h, err := decode(data[:PrefixLen+n])
		if err != nil {
			if _, perr := Parse(data); perr == nil {
				t.Fatal("Parse accepted what decode rejected")
			}
			return
		}
		small := true
		for _, ts := range h.Tensors {
			if ts.End > 1<<16 {
				small = false
			}
		}
		orig := slices.Clone(h.Tensors)
		verr := h.validate()
		if small {
			if want := naiveValid(orig); want != (verr == nil) {
				t.Fatalf("validate error %v, naive reference valid=%v, tensors %+v", verr, want, orig)
			}
		}
		if verr != nil {
			return
		}
		// A valid header re-laid-out in offset order parses to the same tensors.
		hdr, dataLen, err := Layout(slices.Clone(h.Tensors), h.Metadata)
		if err != nil {
			t.Fatalf("layout of a valid header: %v", err)
		}
		if dataLen != h.DataLen {
			t.Fatalf("layout data length %d, header %d", dataLen, h.DataLen)
		}
		h2, err := ReadHeader(bytes.NewReader(hdr), int64(len(hdr))+int64(dataLen))
		if err != nil {
			t.Fatalf("re-read laid-out header: %v", err)
		}
		if len(h2.Tensors) != len(h.Tensors) {
			t.Fatalf("round trip lost tensors")
		}
		for i := range h.Tensors {
			a, b := h.Tensors[i], h2.Tensors[i]
			if a.Name != b.Name || a.DType != b.DType || a.Begin != b.Begin || a.End != b.End || !slices.Equal(a.Shape, b.Shape) {
				t.Fatalf("round trip: %+v != %+v", a, b)
			}
		}
	})
}
