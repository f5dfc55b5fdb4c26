/* tp's in-target runtime, part of runtime.c (one translation unit): what
 * an event costs and where it goes. Writing events into the thread's ring
 * (room, the writing mark, entry events with their registers), the time a
 * thread spends in tp, the sampling countdown, and which frames of the
 * thread's shadow stack are still live. Included by runtime.c after
 * threads.h.
 */
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
