/* floor: what counting a call costs at best on this machine, measured in
 * the same benchmark run as tp (benches/tp), so tp's numbers can be read
 * against the machine's state at that moment. No tracer is involved.
 *
 * A tiny noinline function is called in a loop by 1 and by 2 threads:
 *   plain   as it is;
 *   own     plus a plain `inc` of a counter of the thread's own (a
 *           thread-local variable), as tp's counting detour does in the
 *           thread's counter row;
 *   slot    plus `lock inc` of a counter in a row chosen by hashing the
 *           thread pointer (fs:0), as tp's detour did before issue 17;
 *   shared  plus `lock inc` of one counter that every thread writes.
 * and rdtsc, the timestamp an event costs, is timed on its own. What an
 * event costs at best, by 1 thread:
 *   event   plus one rdtsc and a 64-byte event written to a ring of
 *           2^16 (as tp's entry event: six argument words, the
 *           timestamp, thread and probe), its head advanced;
 *   found   event, with its ring found as tp's detours found a thread's
 *           until issue 17's third round: the word at fs:0 hashed into a
 *           cache of entries, then the entry's thread state, the state's
 *           ring slot and the slot's head, four loads each waiting for the
 *           one before. Without an rdtsc such a chain overlaps the next
 *           call's and costs nothing measurable; an rdtsc lets no call
 *           overlap the next, so it is paid in full;
 *   now     event, with its ring found as tp's detours find it now: the
 *           word at fs:0 hashed, then the cache entry's ring slot and the
 *           slot's head, three loads;
 *   owned   event, with its head, room and ring in a block of the
 *           thread's own at a fixed offset from its thread pointer (an
 *           initial-exec thread-local variable), one load: what tp's
 *           detours would pay if tp owned such a block in every thread
 *           of the target (a segment register of its own);
 *   hijack  plus its return address taken over: it returns to a stub that
 *           jumps back to its caller (what a return probe does at least,
 *           which the CPU's return prediction cannot follow);
 *   timed   both hijack and event, with a second rdtsc at the return (an
 *           exit with its latency: two timestamps, one event).
 *
 *   floor N   prints "floor threads=T plain=NS own=NS slot=NS shared=NS"
 *             for T = 1 and 2 (ns per call per thread, the median of 5
 *             runs of N calls per thread), then "floor rdtsc=NS", then
 *             "floor event=NS found=NS now=NS owned=NS hijack=NS timed=NS"
 *             (extra ns per call).
 */
#include "common.h"

#include <pthread.h>
#include <time.h>
#include <x86intrin.h>

#define ROWS 64
#define STRIDE 512 /* u64s per row: rows are 4 KiB apart */

static uint64_t rows[ROWS * STRIDE] __attribute__((aligned(4096)));
static uint64_t shared_counter __attribute__((aligned(64)));

TP_PROBED unsigned f_plain(unsigned x)
{
	return x * 0x9E3779B1u ^ (x >> 7);
}

static __thread uint64_t own_counter;

TP_PROBED unsigned f_own(unsigned x)
{
	own_counter++;
	return x * 0x9E3779B1u ^ (x >> 7);
}

TP_PROBED unsigned f_slot(unsigned x)
{
	uint64_t tp;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	uint64_t row = ((tp >> 12) * 0x9e3779b97f4a7c15ull) >> 58;
	__atomic_fetch_add(&rows[row * STRIDE], 1, __ATOMIC_RELAXED);
	return x * 0x9E3779B1u ^ (x >> 7);
}

TP_PROBED unsigned f_shared(unsigned x)
{
	__atomic_fetch_add(&shared_counter, 1, __ATOMIC_RELAXED);
	return x * 0x9E3779B1u ^ (x >> 7);
}

/* One event as tp's ring holds it. */
struct event {
	uint32_t probe, tid;
	uint64_t tsc;
	uint64_t v[6];
} __attribute__((aligned(64)));

#define RING (1u << 16)
static struct event ring[RING];
static uint64_t head;

/* The ring is read at the end (its sum printed), so that the compiler
 * keeps every event's stores: a ring nothing reads is dead, and its
 * stores were once optimised away, leaving only the rdtsc and the head. */
static uint64_t ring_sum(void)
{
	uint64_t sum = 0;
	for (unsigned i = 0; i < RING; i++)
		sum += ring[i].tsc ^ ring[i].v[0] ^ ring[i].v[5] ^ ring[i].probe;
	return sum;
}

/* Writes one event into `events` (a ring of RING) at `*at`, and publishes it. */
static inline void record_in(struct event *events, uint64_t *at, unsigned x, uint64_t tsc)
{
	uint64_t h = *at;
	struct event *e = &events[h & (RING - 1)];
	for (int i = 0; i < 6; i++)
		e->v[i] = x + (uint64_t)i;
	e->tid = 1;
	e->probe = 1;
	e->tsc = tsc;
	__atomic_store_n(at, h + 1, __ATOMIC_RELEASE);
}

static inline void record(unsigned x, uint64_t tsc)
{
	record_in(ring, &head, x, tsc);
}

TP_PROBED unsigned f_event(unsigned x)
{
	record(x, __rdtsc());
	return x * 0x9E3779B1u ^ (x >> 7);
}

/* f_found's way to its ring: every cache entry leads to the one state. */
struct found_slot {
	uint64_t head;
	struct event *ring;
};
struct found_state {
	uint64_t depth;
	struct found_slot *slot;
};
struct found_entry {
	uint64_t check;
	struct found_state *state;
};
static struct found_slot found_slot = {0, ring};
static struct found_state found_state = {0, &found_slot};
static struct found_entry found_cache[64];

TP_PROBED unsigned f_found(unsigned x)
{
	uint64_t tsc = __rdtsc(), word;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(word));
	struct found_entry *c = &found_cache[(uint32_t)word * 0x9E3779B1u >> 26];
	struct found_slot *s = c->state->slot;
	record_in(s->ring, &s->head, x, tsc);
	return x * 0x9E3779B1u ^ (x >> 7);
}

/* f_now's way to its ring: the cache entry holds the ring slot. */
struct now_slot {
	uint64_t head, limit;
	struct event *ring;
};
struct now_entry {
	uint64_t check;
	struct now_slot *slot;
};
static struct now_slot now_slot = {0, ~0ull, ring};
static struct now_entry now_cache[64];

TP_PROBED unsigned f_now(unsigned x)
{
	uint64_t tsc = __rdtsc(), word;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(word));
	struct now_entry *c = &now_cache[(uint32_t)word * 0x9E3779B1u >> 26];
	if (c->check != ~word)
		return 0;
	struct now_slot *s = c->slot;
	if (s->head >= s->limit)
		return 0;
	record_in(s->ring, &s->head, x, tsc);
	return x * 0x9E3779B1u ^ (x >> 7);
}

/* f_owned's block, the thread's own, at a fixed offset from fs. */
static __thread struct now_slot owned __attribute__((tls_model("initial-exec")));

TP_PROBED unsigned f_owned(unsigned x)
{
	uint64_t tsc = __rdtsc();
	if (owned.head >= owned.limit)
		return 0;
	record_in(owned.ring, &owned.head, x, tsc);
	return x * 0x9E3779B1u ^ (x >> 7);
}

/* f_hijack and f_timed: f_plain whose return goes through back_stub, which
 * jumps to the caller through `back` (one caller at a time: 1 thread).
 * f_timed takes a timestamp at entry and records an event with a second
 * one at the return. */
uint64_t back, entry_tsc;
unsigned f_hijack(unsigned x);
unsigned f_timed(unsigned x);
void timed_exit(void);
__asm__(".text\n"
	"f_hijack:\n"
	"	mov (%rsp), %rax\n"
	"	mov %rax, back(%rip)\n"
	"	lea back_stub(%rip), %rax\n"
	"	mov %rax, (%rsp)\n"
	"	jmp f_plain\n"
	"back_stub:\n"
	"	jmp *back(%rip)\n"
	"f_timed:\n"
	"	mov (%rsp), %rax\n"
	"	mov %rax, back(%rip)\n"
	"	lea timed_stub(%rip), %rax\n"
	"	mov %rax, (%rsp)\n"
	"	rdtsc\n"
	"	shl $32, %rdx\n"
	"	or %rdx, %rax\n"
	"	mov %rax, entry_tsc(%rip)\n"
	"	jmp f_plain\n"
	"timed_stub:\n"
	"	push %rax\n"
	"	push %rax\n"
	"	call timed_exit\n"
	"	pop %rax\n"
	"	pop %rax\n"
	"	jmp *back(%rip)\n");

void timed_exit(void)
{
	uint64_t now = __rdtsc();
	record((unsigned)(now - entry_tsc), now);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long calls;
static unsigned (*volatile fn)(unsigned);

static void *loop(void *arg)
{
	(void)arg;
	unsigned (*f)(unsigned) = fn;
	volatile unsigned sink = 0;
	for (long i = 0; i < calls; i++)
		sink += f((unsigned)i);
	return NULL;
}

/* ns per call per thread of `f` with `threads` threads. */
static double run(unsigned (*f)(unsigned), int threads)
{
	pthread_t t[2];
	fn = f;
	double t0 = now();
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, loop, NULL);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	return (now() - t0) * 1e9 / (double)calls;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median5(unsigned (*f)(unsigned), int threads)
{
	double v[5];
	for (int i = 0; i < 5; i++)
		v[i] = run(f, threads);
	qsort(v, 5, sizeof v[0], cmp);
	return v[2];
}

int main(int argc, char **argv)
{
	calls = argc >= 2 ? atol(argv[1]) : 20000000;
	if (calls < 1)
		calls = 1;
	for (int threads = 1; threads <= 2; threads++) {
		double plain = median5(f_plain, threads);
		double own = median5(f_own, threads);
		double slot = median5(f_slot, threads);
		double shared = median5(f_shared, threads);
		printf("floor threads=%d plain=%.3f own=%.3f slot=%.3f shared=%.3f\n", threads, plain, own, slot, shared);
	}
	uint64_t s = 0;
	double t0 = now();
	for (long i = 0; i < calls; i++)
		s += __rdtsc();
	printf("floor rdtsc=%.3f sink=%llu\n", (now() - t0) * 1e9 / (double)calls, (unsigned long long)(s & 1));
	double plain = median5(f_plain, 1);
	for (int i = 0; i < 64; i++)
		found_cache[i].state = &found_state;
	uint64_t word;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(word));
	now_cache[(uint32_t)word * 0x9E3779B1u >> 26] = (struct now_entry){~word, &now_slot};
	owned = now_slot;
	double event = median5(f_event, 1) - plain, found = median5(f_found, 1) - plain;
	double in_now = median5(f_now, 1) - plain, in_owned = median5(f_owned, 1) - plain;
	double hijack = median5(f_hijack, 1) - plain, timed = median5(f_timed, 1) - plain;
	printf("floor event=%.3f found=%.3f now=%.3f owned=%.3f hijack=%.3f timed=%.3f ring=%llu\n", event, found,
	       in_now, in_owned, hijack, timed, (unsigned long long)(ring_sum() & 1));
	return 0;
}
