/* tp's in-target runtime: what an event probe runs on a hit.
 *
 * Built by build.rs into position-independent machine code with no
 * relocations (checked there), one blob per function, copied into each code
 * arena next to the detours. It touches only general-purpose registers
 * (-mgeneral-regs-only), so floating-point and vector arguments survive, and
 * reaches memory only through the `tp_ctx` pointer its caller passes, which
 * lies in tp's data region. No lock and no syscall on the hit path: a
 * thread asks the kernel for its TID (and a process for its PID) once, on
 * its first event.
 *
 * Memory, and what a fork does to it:
 * - The data region (MAP_SHARED, one for the process and every child it
 *   forks): counters, flags, and the rings. A ring has one writer, a thread
 *   of one process, which claims the ring's slot on its first event (the
 *   slot's key is its PID and TID); tp frees the slots of processes that
 *   ended.
 * - The private area (anonymous, MAP_PRIVATE: a fork copies it): one state
 *   per thread, found by the thread's key (its FS base / TPIDR_EL0), with
 *   the thread's shadow stack of return frames and its ring slot. A child
 *   returns through its own copy of the frames that were live at the fork;
 *   parent and child never pop each other's.
 * - The private area's first page (tp_proc, MADV_WIPEONFORK): a child reads
 *   zeros there, so its first event learns that it is a new process: each
 *   of its threads then takes its state afresh (a ring slot and a counter
 *   row of its own; the frames only of the thread that forked, which in the
 *   child is the one whose TID is the PID: the other states were its
 *   parent's other threads, which the child does not have). The page also
 *   holds the caches the detours read (see tp_count), which a child thus
 *   starts without.
 *
 * Counting (x86-64): each thread adds to a counter row of its own with a
 * plain increment, no lock, so two threads never write one row; a detour
 * finds the row in the thread cache, by the word at the thread pointer, and
 * calls tp_count when it does not (a thread's first call in a process, a
 * thread whose cache entry another took, a thread with no row of its own).
 *
 * The structures it shares with tp (struct tp_ctx, tp_slot, tp_frame,
 * tp_event, tp_proc, tp_thread) and their constants come from layout.h,
 * which build.rs generates from src/layout.rs.
 */
#include <stdint.h>

#include "layout.h" /* generated from src/layout.rs, in OUT_DIR */

/* What the architecture's tp_frame_give_back did with a frame when
 * unwinding starts: nothing (the frame died earlier), put its return
 * address back, or kept it (it stays on the shadow stack). */
enum { TP_FRAME_DEAD, TP_FRAME_GIVEN_BACK, TP_FRAME_KEPT };

#include "runtime.h" /* the architecture's primitives, from src/arch/<arch>/ */

#include "threads.h" /* the process, its threads, their ring slots and counter rows */

/* A call of probe `probe` that its detour did not count: the thread found
 * no entry of its own in the thread cache (its first call in this process,
 * an entry another thread took, no row of its own, a word at the thread
 * pointer that does not tell it apart). Counts it in the thread's row,
 * taking one if it has none, lets the detours find the row from now on, and
 * returns the row's address (a sampling detour counts down there). The add
 * is atomic: one instruction, like the detour's, which a signal handler
 * counting on the same thread cannot split. */
uint64_t tp_count(struct tp_ctx *c, uint32_t probe)
{
	uint32_t row = 0;
	/* A thread whose word is 0 (Go's) never finds an entry, and one the
	 * kernel must tell apart would pay a system call per call: both count
	 * in the shared row. */
	struct tp_thread *t = 0;
	/* Taking a state and a row makes syscalls (getpid, gettid, kill(pid,
	 * 0)), which tp found every thread's seccomp filters let run, or not:
	 * then every thread counts in the shared row. */
	if (c->may_take_rows && tp_detour_word() != 0 &&
	    (c->key_how == TP_KEY_TCB || c->key_how == TP_KEY_TCB_REGISTER || c->key_how == TP_KEY_REGISTER))
		t = thread_state(c, 1);
	if (t) {
		row = counter_row(c, t);
		remember(c, t);
	}
	uint64_t counters = c->counters + ((uint64_t)(row < TP_ROWS ? row : 0) << c->stride_shift);
	__atomic_fetch_add((uint64_t *)counters + probe, 1, __ATOMIC_RELAXED);
	return counters;
}

#include "events.h" /* writing events, time in tp, sampling, live frames */

#include "record.h" /* predicates, stacks and aggregates: the `_ext` functions' blocks */
#include "goroutines.h" /* timed calls of Go code, kept per goroutine */

/* A call timed at its function's exits begins at stack slot `slot`: the
 * frames it shows dead go (settle), and its own is pushed, keyed by the
 * slot and the probe, which its exit finds by the same slot (x86-64: where
 * its return address is; AArch64: the word below the entry stack pointer).
 * Nothing is written to the stack. The frame is published as an entry's
 * hijacked one is (see entry()). */
HOT struct tp_frame *push_timed(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t slot, uint64_t tsc)
{
	uint32_t d = settle(c, t, slot, 1, tsc);
	if (d >= TP_SHADOW_LEN) {
		lose_too_deep(c); /* this call's exit goes unrecorded */
		account(t, d, tsc);
		return 0;
	}
	struct tp_frame *f = &t->shadow[d];
	f->slot = slot;
	f->children = 0;
	__atomic_store_n(&t->depth, d + 1, __ATOMIC_RELEASE);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	f->slot = slot;
	f->ret = *(const uint64_t *)slot;
	f->probe = probe;
	f->tramp = 0;
	f->ra_at = 0;
	uint64_t now = tp_timestamp();
	if (d)
		t->overhead += now - tsc;
	f->tsc = now;
	f->overhead = t->overhead;
	return f;
}

/* An entry of a probe timed at its exits that times nothing (a sample not
 * taken, a call its predicate rejects) still settles the frames it shows
 * dead, so that an exit never pairs with a frame a longjmp left in its
 * slot: the thread's, or for Go code (`flags` TP_GO_FRAMES) goroutine
 * `g`'s. */
HOT void settle_at_entry(struct tp_ctx *c, uint64_t slot, uint32_t flags, uint64_t g);

HOT void settle_at_entry(struct tp_ctx *c, uint64_t slot, uint32_t flags, uint64_t g)
{
	if (flags & TP_GO_FRAMES) {
		uint64_t off = go_offset(g, slot);
		struct tp_goroutine *e = off ? goroutine(c, g, 0) : 0;
		if (e && e->depth)
			go_settle(c, thread_state(c, 0), e, off, 1, tp_timestamp());
		return;
	}
	struct tp_thread *t = thread_state(c, 0);
	if (t && t->depth)
		settle(c, t, slot, 1, tp_timestamp());
}

/* Function entry. `regs` holds the integer argument registers in order (six,
 * or nine where TP_RECORD_MORE says so); `slot` is the stack address of
 * the return address (see runtime.h for where a call leaves it in a
 * register); `tramp` the return trampoline to put there when the probe
 * records returns by replacing the return address (for Go code timed at
 * its exits, TP_GO_FRAMES, the goroutine: goroutines.h). A sampling probe
 * calls here when its countdown in the
 * thread's row ran out, and passes it as `countdown`. `ext` (a constant)
 * adds what tp_entry_ext does beyond tp_entry: predicates, counts by
 * value, stacks. */
HOT void entry(struct tp_ctx *c, uint32_t probe_flags, const uint64_t *regs, uint64_t *slot, uint64_t tramp,
	       uint64_t *countdown, const int ext)
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
		 * one that follows a pause. Countdowns and budgets are shared by
		 * the processes of a family (the counter rows are): a child only
		 * moves when the next sample is taken, never what is recorded. */
		uint32_t probe = probe_flags & TP_PROBE_MASK;
		uint32_t period = ((const uint32_t *)c->periods)[probe];
		*countdown = next_gap(period ? period : TP_FIRST_PERIOD, tsc);
		int first = period == 0 && *(const uint64_t *)((uint64_t)countdown - c->countdowns_from_counters) == 1;
		if (first || __atomic_sub_fetch((int32_t *)c->budgets + probe, 1, __ATOMIC_RELAXED) < 0) {
			if (probe_flags & TP_TIME_CALL)
				settle_at_entry(c, (uint64_t)slot, probe_flags, tramp);
			return;
		}
	}
	/* A call its predicate rejects costs nothing more (but that a call
	 * timed at its exits settles the frames it shows dead). */
	if (ext && (probe_flags & TP_FILTER) && !passes_entry(c, probe_flags, regs)) {
		if (probe_flags & TP_TIME_CALL)
			settle_at_entry(c, (uint64_t)slot, probe_flags, tramp);
		return;
	}
	struct tp_thread *t = thread_state(c, 1);
	if (UNLIKELY(!t)) {
		lose(c, 0, !!(probe_flags & TP_RECORD_ENTRY) + !!(probe_flags & (TP_HIJACK_RETURN | TP_TIME_CALL)));
		return;
	}
	remember(c, t);
	if (!have_tsc && ((probe_flags & TP_RECORD_ENTRY) || t->depth))
		tsc = tp_timestamp();
	uint32_t probe = probe_flags & TP_PROBE_MASK;
	if (ext && (probe_flags & TP_BY))
		count_by(c, t, probe, regs, slot);
	int more = UNLIKELY(probe_flags & TP_RECORD_MORE) && (probe_flags & TP_RECORD_ENTRY);
	if (ext && (probe_flags & TP_STACK))
		emit_with_stack(c, t, probe, tsc, regs, slot, more);
	else if (probe_flags & TP_RECORD_ENTRY)
		emit_entry(c, t, probe, tsc, regs, more);
	if (probe_flags & TP_HIJACK_RETURN) {
		uint32_t d = t->depth;
		uint64_t here = (uint64_t)slot;
		/* A frame whose slot a real call has since overwritten with its own
		 * return address is dead (longjmp left it), and so is whatever it
		 * called on this stack that no longer holds its trampoline. (A tail
		 * call reuses the slot with the trampoline still in it: that frame
		 * is alive and returns through both exits.) */
		uint64_t current = *(volatile uint64_t *)slot;
		for (uint32_t k = d; k > 0; k--) {
			if (t->shadow[k - 1].slot != here || current == t->shadow[k - 1].tramp)
				continue;
			uint32_t keep = k - 1;
			gone(c, t, &t->shadow[k - 1], tsc);
			for (uint32_t i = k; i < d; i++) {
				struct tp_frame *g = &t->shadow[i];
				if (g->slot <= here && here - g->slot < TP_STACK_SPAN && !still_hijacked(g)) {
					gone(c, t, g, tsc);
					continue;
				}
				t->shadow[keep++] = *g;
			}
			d = keep;
			break;
		}
		/* Frames left on top by longjmp: at or below this call's slot on
		 * the same stack, their slots since reused. */
		while (d > 0) {
			struct tp_frame *f = &t->shadow[d - 1];
			if (f->slot > here || here - f->slot >= TP_STACK_SPAN || still_hijacked(f))
				break;
			gone(c, t, f, tsc);
			d--;
		}
		if (d >= TP_SHADOW_LEN) {
			t->depth = d;
			lose_too_deep(c); /* this call's exit goes unrecorded */
			account(t, d, tsc);
			return;
		}
		/* The frame's slot is written before the depth that publishes it,
		 * and the whole frame after: a signal handler whose probes run on
		 * this thread before the depth is published takes frame d itself
		 * and leaves the depth as it found it; one after sees a frame that
		 * is this call's, and takes the next. */
		struct tp_frame *f = &t->shadow[d];
		f->slot = (uint64_t)slot;
		f->children = 0;
		__atomic_store_n(&t->depth, d + 1, __ATOMIC_RELEASE);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		f->slot = (uint64_t)slot;
		f->ret = *slot;
		f->probe = probe;
		/* What the frame keeps for a value its exit adds (record.h). */
		if (ext && (probe_flags & TP_BY))
			f->key = frame_key(c, probe, regs);
		f->tramp = tramp;
		tp_frame_note(f, slot);
		/* The call is timed from here, after tp's own work; what tp spends
		 * in probes of the functions it calls is subtracted at its exit. */
		uint64_t now = tp_timestamp();
		if (d)
			t->overhead += now - tsc;
		f->tsc = now;
		f->overhead = t->overhead;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		*slot = tramp;
		return;
	}
	if (probe_flags & TP_TIME_CALL) {
		if (probe_flags & TP_GO_FRAMES)
			go_push(c, t, tramp, (uint64_t)slot, probe, tsc);
		else {
			struct tp_frame *f = push_timed(c, t, probe, (uint64_t)slot, tsc);
			if (ext && (probe_flags & TP_BY) && f)
				f->key = frame_key(c, probe, regs);
		}
		return;
	}
	account(t, t->depth, tsc);
}

void tp_entry(struct tp_ctx *c, uint32_t probe_flags, const uint64_t *regs, uint64_t *slot, uint64_t tramp,
	      uint64_t *countdown)
{
	entry(c, probe_flags, regs, slot, tramp, countdown, 0);
}

/* tp_entry for a probe with a predicate, a count by value or a stack (the
 * detour calls this one instead); compiled with the frame pointer
 * reserved (see build.rs), so the stack walk reads the function's. */
void tp_entry_ext(struct tp_ctx *c, uint32_t probe_flags, const uint64_t *regs, uint64_t *slot, uint64_t tramp,
		  uint64_t *countdown)
{
	entry(c, probe_flags, regs, slot, tramp, countdown, 1);
}

/* The frame whose slot is `want` in another thread's state of this process:
 * a thread whose key changed since it entered (it set a new FS base), or a
 * coroutine that moved to another thread. Read only: the state is another
 * thread's. 0 if there is none. */
HOT uint64_t frame_elsewhere(const struct tp_ctx *c, const struct tp_thread *mine, uint64_t want)
{
	for (uint64_t i = 0; i < TP_SLOTS; i++) {
		const struct tp_thread *t = thread_at(c, i);
		if (t == mine || __atomic_load_n(&t->key, __ATOMIC_ACQUIRE) == 0)
			continue;
		uint32_t d = __atomic_load_n(&t->depth, __ATOMIC_ACQUIRE);
		if (d > TP_SHADOW_LEN)
			d = TP_SHADOW_LEN;
		while (d > 0) {
			const struct tp_frame *f = &t->shadow[--d];
			if (f->slot == want && f->tramp)
				return f->ret;
		}
	}
	return 0;
}

/* Ends the process: a return probe's trampoline was reached and no frame
 * of the process records where the call returns. The design keeps that
 * from happening (see docs/reliability.md: frames live in private memory
 * that a fork copies, are found by the stack slot they replaced, and are
 * dropped only once their slot no longer holds the trampoline); reaching
 * this means something outside tp rewrote tp's private memory or moved a
 * stack with live frames. Returning anywhere would run the program on with
 * a wrong return address, so it ends the way abort() does, with SIGABRT at
 * its default action, and counts it where tp reports it. */
HOT void end_process(struct tp_ctx *c)
{
	__atomic_fetch_add(&c->returns_lost, 1, __ATOMIC_RELAXED);
	uint64_t dfl[4] = {0, 0, 0, 0}; /* handler SIG_DFL, flags, restorer, mask */
	tp_syscall4(TP_SYS_RT_SIGACTION, TP_SIGABRT, (uint64_t)dfl, 0, 8);
	uint64_t unblock = 1ull << (TP_SIGABRT - 1);
	tp_syscall4(TP_SYS_RT_SIGPROCMASK, 1 /* SIG_UNBLOCK */, (uint64_t)&unblock, 0, 8);
	uint64_t pid = tp_syscall4(TP_SYS_GETPID, 0, 0, 0, 0);
	uint64_t tid = tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0);
	tp_syscall4(TP_SYS_TGKILL, pid, tid, TP_SIGABRT, 0);
	for (;;)
		tp_syscall4(TP_SYS_EXIT_GROUP, 128 + TP_SIGABRT, 0, 0, 0);
}

/* Function exit, from the return trampoline. `regs` holds the two return
 * registers; `sp` is the stack pointer after the function's return, one
 * word above the slot that held the return address. Returns where to go.
 * `ext` (a constant) adds what tp_exit_ext does: the predicate on the
 * return value, and durations kept in the thread's histograms. */
HOT uint64_t exit_call(struct tp_ctx *c, const uint64_t *regs, uint64_t sp, const int ext)
{
	uint64_t tsc = tp_timestamp();
	uint64_t want = sp - sizeof(uint64_t);
	struct tp_thread *t = thread_state(c, 0);
	if (t)
		remember(c, t);
	uint32_t d = t ? t->depth : 0;
	while (d > 0) {
		struct tp_frame *f = &t->shadow[d - 1];
		if (f->slot == want) {
			uint64_t ret = f->ret, entry_tsc = f->tsc, nested = t->overhead - f->overhead;
			uint64_t children = f->children;
			uint32_t probe = f->probe, key = f->key;
			/* The call's time counts as its innermost live timed caller's
			 * children's (frames above it are newer: none contains it). */
			if (d >= 2)
				t->shadow[d - 2].children += own_ticks(tsc, entry_tsc, nested);
			/* Frames above it deeper on this stack were left by longjmp
			 * once their slots no longer hold the trampoline; frames on
			 * other stacks are kept. */
			uint32_t keep = d - 1;
			for (uint32_t i = d; i < t->depth; i++) {
				struct tp_frame *g = &t->shadow[i];
				if (g->slot < want && want - g->slot < TP_STACK_SPAN && !still_hijacked(g)) {
					gone(c, t, g, tsc);
					continue;
				}
				t->shadow[keep++] = *g;
			}
			__atomic_store_n(&t->depth, keep, __ATOMIC_RELEASE);
			if (!ext || record_exit(c, t, probe, regs[0], tsc, entry_tsc, nested, 0, key, ret, want))
				emit(c, t, probe | (TP_EXIT << TP_KIND_SHIFT), tsc, regs[0], entry_tsc, regs[1], nested, 0,
				     children);
			account(t, keep, tsc);
			return ret;
		}
		d--;
	}
	uint64_t ret = frame_elsewhere(c, t, want);
	if (ret) {
		lose(c, t, 1); /* its exit is not timed: the frame is another state's */
		return ret;
	}
	end_process(c);
	return 0;
}

uint64_t tp_exit(struct tp_ctx *c, const uint64_t *regs, uint64_t sp)
{
	return exit_call(c, regs, sp, 0);
}

/* tp_exit for a probe with a predicate on its return value or durations
 * kept in the target (its own trampoline calls this one). */
uint64_t tp_exit_ext(struct tp_ctx *c, const uint64_t *regs, uint64_t sp)
{
	return exit_call(c, regs, sp, 1);
}

/* A call's end, seen by the detour at an exit of its function (a return,
 * or a jump out of it: `word` has TP_TAIL_CALL), before that exit runs:
 * `slot` is where the call's return address is (x86-64: the stack pointer
 * at a `ret`; AArch64: the word below it), as the call's entry keyed its
 * frame; `v0` and `v1` the return registers. The call was timed if the
 * frame on top of the shadow stack, past the frames this shows dead, is
 * that slot's and probe's; else (it began before the probes went in, or
 * its sample was not taken) nothing is recorded. Go code's calls
 * (TP_GO_FRAMES) are goroutine `g`'s (goroutines.h). `ext` (a constant) adds
 * what tp_exit_at_ext does: the predicate on the return value, durations
 * kept in the target. */
HOT void exit_at(struct tp_ctx *c, uint32_t word, uint64_t slot, uint64_t v0, uint64_t v1, uint64_t g,
		 const int ext)
{
	if (word & TP_GO_FRAMES) {
		go_exit(c, word, slot, v0, v1, g, ext);
		return;
	}
	struct tp_thread *t = thread_state(c, 0);
	if (!t || !t->depth)
		return;
	uint64_t tsc = tp_timestamp();
	remember(c, t);
	uint32_t probe = word & TP_PROBE_MASK;
	/* The common case: the frame on top is at this slot, and the one below
	 * it (if any) is an outer call of this stack. Then settle would look at
	 * the top frame alone and keep it (its slot is `slot` itself, not
	 * deeper): nothing to settle. */
	uint32_t d = t->depth;
	if (!(d <= TP_SHADOW_LEN && t->shadow[d - 1].slot == slot &&
	      (d == 1 || deeper_on_stack(slot, t->shadow[d - 2].slot))))
		d = settle(c, t, slot, 0, tsc);
	struct tp_frame *f = d ? &t->shadow[d - 1] : 0;
	if (!f || f->slot != slot || f->probe != probe || f->tramp) {
		/* Not this call's: frames in its slot are dead too (another
		 * function's, whose exit tp did not see). */
		account(t, settle(c, t, slot, 1, tsc), tsc);
		return;
	}
	/* The frame is read whole before the depth lets it go; the call's
	 * time counts as its innermost live timed caller's children's. */
	uint64_t entry_tsc = f->tsc, nested = t->overhead - f->overhead, children = f->children;
	uint32_t key = f->key;
	uint64_t frame_ret = f->ret;
	if (d >= 2)
		t->shadow[d - 2].children += own_ticks(tsc, entry_tsc, nested);
	__atomic_store_n(&t->depth, d - 1, __ATOMIC_RELEASE);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	uint64_t tail = !!(word & TP_TAIL_CALL);
	if (!ext || record_exit(c, t, probe, v0, tsc, entry_tsc, nested, tail, key, frame_ret, slot))
		emit(c, t, probe | (TP_EXIT << TP_KIND_SHIFT), tsc, v0, entry_tsc, v1, nested, tail, children);
	account(t, d - 1, tsc);
}

/* The detour passes the probe's word whole: its top half is how far above
 * `slot` the return address is, where the detour records a return ahead of
 * it (Go's epilogue: restore the frame pointer, pop the frame, return). */
void tp_exit_at(struct tp_ctx *c, uint64_t word, uint64_t slot, uint64_t v0, uint64_t v1, uint64_t g)
{
	exit_at(c, (uint32_t)word, slot + (word >> 32), v0, v1, g, 0);
}

/* tp_exit_at for a probe with a predicate on its return value or durations
 * kept in the target (the exit's detour passes TP_EXIT_EXT flags). */
void tp_exit_at_ext(struct tp_ctx *c, uint64_t word, uint64_t slot, uint64_t v0, uint64_t v1, uint64_t g)
{
	exit_at(c, (uint32_t)word, slot + (word >> 32), v0, v1, g, 1);
}

/* An exception starts unwinding (_Unwind_RaiseException and friends): put
 * every return address this thread's probes replaced back in place, so the
 * unwinder finds the real callers. `sp` is the stack pointer at the
 * unwinder's entry, where the architecture's search for a return address
 * may start (runtime.h, tp_frame_give_back); x86-64's detour does not set
 * it, and its primitive does not read it. */
void tp_unwind(struct tp_ctx *c, uint64_t sp)
{
	struct tp_thread *t = thread_state(c, 0);
	if (!t)
		return;
	uint64_t tsc = tp_timestamp();
	uint32_t depth = t->depth;
	if (depth > TP_SHADOW_LEN)
		depth = TP_SHADOW_LEN;
	uint64_t keep[TP_SHADOW_LEN / 64] = {0};
	/* Innermost first. A frame whose return address is no longer where it
	 * was died earlier (longjmp) and its stack was reused: that memory is
	 * left alone. A frame the architecture cannot settle (runtime.h) is
	 * kept, and returns through the trampoline as before. */
	for (uint32_t d = depth; d > 0; d--) {
		struct tp_frame *f = &t->shadow[d - 1];
		/* A frame timed at its exits has nothing to give back: it stays,
		 * and goes as unwound once the thread runs above it (settle). */
		int r = f->tramp ? tp_frame_give_back(f, &sp) : TP_FRAME_KEPT;
		if (r == TP_FRAME_GIVEN_BACK)
			emit(c, t, f->probe | (TP_UNWOUND << TP_KIND_SHIFT), tsc, 0, f->tsc, 0, 0, 0, 0);
		else if (r == TP_FRAME_KEPT)
			keep[(d - 1) / 64] |= 1ull << ((d - 1) % 64);
	}
	uint32_t n = 0;
	for (uint32_t i = 0; i < depth; i++)
		if (keep[i / 64] & (1ull << (i % 64)))
			t->shadow[n++] = t->shadow[i];
	__atomic_store_n(&t->depth, n, __ATOMIC_RELEASE);
}

/* tp's own probe at the dynamic linker's rendezvous (`_dl_debug_state`),
 * which the loader calls after it maps a library, before the library's
 * initializers run, and around an unmap. While a session waits for
 * libraries (armed), the thread counts itself as arrived, wakes tp (which
 * waits on that word) and waits until tp says it has probed what the
 * loader mapped. The wait is bounded: at most `slices` futex waits of
 * TP_RENDEZVOUS_SLICE_NS each, whatever wakes them, and none once tp is
 * gone (kill(tracer, 0): ESRCH); a thread tp does not answer in time (tp
 * killed, or stopped) goes on, disarms the rendezvous
 * so that later ones do not wait, and counts itself in gave_up. The words
 * lie at TP_RENDEZVOUS_OFF in the region (tp rewrites the header whole,
 * so they are not in it): shared futexes, since tp maps them too. */
/* Waits for tp's answer to arrival `me`: at most `slices` futex waits
 * on `handled` of TP_RENDEZVOUS_SLICE_NS each, none once `armed` is
 * clear, none more once tp (`tracer`, if known) is gone. Returns 1 if tp
 * answered, -1 if tp is gone, 0 if time ran out. */
HOT int wait_for_tp(uint32_t *handled, uint32_t me, const uint32_t *armed, uint32_t slices, uint32_t tracer)
{
	if (slices > TP_RENDEZVOUS_MAX_SLICES)
		slices = TP_RENDEZVOUS_MAX_SLICES;
	volatile int64_t slice[2] = {0, TP_RENDEZVOUS_SLICE_NS};
	for (uint32_t i = 0; i < slices; i++) {
		uint32_t h = __atomic_load_n(handled, __ATOMIC_ACQUIRE);
		if ((int32_t)(h - me) >= 0 || !__atomic_load_n(armed, __ATOMIC_ACQUIRE))
			return 1;
		tp_syscall4(TP_SYS_FUTEX, (uint64_t)handled, TP_FUTEX_WAIT, h, (uint64_t)slice);
		/* tp is gone (killed): no answer will come. */
		if (tracer && (int64_t)tp_syscall4(TP_SYS_KILL, tracer, 0, 0, 0) == -3 /* ESRCH */)
			return -1;
	}
	return (int32_t)(__atomic_load_n(handled, __ATOMIC_ACQUIRE) - me) >= 0;
}

void tp_rendezvous(struct tp_ctx *c)
{
	struct tp_rendezvous *r = (struct tp_rendezvous *)((uint64_t)c - TP_CTX_OFF + TP_RENDEZVOUS_OFF);
	if (!__atomic_load_n(&r->armed, __ATOMIC_ACQUIRE))
		return;
	/* Before a map or an unmap (RT_ADD, RT_DELETE) there is nothing new
	 * for tp to see: only the call after one (RT_CONSISTENT) waits. */
	uint64_t state = __atomic_load_n(&r->state, __ATOMIC_RELAXED);
	if (state && *(volatile int32_t *)state != 0)
		return;
	uint32_t me = __atomic_add_fetch(&r->arrived, 1, __ATOMIC_ACQ_REL);
	tp_syscall4(TP_SYS_FUTEX, (uint64_t)&r->arrived, TP_FUTEX_WAKE, 1, 0);
	uint32_t slices = __atomic_load_n(&r->slices, __ATOMIC_RELAXED);
	uint32_t tracer = __atomic_load_n(&r->tracer, __ATOMIC_RELAXED);
	if (wait_for_tp(&r->handled, me, &r->armed, slices, tracer) > 0)
		return;
	__atomic_store_n(&r->armed, 0, __ATOMIC_RELEASE);
	__atomic_add_fetch(&r->gave_up, 1, __ATOMIC_RELAXED);
}

/* The in-target engine starts tracing the call of the thread that claimed
 * the hand-over, whose stack pointer at the function's first instruction
 * was `entry_sp`: unless SIGTRAP is blocked in the thread (a trap would
 * then kill the process), it notes the thread and the start, and sets the
 * trap flag; each instruction from here on traps into tp_trap. Returns 0
 * if the call cannot be traced. */
HOT int trap_start(struct tp_trap_trace *t, uint64_t entry_sp)
{
	uint64_t blocked = ~0ull;
	if (!TP_HAS_TRAP_FLAG || (int64_t)tp_syscall4(TP_SYS_RT_SIGPROCMASK, 0 /* SIG_BLOCK */, 0, (uint64_t)&blocked, 8) < 0 ||
	    (blocked & (1ull << (5 - 1)) /* SIGTRAP */) || __atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != TP_TRAP_IDLE)
		return 0;
	t->tid = (uint32_t)tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0);
	t->entry_sp = entry_sp;
	t->count = 0;
	t->end = 0;
	t->syscall = 0;
	t->start = tp_timestamp();
	__atomic_store_n(&t->state, TP_TRAP_TRACING, __ATOMIC_RELEASE);
	tp_trap_flag_on();
	return 1;
}

/* A call of a probe that tp steps (`--steps`): while tp wants calls
 * (armed), the first thread to claim the hand-over writes its TID, wakes
 * tp and waits for it as at the rendezvous, bounded. tp takes the thread
 * with ptrace while it waits, answers, and steps it from here through
 * its call; it clears `busy` once the call is done. A thread tp does not
 * answer goes on (and lets the next call try); once tp is gone, calls no
 * longer wait. With the in-target engine (`trap`), the thread traces its
 * call itself (trap_start) and does not wait; one it cannot trace goes on
 * as one tp did not answer. */
void tp_step(struct tp_ctx *c, uint64_t entry_sp)
{
	struct tp_step *s = (struct tp_step *)((uint64_t)c - TP_CTX_OFF + TP_STEP_OFF);
	if (!__atomic_load_n(&s->armed, __ATOMIC_ACQUIRE))
		return;
	uint32_t idle = 0;
	if (!__atomic_compare_exchange_n(&s->busy, &idle, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	uint64_t trap = __atomic_load_n(&s->trap, __ATOMIC_ACQUIRE);
	if (trap) {
		if (trap_start((struct tp_trap_trace *)trap, entry_sp))
			return;
	} else {
		__atomic_store_n(&s->tid, (uint32_t)tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0), __ATOMIC_RELAXED);
		uint32_t me = __atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL);
		tp_syscall4(TP_SYS_FUTEX, (uint64_t)&s->arrived, TP_FUTEX_WAKE, 1, 0);
		uint32_t slices = __atomic_load_n(&s->slices, __ATOMIC_RELAXED);
		uint32_t tracer = __atomic_load_n(&s->tracer, __ATOMIC_RELAXED);
		int answer = wait_for_tp(&s->handled, me, &s->armed, slices, tracer);
		if (answer > 0)
			return;
		if (answer < 0)
			__atomic_store_n(&s->armed, 0, __ATOMIC_RELEASE);
	}
	__atomic_add_fetch(&s->gave_up, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
}

/* The in-target engine's SIGTRAP handler, installed by tp with every
 * signal blocked while it runs (the kernel clears the trap flag for a
 * handler, and sigreturn puts it back); the runtime block's entry to it
 * passes the context as a fourth argument. A trap of the traced thread
 * records the address of the instruction about to run, or ends the trace
 * (trace_end). A single-step trap of any other thread (one that inherited
 * the flag: a thread the traced one created, a forked child) clears the
 * flag there. Any other SIGTRAP (kill, int3) does what the process's own
 * disposition did, which tp checked was the default: the handler puts the
 * default back and raises the signal again, which ends the process. */
void tp_trap(int sig, const int32_t *info, void *uc, struct tp_ctx *c)
{
	(void)sig;
	struct tp_step *s = (struct tp_step *)((uint64_t)c - TP_CTX_OFF + TP_STEP_OFF);
	if (info[2] != TP_TRAP_TRACE) {
		uint64_t dfl[4] = {0, 0, 0, 0};
		tp_syscall4(TP_SYS_RT_SIGACTION, 5 /* SIGTRAP */, (uint64_t)dfl, 0, 8);
		tp_syscall4(TP_SYS_TGKILL, tp_syscall4(TP_SYS_GETPID, 0, 0, 0, 0), tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0), 5, 0);
		return;
	}
	struct tp_trap_trace *t = (struct tp_trap_trace *)__atomic_load_n(&s->trap, __ATOMIC_ACQUIRE);
	if (!t || __atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != TP_TRAP_TRACING ||
	    (uint32_t)tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0) != t->tid) {
		tp_uc_trap_flag_off(uc);
		if (t)
			__atomic_add_fetch(&t->strays, 1, __ATOMIC_RELAXED);
		return;
	}
	uint64_t n = t->count;
	uint32_t end = 0, nr = 0;
	uint32_t tracer = __atomic_load_n(&s->tracer, __ATOMIC_RELAXED);
	if (tp_uc_sp(uc) > t->entry_sp)
		end = TP_TRAP_RETURNED;
	else if (!__atomic_load_n(&s->armed, __ATOMIC_ACQUIRE))
		end = TP_TRAP_STOPPED;
	else if (n >= t->cap)
		end = TP_TRAP_LIMIT;
	else if ((n & 4095) == 4095 && tracer && (int64_t)tp_syscall4(TP_SYS_KILL, tracer, 0, 0, 0) == -3 /* ESRCH */)
		end = TP_TRAP_STOPPED;
	if (!end) {
		((uint64_t *)((uint64_t)t + TP_TRAP_PCS_OFF))[n] = tp_uc_pc(uc);
		t->count = ++n;
		nr = tp_uc_syscall_ends_trace(uc);
		if (!nr)
			return;
		end = TP_TRAP_SYSCALL;
	}
	tp_uc_trap_flag_off(uc);
	t->end = end;
	t->syscall = nr;
	t->stop = tp_timestamp();
	__atomic_store_n(&t->state, TP_TRAP_DONE, __ATOMIC_RELEASE);
}
