/* x86-64 primitives for tp's in-target runtime (src/probe/runtime/runtime.c). */
#ifndef TP_RUNTIME_ARCH_H
#define TP_RUNTIME_ARCH_H

#include <stdint.h>

/* The thread pointer: glibc and musl keep the TCB's own address at fs:0. */
static inline __attribute__((always_inline)) uint64_t tp_thread_pointer(void)
{
	uint64_t v;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(v));
	return v;
}

/* The time-stamp counter (invariant on the CPUs tp targets). */
static inline __attribute__((always_inline)) uint64_t tp_timestamp(void)
{
	uint32_t lo, hi;
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

/* gettid(2), made once per thread when the TID's place in the TCB is unknown. */
static inline __attribute__((always_inline)) uint32_t tp_gettid(void)
{
	uint64_t ret;
	__asm__ volatile("syscall" : "=a"(ret) : "0"(186ull) : "rcx", "r11", "memory");
	return (uint32_t)ret;
}

#endif
