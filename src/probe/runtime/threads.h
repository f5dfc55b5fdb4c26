/* tp's in-target runtime, part of runtime.c (one translation unit):
 * the process and its threads as the runtime knows them. The PID and each
 * thread's key and TID, its state in the private area (taken on its first
 * event, found again after a fork), its ring slot in the data region, its
 * counter row and the thread cache the detours find the row by. Included by
 * runtime.c after layout.h and the architecture's runtime.h.
 */
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
