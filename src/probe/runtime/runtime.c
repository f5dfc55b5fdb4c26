/* tp's in-target runtime: what an event probe runs on a hit.
 *
 * Built by build.rs into position-independent machine code with no
 * relocations (checked there), one blob per function, copied into each code
 * arena next to the detours. It touches only general-purpose registers
 * (-mgeneral-regs-only), so floating-point and vector arguments survive, and
 * reaches memory only through the `tp_ctx` pointer its caller passes, which
 * lies in tp's data region. No lock, no syscall on the hit path: a thread
 * asks the kernel for its TID at most once, and only when tp could not find
 * the TID inside the thread's TCB.
 *
 * The structures it shares with tp (struct tp_ctx, tp_slot, tp_frame,
 * tp_event) and their constants (event kinds TP_ENTRY..., the flags passed
 * to tp_entry, TP_PROBE_MASK) come from layout.h, which build.rs generates
 * from src/probe/layout.rs.
 */
#include <stdint.h>

#include "layout.h"  /* generated from src/probe/layout.rs, in OUT_DIR */
#include "runtime.h" /* the architecture's primitives, from src/arch/<arch>/ */

/* Frames deeper on the same stack than one that returns are dead; frames
 * farther away than this may live on another stack (a coroutine). */
#define TP_STACK_SPAN (8u << 20)
/* The sampling period of a function whose rate tp does not know yet. */
#define TP_FIRST_PERIOD 8
/* Slots probed before an event is dropped for want of one. */
#define TP_MAX_PROBES_FOR_SLOT 16

#define HOT static inline __attribute__((always_inline))

HOT struct tp_slot *slot_at(const struct tp_ctx *c, uint64_t i)
{
	return (struct tp_slot *)(c->slots + i * c->slot_size);
}

HOT struct tp_event *ring_of(const struct tp_ctx *c, struct tp_slot *s)
{
	return (struct tp_event *)((char *)s->shadow + (uint64_t)c->shadow_len * sizeof(struct tp_frame));
}

/* The calling thread's slot; claimed on its first event if `claim`. */
HOT struct tp_slot *thread_slot(struct tp_ctx *c, int claim)
{
	uint64_t tp = tp_thread_pointer();
	uint64_t n = 1ull << c->slot_bits;
	uint64_t h = ((tp >> 12) * 0x9e3779b97f4a7c15ull) >> (64 - c->slot_bits);
	for (uint64_t i = 0; i < TP_MAX_PROBES_FOR_SLOT && i < n; i++) {
		struct tp_slot *s = slot_at(c, (h + i) & (n - 1));
		uint64_t key = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (key == tp)
			return s;
		if (key != 0)
			continue;
		if (!claim)
			return 0;
		uint64_t expected = 0;
		if (__atomic_compare_exchange_n(&s->key, &expected, tp, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			if (c->tid_offset == 0)
				s->tid = tp_gettid();
			uint64_t k = (h + i) & (n - 1);
			__atomic_fetch_or(&c->claimed[k >> 6], 1ull << (k & 63), __ATOMIC_RELEASE);
			return s;
		}
		if (expected == tp)
			return s;
	}
	if (claim)
		__atomic_fetch_add(&c->lost_no_slot, 1, __ATOMIC_RELAXED);
	return 0;
}

HOT uint32_t thread_id(const struct tp_ctx *c, const struct tp_slot *s)
{
	if (c->tid_offset == 0)
		return s->tid;
	return *(const volatile uint32_t *)(tp_thread_pointer() + (int64_t)c->tid_offset);
}

/* Appends one event to the thread's ring, or counts it lost if the ring is full. */
HOT void emit(struct tp_ctx *c, struct tp_slot *s, uint32_t probe, uint64_t tsc, uint64_t v0, uint64_t v1,
	      uint64_t v2, uint64_t v3, uint64_t v4, uint64_t v5)
{
	uint64_t head = s->head;
	if (head - s->cached_tail > c->ring_mask) {
		s->cached_tail = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
		if (head - s->cached_tail > c->ring_mask) {
			s->lost++;
			return;
		}
	}
	struct tp_event *e = ring_of(c, s) + (head & c->ring_mask);
	e->probe = probe;
	e->tid = thread_id(c, s);
	e->tsc = tsc;
	e->v[0] = v0;
	e->v[1] = v1;
	e->v[2] = v2;
	e->v[3] = v3;
	e->v[4] = v4;
	e->v[5] = v5;
	__atomic_store_n(&s->head, head + 1, __ATOMIC_RELEASE);
}

/* Adds the ticks since `tsc` to the thread's time in tp. Only timed calls
 * that are live on the thread (`depth` frames) read it, so with none the
 * second timestamp is not taken: an entry event without return probes
 * costs one rdtsc, not two. */
HOT void account(struct tp_slot *s, uint32_t depth, uint64_t tsc)
{
	if (depth)
		s->overhead += tp_timestamp() - tsc;
}

/* The calls to let pass before the next sample: uniform in [0, 2p - 2],
 * so one call in p is sampled on average, at random (from the timestamp's
 * bits), never in step with a loop in the program. */
HOT uint64_t next_gap(uint32_t period, uint64_t tsc)
{
	if (period <= 1)
		return 0;
	uint64_t r = (tsc * 0x9e3779b97f4a7c15ull) >> 32;
	return r % (2 * (uint64_t)period - 1);
}

/* Function entry. `regs` holds the six integer argument registers in order;
 * `slot` is the stack address of the return address; `tramp` the return
 * trampoline to put there when the probe records returns. A sampling probe
 * calls here when its countdown in the thread's row ran out, and passes it
 * as `countdown`. */
void tp_entry(struct tp_ctx *c, uint32_t probe_flags, const uint64_t *regs, uint64_t *slot, uint64_t tramp,
	      uint64_t *countdown)
{
	/* When tp's work began: taken only when something reads it (an entry
	 * event, the sampler's random draw, or the time in tp of a timed call
	 * live on this thread). A return probe at the outermost level times
	 * its call with the one timestamp below and the exit's. */
	uint64_t tsc = 0;
	int have_tsc = 0;
	if (probe_flags & TP_SAMPLE) {
		tsc = tp_timestamp();
		have_tsc = 1;
		/* Sample this call, set the countdown to the next one, and spend
		 * one of this epoch's budget, which bounds the samples of a
		 * function whose calls suddenly became frequent until tp adapts
		 * its period. While tp does not know the function's rate yet
		 * (period 0), the first call in the row (its counter, next to the
		 * countdown, is 1) only arms the countdown at random: timing it
		 * would time the first call after an instant, which is more often
		 * one that follows a pause. */
		uint32_t probe = probe_flags & TP_PROBE_MASK;
		uint32_t period = ((const uint32_t *)c->periods)[probe];
		*countdown = next_gap(period ? period : TP_FIRST_PERIOD, tsc);
		int first = period == 0 && *(const uint64_t *)((uint64_t)countdown - c->countdowns_from_counters) == 1;
		if (first || __atomic_sub_fetch((int32_t *)c->budgets + probe, 1, __ATOMIC_RELAXED) < 0)
			return;
	}
	struct tp_slot *s = thread_slot(c, 1);
	if (!s)
		return;
	if (!have_tsc && ((probe_flags & TP_RECORD_ENTRY) || s->depth))
		tsc = tp_timestamp();
	uint32_t probe = probe_flags & TP_PROBE_MASK;
	if (probe_flags & TP_RECORD_ENTRY)
		emit(c, s, probe | (TP_ENTRY << TP_KIND_SHIFT), tsc, regs[0], regs[1], regs[2], regs[3], regs[4], regs[5]);
	if (probe_flags & TP_HIJACK_RETURN) {
		uint32_t d = s->depth;
		/* Frames left by longjmp: at or below this call's slot on the same
		 * stack, with their slot since overwritten. A live frame always
		 * still holds its trampoline, so this never drops one (also not
		 * for a signal handler running on an alternate stack). */
		uint64_t here = (uint64_t)slot;
		/* A frame whose slot a real call has since overwritten with its own
		 * return address is dead, and so is everything it called on this
		 * stack. (A tail call reuses the slot with the trampoline still in
		 * it: that frame is alive and returns through both exits.) */
		uint64_t current = *(volatile uint64_t *)slot;
		for (uint32_t k = d; k > 0; k--) {
			if (s->shadow[k - 1].slot != here || current == s->shadow[k - 1].tramp)
				continue;
			uint32_t keep = k - 1;
			for (uint32_t i = k; i < d; i++) {
				struct tp_frame *g = &s->shadow[i];
				if (g->slot <= here && here - g->slot < TP_STACK_SPAN)
					continue;
				s->shadow[keep++] = *g;
			}
			d = keep;
			break;
		}
		while (d > 0) {
			struct tp_frame *f = &s->shadow[d - 1];
			if (f->slot > here || here - f->slot >= TP_STACK_SPAN || *(volatile uint64_t *)f->slot == f->tramp)
				break;
			d--;
		}
		if (d >= c->shadow_len) {
			s->lost++; /* too deep: this call's exit goes unrecorded */
			account(s, d, tsc);
			return;
		}
		struct tp_frame *f = &s->shadow[d];
		f->slot = (uint64_t)slot;
		f->ret = *slot;
		f->probe = probe;
		f->tramp = tramp;
		/* The call is timed from here, after tp's own work; what tp spends
		 * in probes of the functions it calls is subtracted at its exit. */
		uint64_t now = tp_timestamp();
		if (d)
			s->overhead += now - tsc;
		f->tsc = now;
		f->overhead = s->overhead;
		__atomic_store_n(&s->depth, d + 1, __ATOMIC_RELEASE);
		*slot = tramp;
		return;
	}
	account(s, s->depth, tsc);
}

/* Function exit, from the return trampoline. `regs` holds the two return
 * registers; `sp` is the stack pointer after the function's return, one
 * word above the slot that held the return address. Returns where to go. */
uint64_t tp_exit(struct tp_ctx *c, const uint64_t *regs, uint64_t sp)
{
	uint64_t tsc = tp_timestamp();
	struct tp_slot *s = thread_slot(c, 0);
	if (!s)
		return 0;
	uint64_t want = sp - sizeof(uint64_t);
	uint32_t d = s->depth;
	while (d > 0) {
		struct tp_frame *f = &s->shadow[d - 1];
		if (f->slot == want) {
			uint64_t ret = f->ret, entry_tsc = f->tsc, nested = s->overhead - f->overhead;
			uint32_t probe = f->probe;
			/* Frames above it were left by longjmp (deeper on this stack):
			 * they are dead. Frames on other stacks are kept. */
			uint32_t keep = d - 1;
			for (uint32_t i = d; i < s->depth; i++) {
				struct tp_frame *g = &s->shadow[i];
				if (g->slot < want && want - g->slot < TP_STACK_SPAN)
					continue;
				s->shadow[keep++] = *g;
			}
			__atomic_store_n(&s->depth, keep, __ATOMIC_RELEASE);
			emit(c, s, probe | (TP_EXIT << TP_KIND_SHIFT), tsc, regs[0], entry_tsc, regs[1], nested, 0, 0);
			account(s, keep, tsc);
			return ret;
		}
		d--;
	}
	return 0; /* no frame: cannot happen for a return tp hijacked */
}

/* An exception starts unwinding (_Unwind_RaiseException and friends): put
 * every return address this thread's probes replaced back in place, so the
 * unwinder finds the real callers. */
void tp_unwind(struct tp_ctx *c)
{
	struct tp_slot *s = thread_slot(c, 0);
	if (!s)
		return;
	uint64_t tsc = tp_timestamp();
	for (uint32_t d = s->depth; d > 0; d--) {
		struct tp_frame *f = &s->shadow[d - 1];
		uint64_t *slot = (uint64_t *)f->slot;
		/* A frame whose slot no longer holds the trampoline died earlier
		 * (longjmp) and its stack was reused: leave that memory alone. */
		if (*slot == f->tramp) {
			*slot = f->ret;
			emit(c, s, f->probe | (TP_UNWOUND << TP_KIND_SHIFT), tsc, 0, f->tsc, 0, 0, 0, 0);
		}
	}
	__atomic_store_n(&s->depth, 0, __ATOMIC_RELEASE);
}
