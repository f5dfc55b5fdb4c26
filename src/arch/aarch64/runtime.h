/* AArch64 primitives for tp's in-target runtime (src/probe/runtime/runtime.c). */
#ifndef TP_RUNTIME_ARCH_H
#define TP_RUNTIME_ARCH_H

#include <stdint.h>

#include "syscalls.h" /* TP_SYS_*: generated from src/arch/syscalls.rs, in OUT_DIR */

static inline __attribute__((always_inline)) uint64_t tp_syscall4(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2,
								   uint64_t a3)
{
	register uint64_t x8 __asm__("x8") = nr;
	register uint64_t x0 __asm__("x0") = a0;
	register uint64_t x1 __asm__("x1") = a1;
	register uint64_t x2 __asm__("x2") = a2;
	register uint64_t x3 __asm__("x3") = a3;
	__asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
	return x0;
}

/* The thread's key: TPIDR_EL0, the thread pointer every runtime that has
 * threads sets (glibc's and musl's TCB); 0 for a thread that has none (a
 * pure Go program's), which then tells itself apart by its TID. `how` is
 * the same on every AArch64 thread. */
static inline __attribute__((always_inline)) uint64_t tp_thread_key(uint32_t how)
{
	uint64_t v;
	(void)how;
	__asm__ volatile("mrs %0, tpidr_el0" : "=r"(v));
	return v;
}

/* The frame pointer (x29) as the probed function received it: its
 * caller's frame record (AAPCS64 keeps one per frame). Only the runtime's
 * `_ext` functions read it: build.rs compiles them with
 * TP_RESERVE_FRAME_POINTER, which makes x29 a global register variable,
 * so no code of that build uses it for anything else. */
#ifdef TP_RESERVE_FRAME_POINTER
register uint64_t tp_frame_register __asm__("x29");
static inline __attribute__((always_inline)) uint64_t tp_frame_pointer(void)
{
	return tp_frame_register;
}
#endif

/* The virtual counter (CNTVCT_EL0), readable from user space on Linux. */
static inline __attribute__((always_inline)) uint64_t tp_timestamp(void)
{
	uint64_t v;
	__asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v) : : "memory");
	return v;
}

#endif
