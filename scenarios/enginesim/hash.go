package enginesim

import (
	"crypto/sha256"
	"encoding/binary"
)

// hashChain computes engine block hashes the way vLLM does in shape (not in
// bytes): h_i = sha256(h_{i-1} || tokens_i || extra_i) over full 32-byte
// digests, with h_{-1} = sha256(seed); the wire hash of a block is the last
// 8 bytes of h_i, big-endian (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
// extra_i is the LoRA name on every block and the cache salt on block 0, as
// vLLM's extra keys are. It is not Meridian's index hash, on purpose: the
// router must key blocks by their tokens, not by the engine's ids.
type hashChain struct {
	root [32]byte
}

func newHashChain(seed string) hashChain {
	return hashChain{root: sha256.Sum256([]byte("enginesim/none-hash/" + seed))}
}

// appendHashes appends the wire hashes of tokens' full blocks to dst.
func (c hashChain) appendHashes(dst []uint64, tokens []uint32, blockSize int, lora, salt string) []uint64 {
	h := sha256.New()
	parent := c.root
	buf := make([]byte, 0, 32+4*blockSize+len(lora)+len(salt)+2*binary.MaxVarintLen64+2)
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		buf = append(buf[:0], parent[:]...)
		for _, t := range tokens[i*blockSize : (i+1)*blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		if lora != "" {
			buf = append(buf, 1)
			buf = binary.AppendUvarint(buf, uint64(len(lora)))
			buf = append(buf, lora...)
		}
		if i == 0 && salt != "" {
			buf = append(buf, 2)
			buf = binary.AppendUvarint(buf, uint64(len(salt)))
			buf = append(buf, salt...)
		}
		h.Reset()
		h.Write(buf)
		h.Sum(parent[:0])
		dst = append(dst, binary.BigEndian.Uint64(parent[24:]))
	}
	return dst
}
