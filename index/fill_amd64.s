#include "textflag.h"

// func fillSet(out unsafe.Pointer, ids *[MaxPods]atomic.Uint64, set []uint64, blocks int) int
TEXT ·fillSet(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ ids+8(FP), SI
	MOVQ set_base+16(FP), R8
	MOVQ set_len+24(FP), CX
	MOVQ blocks+40(FP), R9
	MOVQ DI, R10
	TESTQ CX, CX
	JZ done
word:
	MOVQ (R8), AX
	TESTQ AX, AX
	JZ next
bit:
	// One pod: its slot's PodID and the blocks, 16 bytes at DI.
	TZCNTQ AX, BX
	MOVQ (SI)(BX*8), R11
	MOVQ R11, (DI)
	MOVQ R9, 8(DI)
	LEAQ 16(DI), DI
	LEAQ -1(AX), DX
	ANDQ DX, AX
	JNZ bit
next:
	// The next word's slots are 64 PodIDs (512 bytes) further on.
	ADDQ $8, R8
	ADDQ $512, SI
	DECQ CX
	JNZ word
done:
	SUBQ R10, DI
	SHRQ $4, DI
	MOVQ DI, ret+48(FP)
	RET
