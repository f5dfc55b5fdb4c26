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

/* The sampling period of a function whose rate tp does not know yet. */
#define TP_FIRST_PERIOD 8
/* Slots probed before an event is dropped (and counted) for want of one. */
#define TP_MAX_PROBES_FOR_SLOT 16
#define TP_SIGABRT 6

#define HOT static inline __attribute__((always_inline))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Thread states and ring slots both number 1 << TP_EVENT_SLOT_BITS (the
 * header tp validated says so): a constant, so the hash is shifts by
 * immediates. */
#define TP_SLOTS (1ull << TP_EVENT_SLOT_BITS)

HOT uint64_t hash_of(uint64_t key)
{
	return ((key ^ (key >> 12)) * 0x9e3779b97f4a7c15ull) >> (64 - TP_EVENT_SLOT_BITS);
}

HOT struct tp_proc *proc_of(const struct tp_ctx *c)
{
	return (struct tp_proc *)c->private;
}

HOT struct tp_thread *thread_at(const struct tp_ctx *c, uint64_t i)
{
	/* The size tp validated in the header, known here: a constant multiply. */
	return (struct tp_thread *)(c->private + TP_THREADS_OFF +
				    i * (sizeof(struct tp_thread) + TP_SHADOW_LEN * sizeof(struct tp_frame)));
}

HOT struct tp_slot *slot_at(const struct tp_ctx *c, uint64_t i)
{
	return (struct tp_slot *)(c->slots + i * c->slot_size);
}

/* This process's PID. A process learns it on its first event; a process
 * forked since reads 0 (its page was wiped) and learns its own. */
HOT uint32_t process_id(const struct tp_ctx *c)
{
	struct tp_proc *p = proc_of(c);
	uint32_t pid = __atomic_load_n(&p->pid, __ATOMIC_RELAXED);
	if (UNLIKELY(pid == 0)) {
		pid = (uint32_t)tp_syscall4(TP_SYS_GETPID, 0, 0, 0, 0);
		__atomic_store_n(&p->pid, pid, __ATOMIC_RELAXED);
	}
	return pid;
}

/* The calling thread's key: its thread register (see runtime.h), or, for a
 * thread without one, its TID made odd (never a register's value, which is
 * aligned). Never 0, which marks a free state. */
HOT uint64_t thread_key(const struct tp_ctx *c)
{
	uint64_t k = tp_thread_key(c->key_how);
	if (UNLIKELY(k == 0))
		k = (tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0) << 1) | 1;
	return k;
}

/* Where thread `key`, whose TID is `tid`, keeps it: in its TCB, where the
 * TCB's TID follows a thread that reuses another's TCB; else in its state,
 * where the TID taken by adopt() does not. Only a key that is a TCB's
 * address has a TID to read (runtime.h, tp_key_is_tcb), and it is read
 * there only if it is this thread's now: Go's m.tls and other runtimes'
 * blocks have none. */
HOT uint64_t tid_place(const struct tp_ctx *c, uint64_t key, uint32_t tid)
{
	int64_t off = __atomic_load_n(&c->tid_offset, __ATOMIC_RELAXED);
	if (!(key & 1) && off && tp_key_is_tcb(key) && *(const volatile uint32_t *)(key + off) == tid)
		return key + off;
	return 0;
}

/* tp saw a lone thread at attach, whose TID was in more than one place
 * near its thread pointer (c->tid_candidates); this thread, not the main
 * one, tells them apart: the one place where it finds its own TID is
 * where every thread keeps it. Each place is read only once the kernel
 * said its page is readable (madvise MADV_POPULATE_READ, which tp checked
 * the seccomp filters let through: may_check_memory): a place beyond this
 * thread's TCB block may be unmapped. On a thread's first event in the
 * process, while the place is not known: once, unless a thread finds its
 * TID in more than one of them too. */
HOT void learn_tid_offset(struct tp_ctx *c, uint64_t key, uint32_t tid)
{
	if ((key & 1) || !c->may_check_memory || !tp_key_is_tcb(key))
		return;
	int32_t found = 0;
	for (uint32_t i = 0; i < TP_TID_CANDIDATES; i++) {
		int32_t off = c->tid_candidates[i];
		uint64_t at = key + (int64_t)off;
		if (off == 0 || (at & 3))
			continue;
		if (tp_syscall4(TP_SYS_MADVISE, at & ~4095ull, 4096, TP_MADV_POPULATE_READ, 0) != 0)
			continue;
		if (*(const volatile uint32_t *)at != tid)
			continue;
		if (found)
			return; /* more than one place here too */
		found = off;
	}
	int32_t none = 0;
	if (found)
		__atomic_compare_exchange_n(&c->tid_offset, &none, found, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* A state this thread found with another process's PID: a fork copied it.
 * In the child, the thread that forked has the child's PID as its TID and
 * keeps its frames (they are live on its copy of the stack); any other
 * thread whose key matches a state of the parent's is a new thread that
 * happens to reuse a parent thread's TCB address, and those frames were
 * the parent thread's. Either way the ring slot is the parent's. */
HOT void adopt(const struct tp_ctx *c, struct tp_thread *t, uint32_t pid)
{
	uint32_t tid = (uint32_t)tp_syscall4(TP_SYS_GETTID, 0, 0, 0, 0);
	if (t->pid != 0 && tid != pid) {
		t->depth = 0;
		t->overhead = 0;
	}
	if (UNLIKELY(__atomic_load_n(&c->tid_offset, __ATOMIC_RELAXED) == 0) && tid != pid)
		learn_tid_offset((struct tp_ctx *)c, t->key, tid);
	t->tid = tid;
	uint64_t at = tid_place(c, t->key, tid);
	t->tid_at = at ? at : (uint64_t)&t->tid;
	t->ring = 0;
	t->row = 0;
	/* A fork copies a state another thread was writing into its ring
	 * with: nothing writes it in this process. */
	t->writing = 0;
	t->pid = pid;
}

/* The calling thread's state in this process's private area; taken on its
 * first event if `claim`. 0 if every state it may take is in use. */
HOT struct tp_thread *thread_state(const struct tp_ctx *c, int claim)
{
	uint64_t key = thread_key(c);
	uint64_t h = hash_of(key);
	for (uint64_t i = 0; i < TP_MAX_PROBES_FOR_SLOT; i++) {
		struct tp_thread *t = thread_at(c, (h + i) & (TP_SLOTS - 1));
		uint64_t k = __atomic_load_n(&t->key, __ATOMIC_ACQUIRE);
		if (k != key) {
			if (k != 0)
				continue;
			if (!claim)
				return 0;
			uint64_t expected = 0;
			if (!__atomic_compare_exchange_n(&t->key, &expected, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				continue;
			adopt(c, t, process_id(c));
			return t;
		}
		/* A state taken in this process has its PID, never 0; a process
		 * forked since reads 0 in its wiped page: one compare sees both.
		 * A state whose PID is still 0 is being taken by this very thread,
		 * which a signal interrupted between the claim and adopt(): the
		 * handler's probes adopt it themselves (the same values; what the
		 * interrupted adopt() then resets, the row and the ring slot, the
		 * thread takes again, and tp reads every row and slot). */
		uint32_t mine = __atomic_load_n(&t->pid, __ATOMIC_RELAXED);
		if (UNLIKELY(mine == 0 || mine != proc_of(c)->pid)) {
			uint32_t pid = process_id(c);
			if (t->pid != pid)
				adopt(c, t, pid);
		}
		/* A thread adopted before the runtime learnt where the TCB keeps
		 * the TID (learn_tid_offset): the main thread, which cannot tell
		 * the places apart, reads it there from now on. */
		if (UNLIKELY(t->tid_at == (uint64_t)&t->tid) && __atomic_load_n(&c->tid_offset, __ATOMIC_RELAXED)) {
			uint64_t at = tid_place(c, t->key, t->tid);
			if (at)
				t->tid_at = at;
		}
		return t;
	}
	return 0;
}

/* Counts `n` events that were not recorded: in the thread's ring slot, or,
 * when it has none, in the region's count of events without a slot. */
HOT void lose(struct tp_ctx *c, struct tp_thread *t, uint64_t n)
{
	if (t && t->ring) {
		/* One atomic add: a signal handler's probes that lose events on
		 * this thread may interrupt this one. */
		struct tp_slot *s = (struct tp_slot *)t->ring;
		__atomic_fetch_add(&s->lost, n, __ATOMIC_RELAXED);
		return;
	}
	__atomic_fetch_add(&c->lost_no_slot, n, __ATOMIC_RELAXED);
}

/* Counts the exit of a timed call that is not recorded because its thread
 * (or goroutine) has no frame free for it. */
HOT void lose_too_deep(struct tp_ctx *c)
{
	__atomic_fetch_add(&c->lost_too_deep, 1, __ATOMIC_RELAXED);
}

/* True if the ring slot `s` (whose key was `key`) is free to take over:
 * the process that owned it is gone (kill(pid, 0): ESRCH), and every event
 * it wrote was read. tp frees such slots too, at its own pace; a server
 * that forks faster than tp drains finds them here. The ring is looked at
 * again once the owner is known to be gone: it may have written its last
 * events between the first look and its end. */
HOT int drained(struct tp_slot *s)
{
	return __atomic_load_n(&s->head, __ATOMIC_ACQUIRE) == __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
}

HOT int abandoned(struct tp_slot *s, uint64_t key)
{
	return drained(s) && (int64_t)tp_syscall4(TP_SYS_KILL, key >> 32, 0, 0, 0) == -3 /* ESRCH */ && drained(s);
}

HOT void remember(const struct tp_ctx *c, const struct tp_thread *t);

/* The thread's ring slot in the data region, claimed on its first event in
 * this process (the thread keeps its address, so the search, over every
 * slot, is made once): a free slot, else one its owner abandoned; 0 if
 * every slot is in use. A slot claimed goes into the thread's cache entry
 * at once, for the fast paths (remember). */
HOT struct tp_slot *ring_slot(struct tp_ctx *c, struct tp_thread *t)
{
	if (__builtin_expect(t->ring != 0, 1))
		return (struct tp_slot *)t->ring;
	uint64_t owner = ((uint64_t)t->pid << 32) | t->tid;
	uint64_t h = hash_of(t->key ^ ((uint64_t)t->pid << 20));
	for (int pass = 0; pass < 2; pass++) {
		for (uint64_t i = 0; i < TP_SLOTS; i++) {
			uint64_t k = (h + i) & (TP_SLOTS - 1);
			struct tp_slot *s = slot_at(c, k);
			uint64_t expected = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
			if (expected != 0 && (pass == 0 || (expected >> 32) == t->pid || !abandoned(s, expected)))
				continue;
			if (!__atomic_compare_exchange_n(&s->key, &expected, owner, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
				continue;
			__atomic_fetch_or(&c->claimed[k >> 6], 1ull << (k & 63), __ATOMIC_RELEASE);
			t->ring = (uint64_t)s;
			remember(c, t);
			return s;
		}
	}
	return 0;
}

/* Rows a thread may take; row 0 is shared. */
#define TP_ROWS (1u << TP_SLOT_BITS)
/* t->row of a thread that found every row taken: it counts in row 0. */
#define TP_ROW_SHARED TP_ROWS

/* The thread cache's entry `way` (0 or 1) of the word at the thread
 * pointer: the entry of its index, or the one paired with it. See
 * layout.rs, cache_index. */
HOT struct tp_cache_entry *cache_at(const struct tp_ctx *c, uint64_t word, uint32_t way)
{
	uint64_t i = (uint32_t)((uint32_t)word * (uint32_t)TP_CACHE_HASH) >> (32 - TP_CACHE_BITS);
	return &proc_of(c)->cache[i ^ way];
}

/* The word the detours find thread `t` by (the word at the thread
 * pointer), if it is the thread's own key: then no other live thread reads
 * the same word there. 0 if the detours cannot find it (a thread whose
 * word is 0, as Go's, or is not its key). */
HOT uint64_t detour_word(const struct tp_thread *t)
{
	uint64_t word = tp_detour_word();
	return word != 0 && word == t->key ? word : 0;
}


/* The ring slot the fast paths may write thread `t`'s events into: its
 * own, once it has one and its TID is in its TCB at the offset tp found
 * (they read it there, from the word at the thread pointer, which for a
 * thread in the cache is its key); else 0, and its events go through the
 * runtime. */
HOT uint64_t fast_ring(const struct tp_ctx *c, const struct tp_thread *t)
{
	return c->tid_offset && t->tid_at == t->key + (int64_t)c->tid_offset ? t->ring : 0;
}

/* Lets the detours find thread `t`, which counts in row `t->row` of its
 * own, without calling the runtime: in the entry of its word or the one
 * paired with it, whichever is free (if neither, the thread goes on
 * through the runtime). An entry is taken with one compare-and-swap and
 * written once: its row, state and ring, then its check, which a detour
 * reads before them; the check, row and state never change again in this
 * process. The ring follows the thread's (fast_ring): set when the thread
 * claims one, and checked on each of its calls of the runtime. */
HOT void remember(const struct tp_ctx *c, const struct tp_thread *t)
{
	uint64_t word = detour_word(t);
	if (!word || t->row == 0 || t->row >= TP_ROWS)
		return;
	uint64_t ring = fast_ring(c, t);
	for (uint32_t way = 0; way < 2; way++) {
		struct tp_cache_entry *e = cache_at(c, word, way);
		uint64_t check = __atomic_load_n(&e->check, __ATOMIC_ACQUIRE);
		if (check == ~word) {
			if (__atomic_load_n(&e->ring, __ATOMIC_RELAXED) != ring)
				__atomic_store_n(&e->ring, ring, __ATOMIC_RELAXED);
			return;
		}
		uint64_t empty = 0;
		if (check != 0 ||
		    !__atomic_compare_exchange_n(&e->check, &empty, TP_CACHE_BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		__atomic_store_n(&e->row, c->counters + ((uint64_t)t->row << c->stride_shift), __ATOMIC_RELAXED);
		__atomic_store_n(&e->thread, (uint64_t)t, __ATOMIC_RELAXED);
		__atomic_store_n(&e->ring, ring, __ATOMIC_RELAXED);
		__atomic_store_n(&e->check, ~word, __ATOMIC_RELEASE);
		return;
	}
}

/* The counter row of thread `t` in this process, taken on its first count:
 * a row nobody took, else one whose process is gone (kill(pid, 0): ESRCH);
 * TP_ROW_SHARED if every row is a live process's (the thread then counts
 * in the shared row 0, with atomic adds). Only the thread that took a row
 * writes it, so it adds without a lock; a process forked since takes rows
 * of its own. */
HOT uint32_t counter_row(struct tp_ctx *c, struct tp_thread *t)
{
	if (__builtin_expect(t->row != 0, 1))
		return t->row;
	uint64_t owner = ((uint64_t)t->pid << 32) | t->tid;
	uint64_t start = hash_of(t->key ^ ((uint64_t)t->pid << 20));
	for (int pass = 0; pass < 2; pass++) {
		for (uint64_t i = 0; i < TP_ROWS - 1; i++) {
			uint32_t r = 1 + (uint32_t)((start + i) % (TP_ROWS - 1));
			uint64_t expected = __atomic_load_n(&c->row_owner[r], __ATOMIC_ACQUIRE);
			if (expected != 0 && (pass == 0 || (expected >> 32) == t->pid ||
					      (int64_t)tp_syscall4(TP_SYS_KILL, expected >> 32, 0, 0, 0) != -3 /* ESRCH */))
				continue;
			if (!__atomic_compare_exchange_n(&c->row_owner[r], &expected, owner, 0, __ATOMIC_ACQ_REL,
							 __ATOMIC_RELAXED))
				continue;
			t->row = r;
			return r;
		}
	}
	t->row = TP_ROW_SHARED;
	return t->row;
}

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

HOT uint32_t thread_id(const struct tp_thread *t)
{
	return *(const volatile uint32_t *)t->tid_at;
}

/* Marks the thread as writing into its ring (the fast paths test the same
 * word). 0 if it already was: a signal handler whose probes run on this
 * thread interrupted the write, and its event is counted lost rather than
 * written over the one being written. */
HOT int begin_write(struct tp_ctx *c, struct tp_thread *t)
{
	if (UNLIKELY(t->writing)) {
		lose(c, t, 1);
		return 0;
	}
	t->writing = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	return 1;
}

HOT void end_write(struct tp_thread *t)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->writing = 0;
}

/* True if the ring of slot `s` has room for `n` events from `head` on. The
 * thread looks at the reader's position only when its last look says there
 * is none (the slot's `limit`); a slot's next owner inherits a limit that
 * is never above the truth, as the reader only moves on. */
HOT int room(const struct tp_ctx *c, struct tp_slot *s, uint64_t head, uint64_t n)
{
	if (head + n <= s->limit)
		return 1;
	s->limit = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE) + c->ring_mask + 1;
	return head + n <= s->limit;
}

/* Writes event `k` of slot `s`'s ring (not yet published). */
HOT void put_event(const struct tp_ctx *c, const struct tp_thread *t, struct tp_slot *s, uint64_t k, uint32_t probe,
		   uint64_t tsc, uint64_t v0, uint64_t v1, uint64_t v2, uint64_t v3, uint64_t v4, uint64_t v5)
{
	struct tp_event *e = s->ring + (k & c->ring_mask);
	e->probe = probe;
	e->tid = thread_id(t);
	e->tsc = tsc;
	e->v[0] = v0;
	e->v[1] = v1;
	e->v[2] = v2;
	e->v[3] = v3;
	e->v[4] = v4;
	e->v[5] = v5;
}

/* Begins writing `n` events into the thread's ring: the slot, with room
 * for them from its head, the thread marked as writing; or 0, with one
 * event counted lost (the `n` records are one event's) and no mark. */
HOT struct tp_slot *begin_events(struct tp_ctx *c, struct tp_thread *t, uint64_t n)
{
	if (!begin_write(c, t))
		return 0;
	struct tp_slot *s = ring_slot(c, t);
	if (UNLIKELY(!s || !room(c, s, s->head, n))) {
		lose(c, t, 1);
		end_write(t);
		return 0;
	}
	return s;
}

/* Appends one event to the thread's ring, or counts it lost if it has no
 * ring or the ring is full. */
HOT void emit(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t tsc, uint64_t v0, uint64_t v1,
	      uint64_t v2, uint64_t v3, uint64_t v4, uint64_t v5)
{
	struct tp_slot *s = begin_events(c, t, 1);
	if (!s)
		return;
	uint64_t head = s->head;
	put_event(c, t, s, head, probe, tsc, v0, v1, v2, v3, v4, v5);
	__atomic_store_n(&s->head, head + 1, __ATOMIC_RELEASE);
	end_write(t);
}

/* Writes an entry event with its argument registers `regs` at `head` of
 * slot `s`, after the record of the registers past the sixth when `more`
 * (see emit_entry); unpublished. Returns the entry event's place. */
HOT uint64_t put_entry(struct tp_ctx *c, struct tp_thread *t, struct tp_slot *s, uint64_t head, uint32_t probe,
		       uint64_t tsc, const uint64_t *regs, int more)
{
	if (more)
		put_event(c, t, s, head++, probe | (TP_ARGS_MORE << TP_KIND_SHIFT), tsc, regs[6], regs[7], regs[8], 0, 0,
			  0);
	put_event(c, t, s, head, probe | (TP_ENTRY << TP_KIND_SHIFT), tsc, regs[0], regs[1], regs[2], regs[3], regs[4],
		  regs[5]);
	return head;
}

/* Appends an entry event with its argument registers `regs`; where the ABI
 * passes more than an event holds (`more`: AArch64's eight, Go's nine on
 * x86-64; `regs` then holds nine words, the last a saved register on
 * AArch64), the rest go
 * first, in a record with the entry's timestamp that tp joins to it. Both
 * records go in or neither, counted as the one event lost (a signal
 * handler's events cannot come between them). */
HOT void emit_entry(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t tsc, const uint64_t *regs,
		    int more)
{
	struct tp_slot *s = begin_events(c, t, more ? 2 : 1);
	if (!s)
		return;
	uint64_t head = s->head;
	head = put_entry(c, t, s, head, probe, tsc, regs, more);
	__atomic_store_n(&s->head, head + 1, __ATOMIC_RELEASE);
	end_write(t);
}

/* Adds the ticks since `tsc` to the thread's time in tp. Only timed calls
 * that are live on the thread (`depth` frames) read it, so with none the
 * second timestamp is not taken: an entry event without return probes
 * costs one rdtsc, not two. */
HOT void account(struct tp_thread *t, uint32_t depth, uint64_t tsc)
{
	if (depth)
		t->overhead += tp_timestamp() - tsc;
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

/* True while a frame is live as far as its stack shows: where the function
 * keeps its return address still holds the trampoline (its slot on x86-64;
 * see runtime.h, tp_frame_live). A live frame always does (the function
 * returns through it); a frame left by longjmp, or by a thread that went,
 * loses it once that stack is reused. Frames are dropped only when this is
 * false, so none that a return will need is ever dropped (a coroutine's
 * frames on another stack nearby included). */
HOT int still_hijacked(const struct tp_frame *f)
{
	return f->tramp && tp_frame_live(f);
}

/* Frame `f` is dropped, found dead at `tsc`: a call timed at its exits
 * that left by none tp saw is sent as unwound. (One whose return address
 * tp replaced was sent so when unwinding started, or left by longjmp.) */
HOT void gone(struct tp_ctx *c, struct tp_thread *t, const struct tp_frame *f, uint64_t tsc)
{
	if (!f->tramp)
		emit(c, t, f->probe | (TP_UNWOUND << TP_KIND_SHIFT), tsc, 0, f->tsc, 0, 0, 0, 0);
}

/* True if stack address `a` lies below `b` on the same stack: frames farther
 * apart than TP_STACK_SPAN may live on different stacks (a coroutine's, a
 * signal stack). */
HOT int deeper_on_stack(uint64_t a, uint64_t b)
{
	return a < b && b - a < TP_STACK_SPAN;
}

/* The thread runs at stack slot `here` (where a call's return address is):
 * the frames on top of its shadow stack that are deeper on this stack, or
 * at `here` itself when `at_here`, ended without an exit tp saw (longjmp,
 * an exception, an exit tp could not patch), and are dropped, each sent as
 * unwound. A frame whose return address tp replaced stays while its slot
 * holds the trampoline (a tail call's callee enters at its slot, and it
 * returns through both); frames of other stacks stay. Returns the depth. */
HOT uint32_t settle(struct tp_ctx *c, struct tp_thread *t, uint64_t here, int at_here, uint64_t tsc)
{
	uint32_t d = t->depth;
	if (d > TP_SHADOW_LEN)
		d = TP_SHADOW_LEN;
	uint32_t top = d;
	/* The frames above the first that is an outer call of this stack. */
	while (top > 0) {
		const struct tp_frame *f = &t->shadow[top - 1];
		if (deeper_on_stack(here, f->slot))
			break;
		top--;
	}
#define DEAD(f) ((deeper_on_stack((f)->slot, here) || (at_here && (f)->slot == here)) && !still_hijacked(f))
	/* Sent innermost first, as unwinding passes them; then let go. */
	for (uint32_t i = d; i > top; i--)
		if (DEAD(&t->shadow[i - 1]))
			gone(c, t, &t->shadow[i - 1], tsc);
	uint32_t keep = top;
	for (uint32_t i = top; i < d; i++) {
		struct tp_frame *f = &t->shadow[i];
		if (!DEAD(f))
			t->shadow[keep++] = *f;
	}
#undef DEAD
	if (keep != t->depth)
		__atomic_store_n(&t->depth, keep, __ATOMIC_RELEASE);
	return keep;
}

/* A timed call's own duration in ticks, as tp times its exit event: from
 * its entry moved later by tp's ticks in the probes of its callees
 * (`nested`), never past its exit at `tsc`. */
HOT uint64_t own_ticks(uint64_t tsc, uint64_t entry_tsc, uint64_t nested)
{
	uint64_t from = entry_tsc + nested;
	if (from > tsc || from < entry_tsc)
		from = tsc;
	return tsc - from;
}

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
