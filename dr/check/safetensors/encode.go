package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Layout assigns contiguous data offsets to tensors in the order given
// (ignoring their Begin and End) and returns the encoded 8-byte prefix plus
// JSON header, padded with spaces to a multiple of 8 bytes as the reference
// writer does, and the length of the data buffer that must follow.
func Layout(tensors []Tensor, metadata map[string]string) (header []byte, dataLen uint64, err error) {
	obj := make(map[string]any, len(tensors)+1)
	if metadata != nil {
		obj["__metadata__"] = metadata
	}
	var off uint64
	for i := range tensors {
		t := &tensors[i]
		n, ok := ByteLen(t.DType, t.Shape)
		if !ok {
			return nil, 0, fmt.Errorf("layout tensor %q: bad dtype %q or shape %v", t.Name, t.DType, t.Shape)
		}
		if _, dup := obj[t.Name]; dup {
			return nil, 0, fmt.Errorf("layout tensor %q: duplicate name", t.Name)
		}
		t.Begin, t.End = off, off+n
		off += n
		shape := t.Shape
		if shape == nil {
			shape = []uint64{}
		}
		obj[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": [2]uint64{t.Begin, t.End}}
	}
	js, err := json.Marshal(obj)
	if err != nil {
		return nil, 0, fmt.Errorf("layout: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := make([]byte, PrefixLen, PrefixLen+len(js))
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	return append(out, js...), off, nil
}
