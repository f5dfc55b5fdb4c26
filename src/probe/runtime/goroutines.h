/* Timed calls of Go code, kept per goroutine (included by runtime.c).
 *
 * A goroutine moves between threads (its M), and its stack moves when it
 * grows: Go copies it whole, each frame at the same distance from its top.
 * So a call of Go code timed at its function's exits is its goroutine's,
 * keyed by the goroutine (`g`, which Go code keeps in a register of its
 * ABI and the detour passes) and by its slot's distance from the
 * top of the goroutine's stack (g.stack.hi, g's second word). A goroutine
 * takes an entry (struct tp_goroutine, in the private area after the thread
 * states) for its first timed call and gives it back when the last
 * returns; only the thread it runs on touches it (a signal handler runs on
 * another goroutine, gsignal). Events go into the ring of the thread the
 * goroutine runs on. As for threads, frames deeper than a call that begins
 * or ends, or in its slot, ended without an exit tp saw (a panic that was
 * recovered, runtime.Goexit): they are sent as unwound. */

/* The most a goroutine's stack may hold (Go's maxstacksize is 1 GB). */
#define TP_GO_MAX_STACK (1ull << 30)

HOT struct tp_goroutine *goroutine_at(const struct tp_ctx *c, uint64_t i)
{
	return (struct tp_goroutine *)(c->private + TP_GOROUTINES_OFF +
				       i * (sizeof(struct tp_goroutine) +
					    TP_GO_FRAME_COUNT * sizeof(struct tp_go_frame)));
}

/* The entry of goroutine `g`, taken (the first free one among those it may
 * use, after a look at all of them) if `claim`; 0 if it has none. */
HOT struct tp_goroutine *goroutine(const struct tp_ctx *c, uint64_t g, int claim)
{
	uint64_t h = ((g ^ (g >> 12)) * 0x9e3779b97f4a7c15ull) >> 32;
	for (uint64_t i = 0; i < TP_MAX_PROBES_FOR_SLOT; i++) {
		struct tp_goroutine *e = goroutine_at(c, (h + i) & (TP_GO_SLOTS - 1));
		if (__atomic_load_n(&e->g, __ATOMIC_ACQUIRE) == g)
			return e;
	}
	for (uint64_t i = 0; claim && i < TP_MAX_PROBES_FOR_SLOT; i++) {
		struct tp_goroutine *e = goroutine_at(c, (h + i) & (TP_GO_SLOTS - 1));
		uint64_t free = 0;
		if (!__atomic_compare_exchange_n(&e->g, &free, g, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		e->depth = 0;
		e->overhead = 0;
		return e;
	}
	return 0;
}

/* How far `slot` lies below the top of goroutine `g`'s stack; 0 if `g` is
 * no goroutine whose stack holds it (the check reads g's bounds, which Go
 * code always has in that register). */
HOT uint64_t go_offset(uint64_t g, uint64_t slot)
{
	if (g == 0 || (g & 7))
		return 0;
	uint64_t lo = *(const volatile uint64_t *)g, top = *(const volatile uint64_t *)(g + 8);
	if (slot < lo || slot >= top || top - lo > TP_GO_MAX_STACK)
		return 0;
	return top - slot;
}

/* The frames on top of goroutine `e`'s that are deeper than `off` (or at it,
 * when `at_here`) are dead: sent as unwound, on the ring of thread `t`, and
 * let go. Returns the depth. */
HOT uint32_t go_settle(struct tp_ctx *c, struct tp_thread *t, struct tp_goroutine *e, uint64_t off, int at_here,
		       uint64_t tsc)
{
	uint32_t d = e->depth;
	if (d > TP_GO_FRAME_COUNT)
		d = TP_GO_FRAME_COUNT;
	while (d > 0) {
		const struct tp_go_frame *f = &e->frames[d - 1];
		if (f->off < off || (!at_here && f->off == off))
			break;
		if (t)
			emit(c, t, f->probe | (TP_UNWOUND << TP_KIND_SHIFT), tsc, 0, f->tsc, 0, 0, 0, 0);
		d--;
	}
	__atomic_store_n(&e->depth, d, __ATOMIC_RELEASE);
	return d;
}

/* A call of Go code, probe `probe`, begins on goroutine `g` with its return
 * address at `slot` (the entry's work began at `tsc`, when the thread `t`
 * took it). */
HOT void go_push(struct tp_ctx *c, struct tp_thread *t, uint64_t g, uint64_t slot, uint32_t probe, uint64_t tsc)
{
	uint64_t off = go_offset(g, slot);
	struct tp_goroutine *e = off ? goroutine(c, g, 1) : 0;
	if (!e) {
		lose_too_deep(c); /* no goroutine entry: this call's exit goes unrecorded */
		return;
	}
	if (!tsc)
		tsc = tp_timestamp();
	uint32_t d = go_settle(c, t, e, off, 1, tsc);
	if (d >= TP_GO_FRAME_COUNT) {
		lose_too_deep(c);
		return;
	}
	struct tp_go_frame *f = &e->frames[d];
	f->off = (uint32_t)off; /* below TP_GO_MAX_STACK */
	f->probe = probe;
	f->children = 0;
	uint64_t now = tp_timestamp();
	if (d)
		e->overhead += now - tsc;
	f->tsc = now;
	f->overhead = e->overhead;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_store_n(&e->depth, d + 1, __ATOMIC_RELEASE);
}

/* A call of Go code ends at an exit of its function (see exit_at): on
 * goroutine `g`, its return address at `slot`. */
HOT void go_exit(struct tp_ctx *c, uint32_t word, uint64_t slot, uint64_t v0, uint64_t v1, uint64_t g, const int ext)
{
	uint64_t off = go_offset(g, slot);
	struct tp_goroutine *e = off ? goroutine(c, g, 0) : 0;
	if (!e || !e->depth)
		return;
	uint64_t tsc = tp_timestamp();
	struct tp_thread *t = thread_state(c, 1);
	uint32_t probe = word & TP_PROBE_MASK;
	uint32_t d = go_settle(c, t, e, off, 0, tsc);
	const struct tp_go_frame *f = d ? &e->frames[d - 1] : 0;
	if (!f || f->off != off || f->probe != probe) {
		d = go_settle(c, t, e, off, 1, tsc);
	} else {
		uint64_t entry_tsc = f->tsc, nested = e->overhead - f->overhead, children = f->children;
		if (d >= 2)
			e->frames[d - 2].children += own_ticks(tsc, entry_tsc, nested);
		__atomic_store_n(&e->depth, --d, __ATOMIC_RELEASE);
		uint64_t tail = !!(word & TP_TAIL_CALL);
		if (t && (!ext || record_exit(c, t, probe, v0, tsc, entry_tsc, nested, tail, 0, 0, 0)))
			emit(c, t, probe | (TP_EXIT << TP_KIND_SHIFT), tsc, v0, entry_tsc, v1, nested, tail, children);
		if (d)
			e->overhead += tp_timestamp() - tsc;
	}
	/* Its last timed call ended: the entry goes back. */
	if (!d)
		__atomic_store_n(&e->g, 0, __ATOMIC_RELEASE);
}
