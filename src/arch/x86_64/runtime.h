/* x86-64 primitives for tp's in-target runtime (src/probe/runtime/runtime.c). */
#ifndef TP_RUNTIME_ARCH_H
#define TP_RUNTIME_ARCH_H

#include <stdint.h>

#include "syscalls.h" /* TP_SYS_*: generated from src/arch/syscalls.rs, in OUT_DIR */

static inline __attribute__((always_inline)) uint64_t tp_syscall4(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2,
								   uint64_t a3)
{
	register uint64_t r10 __asm__("r10") = a3;
	uint64_t ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"(nr), "D"(a0), "S"(a1), "d"(a2), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

/* A syscall of six arguments (process_vm_readv). */
static inline __attribute__((always_inline)) uint64_t tp_syscall6(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2,
								   uint64_t a3, uint64_t a4, uint64_t a5)
{
	register uint64_t r10 __asm__("r10") = a3;
	register uint64_t r8 __asm__("r8") = a4;
	register uint64_t r9 __asm__("r9") = a5;
	uint64_t ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"(nr), "D"(a0), "S"(a1), "d"(a2), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

/* The thread's key: its FS base, which tells threads apart on any runtime
 * (glibc's and musl's TCB, Go's m.tls, ...). `how` is the region's
 * key_how: the word at fs:0, where glibc and musl keep the TCB's own
 * address (the FS base), as every thread tp saw at attach did (a load);
 * where that word is 0 (Go's threads), or for a program whose threads did
 * not keep it, rdfsbase where the kernel enables FSGSBASE, else the
 * kernel's answer (arch_prctl). 0 only for a thread without an FS base. */
static inline __attribute__((always_inline)) uint64_t tp_thread_key(uint32_t how)
{
	uint64_t v;
	if (__builtin_expect(how == TP_KEY_TCB_REGISTER || how == TP_KEY_TCB, 1)) {
		__asm__ volatile("mov %%fs:0, %0" : "=r"(v));
		if (__builtin_expect(v != 0, 1))
			return v;
	}
	if (how == TP_KEY_REGISTER || how == TP_KEY_TCB_REGISTER) {
		__asm__ volatile("rdfsbase %0" : "=r"(v));
		return v;
	}
	v = 0;
	tp_syscall4(TP_SYS_ARCH_PRCTL, TP_SYS_ARCH_PRCTL_ARG0 /* ARCH_GET_FS */, (uint64_t)&v, 0, 0);
	return v;
}

/* The word a detour finds the thread's entries of the private area's
 * caches by (struct tp_proc): the word at fs:0, which glibc and musl keep
 * equal to the FS base (a TCB's own address). */
static inline __attribute__((always_inline)) uint64_t tp_detour_word(void)
{
	uint64_t v;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(v));
	return v;
}

/* The frame pointer (rbp) as the probed function received it: its
 * caller's frame record when the caller keeps frame pointers. Only the
 * runtime's `_ext` functions read it: build.rs compiles them with
 * TP_RESERVE_FRAME_POINTER, which makes rbp a global register variable, so
 * no code of that build uses it for anything else. */
#ifdef TP_RESERVE_FRAME_POINTER
register uint64_t tp_frame_register __asm__("rbp");
static inline __attribute__((always_inline)) uint64_t tp_frame_pointer(void)
{
	return tp_frame_register;
}
#endif

/* The time-stamp counter (invariant on the CPUs tp targets). */
static inline __attribute__((always_inline)) uint64_t tp_timestamp(void)
{
	uint32_t lo, hi;
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

/* A TCB keeps its own address in its first word (glibc, musl), where the
 * key is the FS base: then its TID lies at the offset tp found. Go's m.tls
 * and other runtimes' blocks do not. */
static inline __attribute__((always_inline)) int tp_key_is_tcb(uint64_t key)
{
	return *(const volatile uint64_t *)key == key;
}

/* The call's return address at its function's entry (--by caller): a
 * `call` pushed it, so it is the word at [rsp] on entry, which is the
 * slot the detour passes (tp_entry's `slot`). */
static inline __attribute__((always_inline)) uint64_t tp_return_address(const uint64_t *slot)
{
	return *(const volatile uint64_t *)slot;
}

/* A return frame's slot is where the call put the return address, which
 * the function returns through: nothing more to note. */
static inline __attribute__((always_inline)) void tp_frame_note(struct tp_frame *f, const uint64_t *slot)
{
	(void)f;
	(void)slot;
}

/* True while the frame's slot holds the trampoline. */
static inline __attribute__((always_inline)) int tp_frame_live(const struct tp_frame *f)
{
	return *(const volatile uint64_t *)f->slot == f->tramp;
}

/* Unwinding starts: the return address goes back into the slot, if the
 * slot still holds the trampoline (else the frame died earlier). */
static inline __attribute__((always_inline)) int tp_frame_give_back(const struct tp_frame *f, uint64_t *sp)
{
	(void)sp;
	if (!tp_frame_live(f))
		return TP_FRAME_DEAD;
	*(uint64_t *)f->slot = f->ret;
	return TP_FRAME_GIVEN_BACK;
}

/* The in-target stepping engine (`--step-engine trap`): the trap flag
 * makes the CPU raise a debug exception after each instruction, which the
 * kernel delivers as SIGTRAP (si_code TRAP_TRACE) to the handler tp
 * installed (tp_trap). A popf that sets the flag takes effect after the
 * instruction that follows it. */
#define TP_HAS_TRAP_FLAG 1
#define TP_EFLAGS_TF 0x100ull
/* si_code of a single-step trap. */
#define TP_TRAP_TRACE 2

static inline __attribute__((always_inline)) void tp_trap_flag_on(void)
{
	__asm__ volatile("pushfq; orq %0, (%%rsp); popfq" : : "i"(TP_EFLAGS_TF) : "memory", "cc");
}

/* The registers a signal handler's ucontext keeps (the kernel's struct
 * ucontext: flags, link, stack_t, then struct sigcontext: r8..r15, rdi,
 * rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags). */
#define TP_UC_GREG(uc, i) (((uint64_t *)((char *)(uc) + 40))[i])
#define TP_UC_RDI 8
#define TP_UC_RSI 9
#define TP_UC_RAX 13
#define TP_UC_RSP 15
#define TP_UC_RIP 16
#define TP_UC_EFLAGS 17

static inline __attribute__((always_inline)) uint64_t tp_uc_pc(void *uc)
{
	return TP_UC_GREG(uc, TP_UC_RIP);
}

static inline __attribute__((always_inline)) uint64_t tp_uc_sp(void *uc)
{
	return TP_UC_GREG(uc, TP_UC_RSP);
}

/* The thread goes on without the flag once the handler returns. */
static inline __attribute__((always_inline)) void tp_uc_trap_flag_off(void *uc)
{
	TP_UC_GREG(uc, TP_UC_EFLAGS) &= ~TP_EFLAGS_TF;
}

/* The syscall the thread is about to make, if the trace must end before
 * it: one that could block SIGTRAP (rt_sigprocmask but SIG_UNBLOCK, and
 * rt_sigreturn, which sets a mask from the stack), or put another handler
 * in tp_trap's place (rt_sigaction of SIGTRAP). A trap taken while
 * SIGTRAP is blocked kills the process. Else 0. The instruction's first
 * byte is read before its second: `0f` begins no one-byte instruction, so
 * its second byte is mapped too. */
static inline __attribute__((always_inline)) uint32_t tp_uc_syscall_ends_trace(void *uc)
{
	const volatile uint8_t *pc = (const volatile uint8_t *)tp_uc_pc(uc);
	if (pc[0] != 0x0f || pc[1] != 0x05)
		return 0;
	uint64_t nr = TP_UC_GREG(uc, TP_UC_RAX), a0 = TP_UC_GREG(uc, TP_UC_RDI), a1 = TP_UC_GREG(uc, TP_UC_RSI);
	if (nr == TP_SYS_RT_SIGPROCMASK && a1 != 0 && a0 != 1 /* SIG_UNBLOCK */)
		return (uint32_t)nr;
	if (nr == TP_SYS_RT_SIGACTION && a0 == 5 /* SIGTRAP */ && a1 != 0)
		return (uint32_t)nr;
	if (nr == TP_SYS_RT_SIGRETURN)
		return (uint32_t)nr;
	return 0;
}

#endif
