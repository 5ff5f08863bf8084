#include "textflag.h"

// func cpuHasPrefetchW() bool
TEXT ·cpuHasPrefetchW(SB), NOSPLIT, $0-1
	MOVL $0x80000001, AX
	XORL CX, CX
	CPUID
	SHRL $8, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET

// func prefetchw(lines []unsafe.Pointer)
TEXT ·prefetchw(SB), NOSPLIT, $0-24
	MOVQ lines_base+0(FP), SI
	MOVQ lines_len+8(FP), CX
	TESTQ CX, CX
	JZ donew
loopw:
	MOVQ (SI), AX
	// PREFETCHW (AX): 0F 0D /1, which the assembler has no name for.
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	ADDQ $8, SI
	DECQ CX
	JNZ loopw
donew:
	RET

// func prefetcht0(lines []unsafe.Pointer)
TEXT ·prefetcht0(SB), NOSPLIT, $0-24
	MOVQ lines_base+0(FP), SI
	MOVQ lines_len+8(FP), CX
	TESTQ CX, CX
	JZ donet
loopt:
	MOVQ (SI), AX
	PREFETCHT0 (AX)
	ADDQ $8, SI
	DECQ CX
	JNZ loopt
donet:
	RET
