/* What a probe records beyond its kind, for tp's in-target runtime
 * (runtime.c includes this after its own helpers): predicates on the
 * arguments and the return value (--if), counts by an argument's value or
 * the call site (--by, --by caller), aggregates of a value (--agg), the
 * call's stack (--stack), values copied from memory at entry (--args
 * 'req->len'), and durations kept as per-thread histograms in the data
 * region instead of exit events (--ret -q).
 *
 * Only tp_entry_ext and tp_exit_ext reach these blocks, each under its
 * flag; a probe without them is sent to tp_entry and tp_exit, which do not
 * contain them. Everything read here from the data region (a probe's
 * configuration, the aggregate tables) may have been written by the
 * target: every index is bounded, every program step checked, and memory
 * outside the region is read only inside the thread's stack, whose bounds
 * the runtime knows without a fault (stack_bounds), or by process_vm_readv
 * (a predicate's strings and fields, the fields --args names: read_own),
 * which fails instead of faulting.
 *
 * The stack walk reads the frame register as the probed function left it
 * (tp_frame_pointer, from the arch's runtime.h), which only the build with
 * TP_RESERVE_FRAME_POINTER guarantees: the plain build leaves the stack
 * out (it never calls emit_with_stack). */
#ifndef TP_RESERVE_FRAME_POINTER
#define tp_frame_pointer() 0
#endif

/* Probe `probe`'s configuration in the region. */
HOT const struct tp_probe_config *config_of(const struct tp_ctx *c, uint32_t probe)
{
	return (const struct tp_probe_config *)(c->configs + (uint64_t)probe * sizeof(struct tp_probe_config));
}

/* A register's low bytes extended to 64 bits (a C `int` argument leaves the
 * register's high half undefined). */
HOT uint64_t extend(uint64_t v, uint64_t how)
{
	switch (how) {
	case TP_FEXT_I8:
		return (uint64_t)(int64_t)(int8_t)v;
	case TP_FEXT_U8:
		return (uint8_t)v;
	case TP_FEXT_I16:
		return (uint64_t)(int64_t)(int16_t)v;
	case TP_FEXT_U16:
		return (uint16_t)v;
	case TP_FEXT_I32:
		return (uint64_t)(int64_t)(int32_t)v;
	case TP_FEXT_U32:
		return (uint32_t)v;
	default:
		return v;
	}
}

/* Reads `len` bytes at `addr` of this process into `buf` with
 * process_vm_readv, which fails where a load would fault (a bad pointer,
 * unmapped memory): the bytes read, or a negative error. Where the bytes
 * run past the end of `addr`'s page, the part in the next page is a
 * second piece, so that a read that runs into unmapped memory still
 * gives the bytes before it (a partial transfer stops between pieces). */
HOT int64_t read_own(const struct tp_ctx *c, uint64_t addr, void *buf, uint64_t len)
{
	uint64_t first = 4096 - (addr & 4095);
	if (first > len)
		first = len;
	uint64_t local[2] = {(uint64_t)buf, len};
	uint64_t remote[4] = {addr, first, addr + first, len - first};
	return (int64_t)tp_syscall6(TP_SYS_PROCESS_VM_READV, process_id(c), (uint64_t)local, 1, (uint64_t)remote,
				    first < len ? 2 : 1, 0);
}

/* 1 if the C string at `addr` in this process equals the `len` bytes of
 * `lit` (or, with `prefix`, starts with them). The bytes are read with
 * process_vm_readv from the process's own memory (read_own): a bad
 * pointer, or a string that runs into unmapped memory before it could
 * match, is not equal (0). */
HOT uint64_t string_is(const struct tp_ctx *c, uint64_t addr, const uint8_t *lit, uint64_t len, int prefix)
{
	uint8_t buf[TP_FILTER_STR_MAX + 1];
	uint64_t want = prefix ? len : len + 1;
	if (read_own(c, addr, buf, want) != (int64_t)want)
		return 0;
	for (uint64_t i = 0; i < len; i++)
		if (buf[i] != lit[i])
			return 0;
	return prefix || buf[len] == 0;
}

/* 1 if `width` is a width a load reads (1, 2, 4 or 8 bytes). */
HOT int load_width(uint64_t width)
{
	return width == 1 || width == 2 || width == 4 || width == 8;
}

/* Runs a predicate program (src/probe/filter.rs checks it before tp writes
 * it, and holds the same interpreter): 1 if the call is recorded. `args`
 * are the six argument registers (0 at an exit, where only the return
 * value `ret` is named). Each word is read once; whatever goes wrong (the
 * target rewrote the program) selects the call. At most TP_FILTER_WORDS
 * steps. */
HOT int predicate(const struct tp_ctx *c, const uint64_t *prog, const uint64_t *args, uint64_t ret)
{
	uint64_t st[TP_FILTER_DEPTH];
	uint32_t sp = 0;
	uint32_t pc = 0;
	while (pc < TP_FILTER_WORDS) {
		uint64_t w = __atomic_load_n(&prog[pc], __ATOMIC_RELAXED);
		uint64_t op = w & 0xff;
		pc++;
		if (op == TP_FOP_END)
			return sp != 1 || st[0] != 0;
		if (op == TP_FOP_ARG || op == TP_FOP_IMM) {
			if (sp >= TP_FILTER_DEPTH)
				return 1;
			uint64_t v;
			if (op == TP_FOP_IMM) {
				if (pc >= TP_FILTER_WORDS)
					return 1;
				v = __atomic_load_n(&prog[pc], __ATOMIC_RELAXED);
				pc++;
			} else {
				uint64_t r = (w >> 8) & 0xff;
				v = r < 6 ? (args ? args[r] : 0) : ret;
				v = extend(v, (w >> 16) & 0xff);
			}
			st[sp++] = v;
			continue;
		}
		if (op == TP_FOP_NOT) {
			if (sp < 1)
				return 1;
			st[sp - 1] = st[sp - 1] == 0;
			continue;
		}
		if (op == TP_FOP_STR) {
			uint64_t len = (w >> 8) & 0xff;
			uint64_t words = (len + 7) / 8;
			if (sp < 1 || len > TP_FILTER_STR_MAX || pc + words > TP_FILTER_WORDS)
				return 1;
			uint64_t lit[TP_FILTER_STR_MAX / 8];
			for (uint64_t i = 0; i < words; i++)
				lit[i] = __atomic_load_n(&prog[pc + i], __ATOMIC_RELAXED);
			pc += words;
			st[sp - 1] = string_is(c, st[sp - 1], (const uint8_t *)lit, len, (w & TP_FOP_STR_PREFIX) != 0);
			continue;
		}
		if (op == TP_FOP_LOAD) {
			/* A field: a call whose field cannot be read is not selected. */
			uint64_t width = (w >> 16) & 0xff, v = 0;
			if (sp < 1 || pc >= TP_FILTER_WORDS || !load_width(width))
				return 1;
			uint64_t off = __atomic_load_n(&prog[pc], __ATOMIC_RELAXED);
			pc++;
			if (read_own(c, st[sp - 1] + off, &v, width) != (int64_t)width)
				return 0;
			st[sp - 1] = extend(v, (w >> 8) & 0xff);
			continue;
		}
		if (sp < 2)
			return 1;
		uint64_t a = st[sp - 2], b = st[sp - 1], r;
		switch (op) {
		case TP_FOP_EQ:
			r = a == b;
			break;
		case TP_FOP_NE:
			r = a != b;
			break;
		case TP_FOP_LT_S:
			r = (int64_t)a < (int64_t)b;
			break;
		case TP_FOP_LE_S:
			r = (int64_t)a <= (int64_t)b;
			break;
		case TP_FOP_LT_U:
			r = a < b;
			break;
		case TP_FOP_LE_U:
			r = a <= b;
			break;
		case TP_FOP_AND:
			r = a != 0 && b != 0;
			break;
		case TP_FOP_OR:
			r = a != 0 || b != 0;
			break;
		case TP_FOP_BIT_AND:
			r = a & b;
			break;
		case TP_FOP_BIT_OR:
			r = a | b;
			break;
		case TP_FOP_BIT_XOR:
			r = a ^ b;
			break;
		default:
			return 1;
		}
		sp--;
		st[sp - 1] = r;
	}
	return 1;
}

/* --if: one more call of `probe` passed its predicates (the detour counted
 * it before any ran). */
HOT void count_match(const struct tp_ctx *c, uint32_t probe)
{
	__atomic_fetch_add(&((struct tp_probe_config *)config_of(c, probe))->matched, 1, __ATOMIC_RELAXED);
}

/* At an entry of tp_entry_ext with a predicate: 1 if the call passes it,
 * counted as matched unless a predicate on the return value is still to
 * come (record_exit counts it then). */
HOT int passes_entry(const struct tp_ctx *c, uint32_t probe_flags, const uint64_t *regs)
{
	uint32_t probe = probe_flags & TP_PROBE_MASK;
	if (!predicate(c, config_of(c, probe)->entry, regs, 0))
		return 0;
	if (!(probe_flags & TP_FILTER_EXIT))
		count_match(c, probe);
	return 1;
}

/* The thread's aggregates, after its ring: 0 if it has no ring. */
HOT struct tp_agg *aggregates(struct tp_ctx *c, struct tp_thread *t)
{
	struct tp_slot *s = ring_slot(c, t);
	return s ? (struct tp_agg *)((uint64_t)s + c->agg_off) : 0;
}

/* Who counts in `a` (thread `t`'s aggregates, from aggregates()): its
 * process, as the slot's key says (layout.rs, SlotHead::key), and its
 * thread as it is now (thread_id). Entries are kept under it: a thread
 * that takes over the slot of one that ended (glibc hands a new thread
 * the descriptor, and so the slot, of one that ended) counts in entries
 * of its own. */
HOT uint64_t owner_of(const struct tp_ctx *c, const struct tp_thread *t, struct tp_agg *a)
{
	uint64_t key = __atomic_load_n(&((struct tp_slot *)((uint64_t)a - c->agg_off))->key, __ATOMIC_RELAXED);
	return (key & ~0xffffffffull) | thread_id(t);
}

/* --by caller: the return address of the call whose entry runs, at
 * stack slot `slot` (tp_return_address, the arch's runtime.h). A tail call
 * from a function whose return tp replaced leaves the trampoline there:
 * the caller is then the one that frame kept (the function that made the
 * first call, as the call returns to it). */
HOT uint64_t caller_of(const struct tp_thread *t, const uint64_t *slot)
{
	uint64_t v = tp_return_address(slot);
	uint32_t d = t->depth;
	if (d > 0 && d <= TP_SHADOW_LEN) {
		const struct tp_frame *f = &t->shadow[d - 1];
		if (f->slot == (uint64_t)slot && f->tramp && v == f->tramp)
			return f->ret;
	}
	return v;
}

/* --by stack: where a call's stack key is walked from (stack_key): the
 * call's return address `first`, at stack slot `slot`, at most `depth`
 * frames, in thread `t` of `c`. */
struct key_stack {
	const struct tp_ctx *c;
	struct tp_thread *t;
	uint64_t first, slot;
	uint32_t depth;
};

/* The key of the stack `k` says, and with `out` its frames written there:
 * `first`, then the return address of each frame record found by
 * following the frame pointer the function was entered with (or has put
 * back, at an exit), as emit_with_stack walks them, at most `depth` in
 * all (TP_STACK_KEY_DEPTH at most). Every record read lies in the
 * thread's stack bounds, above the last; without bounds the key is the
 * return address alone. The hash is layout.rs's stack_hash. Walked once
 * per call, and again (into the thread's store) when the key is new. */
HOT uint64_t stack_key(const struct key_stack *k, struct tp_stack_key *out);

/* How many frames a --by stack key of `by` takes (its EXT bits). */
HOT uint32_t stack_key_depth(uint32_t by)
{
	uint32_t d = (by >> 8) & 0xff;
	return d == 0 ? 1 : d > TP_STACK_KEY_DEPTH ? TP_STACK_KEY_DEPTH : d;
}

/* --agg: adds value `v` (if `has`; signed if `sign`) of a call of `probe`
 * under `key` to the thread's table of aggregates `a`, in an entry of
 * `owner`'s (owner_of): count, sum,
 * minimum, maximum and a histogram of powers of two (one writer: plain
 * stores of whole words, the count last). A full table counts the call as
 * overflow.
 *
 * aggregate_value, at entry, reads the value the probe's program names
 * (layout.rs, ProbeConfig::agg: an argument, or a field through loads by
 * read_own, which fail instead of faulting: the call is then counted as
 * unreadable) under the key of --by's argument (0 without one), the
 * caller, or the stack (`ks`: its frames go beside a new entry). The
 * program's header is checked as it is read: one the target rewrote into
 * something else counts nothing. */
HOT void add_keyed(struct tp_agg *a, uint64_t owner, uint32_t probe, uint64_t key, uint64_t v, int has, int sign,
		   const struct key_stack *ks)
{
	struct tp_aggv *table = (struct tp_aggv *)((uint64_t)a + sizeof(struct tp_agg) +
						   TP_AGG_LAT_ENTRIES * sizeof(struct tp_lat) +
						   TP_AGG_BY_ENTRIES * sizeof(struct tp_by));
	uint64_t at = ((key ^ ((uint64_t)probe << 40)) * 0x9e3779b97f4a7c15ull) >> (64 - TP_AGG_VAL_BITS);
	for (uint64_t i = 0; i < TP_AGG_PROBES; i++) {
		uint64_t index = (at + i) & (TP_AGG_VAL_ENTRIES - 1);
		struct tp_aggv *e = &table[index];
		uint32_t p = e->probe;
		if (p == 0) {
			/* A stack key's frames, beside its entry, before the
			 * entry's probe word makes it count. */
			if (ks)
				stack_key(ks, (struct tp_stack_key *)(table + TP_AGG_VAL_ENTRIES) + index);
			e->key = key;
			e->key = key;
			e->owner = owner;
			e->count = 0;
			e->sum = 0;
			e->min = v;
			e->max = v;
			__atomic_store_n(&e->probe, probe + 1, __ATOMIC_RELEASE);
		} else if (p != probe + 1 || e->key != key || e->owner != owner) {
			continue;
		}
		if (has) {
			uint64_t b = sign && (int64_t)v < 0 ? 0 : v == 0 ? 1 : 2 + (63 - (uint64_t)__builtin_clzll(v));
			__atomic_store_n(&e->buckets[b], e->buckets[b] + 1, __ATOMIC_RELAXED);
			__atomic_store_n(&e->sum, e->sum + v, __ATOMIC_RELAXED);
			uint64_t lo = e->min, hi = e->max;
			int below = sign ? (int64_t)v < (int64_t)lo : v < lo;
			int above = sign ? (int64_t)v > (int64_t)hi : v > hi;
			__atomic_store_n(&e->min, below ? v : lo, __ATOMIC_RELAXED);
			__atomic_store_n(&e->max, above ? v : hi, __ATOMIC_RELAXED);
		}
		/* The count last: tp reads an aggregate whose count it has seen. */
		__atomic_store_n(&e->count, e->count + 1, __ATOMIC_RELEASE);
		return;
	}
	__atomic_store_n(&a->agg_overflow, a->agg_overflow + 1, __ATOMIC_RELAXED);
}

/* add_keyed for a key that is not a stack (the stack's branch compiled
 * out). */
HOT void add_value(struct tp_agg *a, uint64_t owner, uint32_t probe, uint64_t key, uint64_t v, int has, int sign)
{
	add_keyed(a, owner, probe, key, v, has, sign, 0);
}

HOT void aggregate_value(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, const uint64_t *regs,
			 const uint64_t *slot, uint32_t by)
{
	struct tp_agg *a = aggregates(c, t);
	if (!a || (by & TP_BY_AT_EXIT))
		return;
	const struct tp_probe_config *cfg = config_of(c, probe);
	uint64_t r = by & 0xff;
	uint64_t key = r < 6 ? extend(regs[r], (by >> 8) & 0xff) : r == TP_BY_CALLER ? caller_of(t, slot) : 0;
	uint64_t h = __atomic_load_n(&cfg->agg[0], __ATOMIC_RELAXED);
	uint64_t v = 0;
	if (h) {
		uint64_t loads = (h >> TP_FETCH_LOADS_SHIFT) & 0xff, width = (h >> TP_FETCH_WIDTH_SHIFT) & 0xff;
		if (((h >> 32) & 0xff) != 1 || (h & 0xff) > 5 || loads > TP_FETCH_DEPTH || !load_width(width))
			return;
		v = regs[h & 0xff];
		for (uint64_t k = 0; k < loads; k++) {
			uint64_t at = v + __atomic_load_n(&cfg->agg[1 + k], __ATOMIC_RELAXED);
			uint64_t want = k + 1 == loads ? width : 8, got = 0;
			if (read_own(c, at, &got, want) != (int64_t)want) {
				__atomic_store_n(&a->agg_unreadable, a->agg_unreadable + 1, __ATOMIC_RELAXED);
				return;
			}
			v = got;
		}
		v = extend(v, (h >> TP_AGGV_EXT_SHIFT) & 0xff);
	}
	int sign = (h & TP_AGGV_SIGNED) != 0;
	if (UNLIKELY(r == TP_BY_STACK)) {
		struct key_stack ks = {c, t, caller_of(t, slot), (uint64_t)slot, stack_key_depth(by)};
		add_keyed(a, owner_of(c, t, a), probe, stack_key(&ks, 0), v, h != 0, sign, &ks);
		return;
	}
	add_value(a, owner_of(c, t, a), probe, key, v, h != 0, sign);
}

/* A duration of `ticks` in nanoseconds: by the multiplier tp wrote in
 * the context (layout.rs, EventCtx::ns_mult), as the kernel's clocksources
 * convert their cycles (a 64 x 64 bit product, then a shift). */
HOT uint64_t to_ns(const struct tp_ctx *c, uint64_t ticks)
{
	unsigned __int128 ns = ((unsigned __int128)ticks * __atomic_load_n(&c->ns_mult, __ATOMIC_RELAXED)) >> TP_NS_SHIFT;
	return ns >> 64 ? ~0ull : (uint64_t)ns;
}

/* --agg of the return value or the latency: at the exit of a call whose
 * durations the thread keeps (TP_AGGREGATE). The latency is the call's
 * own `ticks` in nanoseconds; the return value `ret` is extended as the
 * program's header says, and a tail call, which leaves no return value
 * of its own, is not counted. The key is an argument's low 32 bits that
 * the entry kept in the call's frame (`frame_key`, TP_BY_KEY_IN_FRAME),
 * extended again as --by's word says; with --by caller the return
 * address the frame kept at entry (`frame_ret`, 0 for goroutine frames,
 * which tp refuses to key so); or 0. */
HOT void add_at_exit(struct tp_ctx *c, struct tp_thread *t, struct tp_agg *a, uint32_t probe, uint32_t by,
			uint64_t key, uint64_t ret, uint64_t tail, uint64_t ticks, const struct key_stack *ks)
{
	if (by & TP_BY_LATENCY) {
		add_keyed(a, owner_of(c, t, a), probe, key, to_ns(c, ticks), 1, 0, ks);
		return;
	}
	if (tail)
		return;
	uint64_t h = __atomic_load_n(&config_of(c, probe)->agg[0], __ATOMIC_RELAXED);
	if (((h >> 32) & 0xff) != 1)
		return;
	add_keyed(a, owner_of(c, t, a), probe, key, extend(ret, (h >> TP_AGGV_EXT_SHIFT) & 0xff), 1,
		  (h & TP_AGGV_SIGNED) != 0, ks);
}

HOT void aggregate_at_exit(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t ret, uint64_t tail,
			   uint64_t ticks, uint32_t frame_key, uint64_t frame_ret, uint64_t slot)
{
	const struct tp_probe_config *cfg = config_of(c, probe);
	uint32_t by = __atomic_load_n(&cfg->by, __ATOMIC_RELAXED);
	struct tp_agg *a = aggregates(c, t);
	if (!a || !(by & TP_BY_AGG) || !(by & TP_BY_AT_EXIT))
		return;
	/* A stack key is walked again: at an exit the function has put its
	 * caller's frame pointer back, so the walk reads the entry's frames. */
	if (UNLIKELY((by & 0xff) == TP_BY_STACK)) {
		struct key_stack ks = {c, t, frame_ret, slot, stack_key_depth(by)};
		add_at_exit(c, t, a, probe, by, stack_key(&ks, 0), ret, tail, ticks, &ks);
		return;
	}
	uint64_t key = (by & TP_BY_KEY_IN_FRAME) && (by & 0xff) < 6 ? extend(frame_key, (by >> 8) & 0xff)
		       : (by & 0xff) == TP_BY_CALLER			    ? frame_ret
									    : 0;
	add_at_exit(c, t, a, probe, by, key, ret, tail, ticks, 0);
}

/* What the frame of a call of `probe` keeps for its exit: with
 * TP_BY_KEY_IN_FRAME, the low 32 bits of the argument that keys a value
 * added at the exit; else 0. Read where the entry pushes the frame only,
 * so that a count or an aggregate at entry costs nothing more. */
HOT uint32_t frame_key(const struct tp_ctx *c, uint32_t probe, const uint64_t *regs)
{
	uint32_t by = __atomic_load_n(&config_of(c, probe)->by, __ATOMIC_RELAXED);
	uint64_t r = by & 0xff;
	return (by & TP_BY_AT_EXIT) && (by & TP_BY_KEY_IN_FRAME) && r < 6 ? (uint32_t)regs[r] : 0;
}

/* --by: counts the call under its argument's value, in the thread's table
 * (one writer: plain stores, whole words, which tp reads as they are). A
 * full table counts the call as overflow. */
HOT void count_by(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, const uint64_t *regs, const uint64_t *slot)
{
	uint32_t by = __atomic_load_n(&config_of(c, probe)->by, __ATOMIC_RELAXED);
	if (by & TP_BY_AGG) {
		aggregate_value(c, t, probe, regs, slot, by);
		return;
	}
	uint64_t r = by & 0xff;
	struct tp_agg *a = aggregates(c, t);
	if (r > 5 || !a)
		return;
	uint64_t v = extend(regs[r], (by >> 8) & 0xff), owner = owner_of(c, t, a);
	struct tp_by *table = (struct tp_by *)((uint64_t)a + sizeof(struct tp_agg) +
					       TP_AGG_LAT_ENTRIES * sizeof(struct tp_lat));
	uint64_t h = ((v ^ ((uint64_t)probe << 40)) * 0x9e3779b97f4a7c15ull) >> (64 - TP_AGG_BY_BITS);
	for (uint64_t i = 0; i < TP_AGG_PROBES; i++) {
		struct tp_by *e = &table[(h + i) & (TP_AGG_BY_ENTRIES - 1)];
		uint32_t p = e->probe;
		if (p == 0) {
			e->value = v;
			e->owner = owner;
			e->count = 0;
			__atomic_store_n(&e->probe, probe + 1, __ATOMIC_RELEASE);
		} else if (p != probe + 1 || e->value != v || e->owner != owner) {
			continue;
		}
		__atomic_store_n(&e->count, e->count + 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_store_n(&a->by_overflow, a->by_overflow + 1, __ATOMIC_RELAXED);
}

/* The bucket of a duration of `ticks` (layout.rs, lat_bucket). */
HOT uint64_t lat_bucket(uint64_t ticks)
{
	if (ticks < (1u << TP_LAT_SUB_BITS))
		return ticks;
	uint64_t power = 63 - (uint64_t)__builtin_clzll(ticks);
	uint64_t sub = (ticks >> (power - TP_LAT_SUB_BITS)) & ((1u << TP_LAT_SUB_BITS) - 1);
	return ((power - TP_LAT_SUB_BITS + 1) << TP_LAT_SUB_BITS) + sub;
}

/* Adds a duration to the thread's histogram of `probe`: 0 if the thread's
 * table has no room for it (the exit then goes through the ring). */
HOT int aggregate(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t ticks)
{
	struct tp_agg *a = aggregates(c, t);
	if (!a)
		return 0;
	struct tp_lat *table = (struct tp_lat *)((uint64_t)a + sizeof(struct tp_agg));
	for (uint64_t i = 0; i < TP_AGG_PROBES; i++) {
		struct tp_lat *e = &table[(probe + i) & (TP_AGG_LAT_ENTRIES - 1)];
		uint32_t p = e->probe;
		if (p == 0) {
			e->count = 0;
			e->sum = 0;
			e->min = ticks;
			e->max = ticks;
			__atomic_store_n(&e->probe, probe + 1, __ATOMIC_RELEASE);
		} else if (p != probe + 1) {
			continue;
		}
		uint64_t b = lat_bucket(ticks);
		if (b >= TP_LAT_BUCKETS)
			b = TP_LAT_BUCKETS - 1;
		__atomic_store_n(&e->buckets[b], e->buckets[b] + 1, __ATOMIC_RELAXED);
		__atomic_store_n(&e->sum, e->sum + ticks, __ATOMIC_RELAXED);
		/* Stored either way: the same instructions for every call. */
		uint64_t lo = e->min, hi = e->max;
		__atomic_store_n(&e->min, ticks < lo ? ticks : lo, __ATOMIC_RELAXED);
		__atomic_store_n(&e->max, ticks > hi ? ticks : hi, __ATOMIC_RELAXED);
		/* The count last: tp reads a histogram whose count it has seen. */
		__atomic_store_n(&e->count, e->count + 1, __ATOMIC_RELEASE);
		return 1;
	}
	return 0;
}

/* At an exit of tp_exit_ext or tp_exit_at_ext: 1 if the exit event is to be sent. Its
 * predicate on the return value may reject it; a probe that keeps its
 * durations in the target adds this one there (keyed by what the call's
 * frame kept: `frame_key`, `frame_ret`, see aggregate_at_exit). */
HOT int record_exit(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t ret, uint64_t tsc,
		    uint64_t entry_tsc, uint64_t nested, uint64_t tail, uint32_t frame_key, uint64_t frame_ret,
		    uint64_t slot)
{
	const struct tp_probe_config *cfg = config_of(c, probe);
	uint32_t flags = __atomic_load_n(&cfg->flags, __ATOMIC_RELAXED);
	/* A tail call leaves no return value of its own: a predicate on it
	 * does not select the call. */
	if (flags & TP_FILTER_EXIT) {
		if (tail || !predicate(c, cfg->exit, 0, ret))
			return 0;
		count_match(c, probe);
	}
	if (flags & TP_AGGREGATE) {
		/* As tp times an exit event: from the entry moved later by tp's
		 * own ticks in the call's callees, never past the exit. */
		uint64_t ticks = own_ticks(tsc, entry_tsc, nested);
		if (flags & TP_BY)
			aggregate_at_exit(c, t, probe, ret, tail, ticks, frame_key, frame_ret, slot);
		return !aggregate(c, t, probe, ticks);
	}
	return 1;
}

/* The part [lo, hi) of the stack the thread runs on at `sp` that it can
 * read without a fault; 0 if the runtime cannot tell. The main thread's
 * stack is the one tp saw at attach. Another thread of glibc or musl
 * keeps its TCB (the thread pointer, its key) at the top of the block its
 * stack lies in; the kernel is asked once per thread and stack whether
 * everything from the stack pointer up to it is readable (madvise
 * MADV_POPULATE_READ fails on memory that is not), and the answer is kept
 * in the thread's state for the TID it was found for. Never a read
 * outside what was checked. */
HOT int stack_bounds(const struct tp_ctx *c, struct tp_thread *t, uint64_t sp, uint64_t *lo, uint64_t *hi)
{
	uint32_t tid = thread_id(t);
	if (t->stack_tid == tid && t->stack_lo <= sp && sp < t->stack_hi) {
		*lo = t->stack_lo;
		*hi = t->stack_hi;
		return 1;
	}
	if (c->main_stack_lo <= sp && sp < c->main_stack_hi) {
		*lo = c->main_stack_lo;
		*hi = c->main_stack_hi;
		return 1;
	}
	uint64_t top = t->key;
	if (!c->may_check_memory || (top & 7) || top <= sp || top - sp > TP_MAX_THREAD_STACK)
		return 0;
	/* A thread whose check failed does not ask again for the same stack. */
	if (t->stack_tid == tid && t->stack_hi == 1 && t->stack_lo == top)
		return 0;
	uint64_t from = sp & ~4095ull;
	if (tp_syscall4(TP_SYS_MADVISE, from, top - from, TP_MADV_POPULATE_READ, 0) != 0) {
		t->stack_lo = top;
		t->stack_hi = 1;
		t->stack_tid = tid;
		return 0;
	}
	t->stack_lo = from;
	t->stack_hi = top;
	t->stack_tid = tid;
	*lo = from;
	*hi = top;
	return 1;
}

/* The return address in the stack word at `at`: the original where a
 * return probe put its trampoline there. */
HOT uint64_t real_return(const struct tp_thread *t, uint64_t at, uint64_t word)
{
	for (uint32_t k = t->depth; k > 0; k--) {
		const struct tp_frame *f = &t->shadow[k - 1];
		if (f->slot == at && f->tramp == word)
			return f->ret;
	}
	return word;
}

/* One step of a frame-pointer walk: the return address in the frame
 * record at `fp` ([fp] the caller's fp, [fp + 8] its return address), or
 * 0 where the walk ends: a record misaligned, not above the last one
 * (`prev`, first the stack pointer), not wholly inside the checked bounds
 * [lo, hi), or with no return address. */
HOT uint64_t frame_return(uint64_t fp, uint64_t prev, uint64_t lo, uint64_t hi)
{
	if ((fp & 7) || fp <= prev || fp < lo || fp >= hi || hi - fp < 16)
		return 0;
	return ((const volatile uint64_t *)fp)[1];
}

HOT uint64_t stack_key(const struct key_stack *k, struct tp_stack_key *out)
{
	uint64_t h = 0x2545f4914f6cdd1dull, ret = k->first, lo = 0, hi = 0;
	uint32_t n = 0;
	int bounded = k->depth > 1 && stack_bounds(k->c, k->t, k->slot, &lo, &hi) && lo <= k->slot && k->slot < hi;
	uint64_t fp = tp_frame_pointer(), prev = k->slot;
	for (;;) {
		if (out)
			out->frames[n] = ret;
		n++;
		h = (h ^ ret) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 31;
		if (!bounded || n >= k->depth)
			break;
		ret = frame_return(fp, prev, lo, hi);
		if (ret == 0)
			break;
		ret = real_return(k->t, fp + 8, ret);
		prev = fp;
		fp = ((const volatile uint64_t *)fp)[0];
	}
	h = (h ^ n) * 0x9e3779b97f4a7c15ull;
	h ^= h >> 31;
	if (out) {
		out->n = n;
		out->hash = h;
	}
	return h;
}

/* Where word `i` of a stack goes: the records after the event at `head`,
 * TP_STACK_WORDS_PER_EVENT words each, in `tsc` and then `v`. */
HOT uint64_t *stack_word(struct tp_slot *s, uint64_t mask, uint64_t head, uint32_t i)
{
	struct tp_event *e = s->ring + ((head + 1 + i / TP_STACK_WORDS_PER_EVENT) & mask);
	uint32_t j = i % TP_STACK_WORDS_PER_EVENT;
	return j == 0 ? &e->tsc : &e->v[j - 1];
}

/* Marks the `used` records after the entry event at `head` as holding the
 * `n` words written with stack_word, and publishes the entry and them at
 * once. */
HOT void publish_records(struct tp_thread *t, struct tp_slot *s, uint64_t mask, uint64_t head, uint32_t n,
			 uint32_t used)
{
	for (uint32_t r = 0; r < used; r++) {
		struct tp_event *x = s->ring + ((head + 1 + r) & mask);
		uint32_t words = n - r * TP_STACK_WORDS_PER_EVENT;
		if (words > TP_STACK_WORDS_PER_EVENT)
			words = TP_STACK_WORDS_PER_EVENT;
		x->probe = ((uint32_t)TP_STACK_RECORD << TP_KIND_SHIFT) | words;
		x->tid = 0;
	}
	__atomic_store_n(&s->head, head + 1 + used, __ATOMIC_RELEASE);
	end_write(t);
}

/* --args with fields: copies the values the probe's fetch program names
 * (layout.rs, fetch_word) from the process's memory, each load through
 * read_own, so that a bad pointer anywhere on the way gives the address
 * that failed, never a fault, and sends them after the entry event, in a
 * stack's place (TP_STACK_FIELDS), all published at once. The program's
 * headers are read and checked once (the target can write the region: a
 * header that is not one ends the values), which fixes how many words
 * follow before the ring is reserved; the values are read straight into
 * the ring (a signal handler's probe on this thread meanwhile counts its
 * event lost, as while any event is written). */
HOT void emit_with_fields(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t tsc, const uint64_t *regs,
			  int more)
{
	const struct tp_probe_config *cfg = config_of(c, probe);
	uint64_t heads[TP_FETCH_VALUES];
	uint32_t starts[TP_FETCH_VALUES];
	uint32_t values = 0, pc = 0, n = 2;
	while (values < TP_FETCH_VALUES && pc < TP_FETCH_WORDS) {
		uint64_t h = __atomic_load_n(&cfg->fetch[pc], __ATOMIC_RELAXED);
		uint64_t loads = (h >> TP_FETCH_LOADS_SHIFT) & 0xff, str = (h >> TP_FETCH_STR_SHIFT) & 0xff;
		if ((h >> 32) != 1 || (h & 0xff) > 5 || loads > TP_FETCH_DEPTH || pc + 1 + loads > TP_FETCH_WORDS ||
		    !load_width((h >> TP_FETCH_WIDTH_SHIFT) & 0xff) || str > TP_FETCH_STR_MAX || (str & 7))
			break;
		heads[values] = h;
		starts[values] = pc + 1;
		values++;
		pc += 1 + (uint32_t)loads;
		n += 1 + (str ? 1 + (uint32_t)(str / 8) : 0);
	}
	uint32_t used = (n + TP_STACK_WORDS_PER_EVENT - 1) / TP_STACK_WORDS_PER_EVENT;
	uint64_t mask = c->ring_mask;
	if (1 + used + !!more > mask + 1) {
		lose(c, t, 1);
		return;
	}
	struct tp_slot *s = begin_events(c, t, 1 + used + !!more);
	if (!s)
		return;
	uint64_t head = s->head;
	head = put_entry(c, t, s, head, probe, tsc, regs, more);
	uint32_t w = 2;
	uint64_t ok = 0;
	for (uint32_t i = 0; i < values; i++) {
		uint64_t h = heads[i];
		uint64_t loads = (h >> TP_FETCH_LOADS_SHIFT) & 0xff, width = (h >> TP_FETCH_WIDTH_SHIFT) & 0xff;
		uint64_t str = (h >> TP_FETCH_STR_SHIFT) & 0xff;
		uint64_t v = regs[h & 0xff];
		int good = 1;
		for (uint64_t k = 0; k < loads; k++) {
			uint64_t at = v + __atomic_load_n(&cfg->fetch[starts[i] + k], __ATOMIC_RELAXED);
			uint64_t want = k + 1 == loads ? width : 8, got = 0;
			if (read_own(c, at, &got, want) != (int64_t)want) {
				v = at;
				good = 0;
				break;
			}
			v = got;
		}
		*stack_word(s, mask, head, w++) = v;
		ok |= (uint64_t)good << i;
		if (!str)
			continue;
		uint64_t buf[TP_FETCH_STR_MAX / 8];
		int64_t got = good && v ? read_own(c, v, buf, str) : 0;
		uint64_t have = got > 0 ? (uint64_t)got : 0;
		*stack_word(s, mask, head, w++) = have;
		/* Only the bytes read: the rest of the words are zeros. */
		for (uint64_t j = 0; j < str / 8; j++) {
			uint64_t word = 8 * j < have ? buf[j] : 0;
			if (8 * j < have && have < 8 * j + 8)
				word &= (1ull << (8 * (have - 8 * j))) - 1;
			*stack_word(s, mask, head, w++) = word;
		}
	}
	*stack_word(s, mask, head, 0) = TP_STACK_FIELDS | ((uint64_t)(n - 1) << TP_STACK_COUNT_SHIFT);
	*stack_word(s, mask, head, 1) = ok;
	publish_records(t, s, mask, head, n, used);
}

/* Records the call's stack after its entry event, both published at once:
 * return addresses found by following frame pointers (stack_depth of
 * them), or a copy of the stack's top (stack_copy bytes) for tp to unwind
 * with the function's unwind tables. A ring without room for the longest
 * such event drops it (counted). `slot` is the stack pointer at the
 * function's entry, where its return address is; `more` as emit_entry's. */
HOT void emit_with_stack(struct tp_ctx *c, struct tp_thread *t, uint32_t probe, uint64_t tsc, const uint64_t *regs,
			 uint64_t *slot, int more)
{
	const struct tp_probe_config *cfg = config_of(c, probe);
	if (__atomic_load_n(&cfg->fetch[0], __ATOMIC_RELAXED)) {
		emit_with_fields(c, t, probe, tsc, regs, more);
		return;
	}
	uint32_t depth = __atomic_load_n(&cfg->stack_depth, __ATOMIC_RELAXED);
	uint32_t copy = __atomic_load_n(&cfg->stack_copy, __ATOMIC_RELAXED) / 8;
	if (depth > TP_MAX_STACK_DEPTH)
		depth = TP_MAX_STACK_DEPTH;
	if (copy > TP_MAX_STACK_COPY / 8)
		copy = TP_MAX_STACK_COPY / 8;
	uint32_t most = copy ? 4 + copy : 1 + (depth ? depth : 1);
	uint32_t records = 1 + (most + TP_STACK_WORDS_PER_EVENT - 1) / TP_STACK_WORDS_PER_EVENT;
	uint64_t mask = c->ring_mask;
	if (records + !!more > mask + 1) {
		lose(c, t, 1);
		return;
	}
	struct tp_slot *s = begin_events(c, t, records + !!more);
	if (!s)
		return;
	uint64_t head = s->head;
	head = put_entry(c, t, s, head, probe, tsc, regs, more);

	uint64_t sp = (uint64_t)slot, lo = 0, hi = 0;
	int bounded = stack_bounds(c, t, sp, &lo, &hi) && lo <= sp && sp < hi;
	uint64_t head_word = 0;
	uint32_t n = 1; /* words written after the header */
	if (copy) {
		head_word = TP_STACK_COPY;
		*stack_word(s, mask, head, n++) = sp;
		*stack_word(s, mask, head, n++) = tp_frame_pointer();
		*stack_word(s, mask, head, n++) = real_return(t, sp, *slot);
		uint64_t words = bounded ? (hi - sp) / 8 : 1;
		if (words > copy) {
			words = copy;
			head_word |= TP_STACK_TRUNCATED;
		}
		for (uint64_t i = 0; i < words; i++) {
			uint64_t at = sp + 8 * i;
			*stack_word(s, mask, head, n++) = real_return(t, at, *(const volatile uint64_t *)at);
		}
		head_word |= (words << TP_STACK_COUNT_SHIFT);
	} else {
		head_word = TP_STACK_FRAMES;
		uint32_t found = 0;
		/* The return address at the stack pointer, then one per frame
		 * record: [fp] the caller's fp, [fp + 8] its return address.
		 * Every record lies in the checked bounds, above the last. */
		*stack_word(s, mask, head, n++) = real_return(t, sp, *slot);
		found++;
		uint64_t fp = tp_frame_pointer(), prev = sp;
		while (bounded && found < depth) {
			uint64_t ret = frame_return(fp, prev, lo, hi);
			if (ret == 0)
				break;
			*stack_word(s, mask, head, n++) = real_return(t, fp + 8, ret);
			found++;
			prev = fp;
			fp = ((const volatile uint64_t *)fp)[0];
		}
		if (found == depth && bounded && frame_return(fp, prev, lo, hi) != 0)
			head_word |= TP_STACK_TRUNCATED;
		head_word |= ((uint64_t)found << TP_STACK_COUNT_SHIFT);
	}
	if (!bounded)
		head_word |= TP_STACK_NO_BOUNDS;
	*stack_word(s, mask, head, 0) = head_word;
	uint32_t used = (n + TP_STACK_WORDS_PER_EVENT - 1) / TP_STACK_WORDS_PER_EVENT;
	publish_records(t, s, mask, head, n, used);
}
