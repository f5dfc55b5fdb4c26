/* AArch64 primitives for tp's in-target runtime (src/probe/runtime/runtime.c). */
#ifndef TP_RUNTIME_ARCH_H
#define TP_RUNTIME_ARCH_H

#include <stdint.h>

/* The thread pointer: TPIDR_EL0. */
static inline __attribute__((always_inline)) uint64_t tp_thread_pointer(void)
{
	uint64_t v;
	__asm__ volatile("mrs %0, tpidr_el0" : "=r"(v));
	return v;
}

/* The virtual counter (CNTVCT_EL0), readable from user space on Linux. */
static inline __attribute__((always_inline)) uint64_t tp_timestamp(void)
{
	uint64_t v;
	__asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v) : : "memory");
	return v;
}

/* gettid(2) (syscall 178), made once per thread when the TID's place in the TCB is unknown. */
static inline __attribute__((always_inline)) uint32_t tp_gettid(void)
{
	register uint64_t x8 __asm__("x8") = 178;
	register uint64_t x0 __asm__("x0");
	__asm__ volatile("svc #0" : "=r"(x0) : "r"(x8) : "memory");
	return (uint32_t)x0;
}

#endif
