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

/* A syscall of six arguments (process_vm_readv). */
static inline __attribute__((always_inline)) uint64_t tp_syscall6(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2,
								   uint64_t a3, uint64_t a4, uint64_t a5)
{
	register uint64_t x8 __asm__("x8") = nr;
	register uint64_t x0 __asm__("x0") = a0;
	register uint64_t x1 __asm__("x1") = a1;
	register uint64_t x2 __asm__("x2") = a2;
	register uint64_t x3 __asm__("x3") = a3;
	register uint64_t x4 __asm__("x4") = a4;
	register uint64_t x5 __asm__("x5") = a5;
	__asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
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

/* The word a detour finds the thread's entries of the private area's
 * caches by: none. AArch64 detours count with atomic adds in the row their
 * thread pointer hashes to and read no cache. */
static inline __attribute__((always_inline)) uint64_t tp_detour_word(void)
{
	return 0;
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

/* TPIDR_EL0 points at the TCB of glibc and musl (TLS variant I): their
 * thread descriptor, with the TID, lies at a fixed offset from it, which
 * tp finds in every thread it saw at attach (Arch::tid_offset). Nothing at
 * the TCB itself tells it apart from another runtime's block: the runtime
 * uses the TID there only where it is the thread's own when it takes its
 * state (runtime.c, adopt). */
static inline __attribute__((always_inline)) int tp_key_is_tcb(uint64_t key)
{
	(void)key;
	return 1;
}

/* A code address without its pointer authentication code (xpaclri, in the
 * hint space: it leaves the address as it is on a CPU without PAC). */
static inline __attribute__((always_inline)) uint64_t tp_strip(uint64_t p)
{
	register uint64_t lr __asm__("x30") = p;
	__asm__("hint #7" : "+r"(lr)); /* xpaclri */
	return lr;
}

/* `p` signed as paciasp (key A) or pacibsp (key B) would have signed it at
 * a function's entry with stack pointer `sp`: pacia1716 and pacib1716, in
 * the hint space (no change without PAC). */
static inline __attribute__((always_inline)) uint64_t tp_sign(uint64_t p, uint64_t sp, int key_b)
{
	register uint64_t x17 __asm__("x17") = p;
	register uint64_t x16 __asm__("x16") = sp;
	if (key_b)
		__asm__("hint #10" : "+r"(x17) : "r"(x16)); /* pacib1716 */
	else
		__asm__("hint #8" : "+r"(x17) : "r"(x16)); /* pacia1716 */
	return x17;
}

/* The call's return address at its function's entry (--by caller): the
 * link register x30 as the call left it, which the detour stores in the
 * slot (entry SP - 8) before it calls tp_entry. At entry it is not signed
 * yet (a function signs it in its own prologue, after the detour). */
static inline __attribute__((always_inline)) uint64_t tp_return_address(const uint64_t *slot)
{
	return *(const volatile uint64_t *)slot;
}

/* A call leaves the return address in the link register (x30), which the
 * detour replaced with the trampoline; a function that calls others saves
 * it in its frame, at the offset below its entry stack pointer that its
 * call frame information gives (tp reads it from .eh_frame, the detour
 * leaves it in the word below the slot: 0 if the function never saves it
 * or tp could not tell). The slot itself (entry SP - 8) is the frame's
 * identity only: tp_exit finds the frame by the stack pointer the function
 * returns with, which AAPCS64 makes the one it was entered with. */
static inline __attribute__((always_inline)) void tp_frame_note(struct tp_frame *f, const uint64_t *slot)
{
	uint64_t below = slot[-1];
	f->ra_at = below ? f->slot + 8 - below : 0;
}

/* Bytes below a frame's entry stack pointer searched for its trampoline
 * where it is not where the function saves its return address: a tail
 * call freed the function's frame, and the callee saved the trampoline in
 * its own frame, which begins at the same stack pointer. */
#define TP_TAIL_SEARCH 4096u
/* Frames farther above the stack pointer than this may live on another
 * stack (a coroutine's), which is not searched. */
#define TP_SAME_STACK (8u << 20)

/* The word in [lo, hi) that holds frame `f`'s trampoline, plain or signed
 * (stripped, it is the trampoline), or 0. */
static inline __attribute__((always_inline)) uint64_t *tp_find_tramp(const struct tp_frame *f, uint64_t lo,
								      uint64_t hi)
{
	for (uint64_t p = (lo + 7) & ~7ull; p + 8 <= hi; p += 8)
		if (tp_strip(*(const volatile uint64_t *)p) == f->tramp)
			return (uint64_t *)p;
	return 0;
}

/* True unless the frame is certainly dead: where the function saved its
 * return address (or, after a tail call, somewhere in the frame it left)
 * no longer holds the trampoline. A frame that keeps its return address
 * in the register (a leaf), or whose saving tp does not know, counts as
 * live: it is dropped only when a call that does not return through the
 * trampoline enters at its own stack pointer (tp_entry). */
static inline __attribute__((always_inline)) int tp_frame_live(const struct tp_frame *f)
{
	if (!f->ra_at)
		return 1;
	if (tp_strip(*(const volatile uint64_t *)f->ra_at) == f->tramp)
		return 1;
	return tp_find_tramp(f, f->ra_at, f->slot + 8) != 0;
}

/* Puts the original return address where `at` holds the trampoline,
 * signed as the trampoline was (the function's paciasp or pacibsp, whose
 * modifier is its entry stack pointer, which the unwinder also uses);
 * false if `at` holds it signed some other way. */
static inline __attribute__((always_inline)) int tp_put_back(const struct tp_frame *f, uint64_t *at)
{
	uint64_t w = *at, sp = f->slot + 8;
	for (int key_b = -1; key_b <= 1; key_b++) {
		uint64_t t = key_b < 0 ? f->tramp : tp_sign(f->tramp, sp, key_b);
		if (w == t) {
			*at = key_b < 0 ? f->ret : tp_sign(f->ret, sp, key_b);
			return 1;
		}
	}
	return 0;
}

/* Unwinding starts at stack pointer *sp (innermost frames first): the
 * frame's return address goes back where the function saved it, or where
 * a tail callee did, and *sp moves up to the frame's entry stack pointer.
 * A frame that is not above *sp (another stack, or dead), or whose
 * trampoline is found nowhere (it keeps it in the register, or tp does not
 * know where it saves it: an unwinder could not pass it either) is kept. */
static inline __attribute__((always_inline)) int tp_frame_give_back(const struct tp_frame *f, uint64_t *sp)
{
	uint64_t lo = *sp, hi = f->slot + 8;
	if (hi <= lo || hi - lo > TP_SAME_STACK)
		return TP_FRAME_KEPT;
	int done = 0;
	if (f->ra_at >= lo && f->ra_at < hi && tp_strip(*(const volatile uint64_t *)f->ra_at) == f->tramp)
		done = tp_put_back(f, (uint64_t *)f->ra_at);
	if (!done) {
		uint64_t from = hi - lo > TP_TAIL_SEARCH ? hi - TP_TAIL_SEARCH : lo;
		for (uint64_t *at; (at = tp_find_tramp(f, from, hi)) != 0; from = (uint64_t)at + 8)
			done |= tp_put_back(f, at);
	}
	if (!done)
		return TP_FRAME_KEPT;
	*sp = hi;
	return TP_FRAME_GIVEN_BACK;
}

/* No in-target stepping engine: user code cannot single-step itself here
 * (MDSCR_EL1.SS, the step bit, is the kernel's), and tp refuses the
 * engine before it installs anything. These keep runtime.c whole. */
#define TP_HAS_TRAP_FLAG 0
#define TP_TRAP_TRACE 2

static inline __attribute__((always_inline)) void tp_trap_flag_on(void)
{
}

static inline __attribute__((always_inline)) uint64_t tp_uc_pc(void *uc)
{
	(void)uc;
	return 0;
}

static inline __attribute__((always_inline)) uint64_t tp_uc_sp(void *uc)
{
	(void)uc;
	return 0;
}

static inline __attribute__((always_inline)) void tp_uc_trap_flag_off(void *uc)
{
	(void)uc;
}

static inline __attribute__((always_inline)) uint32_t tp_uc_syscall_ends_trace(void *uc)
{
	(void)uc;
	return 0;
}

#endif
