/* hot: the benchmark target for the cost of one probe hit (benches/tp).
 *
 * work() is a tiny noinline integer hash (a few ns); the target times its own
 * calls of it with CLOCK_MONOTONIC, unprobed, probed and unprobed again, in
 * one process, so any tracer is measured the same way: the target notices a
 * tracer by watching its own entry bytes (int3, jmp or call), which also
 * timestamps "probe live". Built as `hot` (PIE; entry `imul`) and, on
 * x86-64, `hot-nop5` (-DNOP5: entry is a 5-byte nop, which Linux >= 6.18
 * uprobes turn into a call to a trampoline instead of an int3).
 *
 * Other shapes of a function's first instruction, for the benchmark's
 * rows of issue 17 (each noinline, each called the same way as work()):
 *   work_mov  `mov eax, imm32` first: a window of one 5-byte instruction
 *             that leaves rax dead but not the flags (the issue's own
 *             `x * 2654435761; r ^= r >> 13; return r + 7`);
 *   work_rip  `mov rax, [rip + scale]` first: a RIP-relative load, which
 *             the detour relocates and which may fault, so nothing is dead.
 *   work_blocks a loop of `trips` (4) iterations, read from a volatile
 *             global so that the compiler keeps the loop: every call runs
 *             the same basic blocks, for the cost per block of --blocks;
 *   work_deep work() itself, called through two more functions that return
 *             after each call (deep2 -> deep1 -> work), as calls are in
 *             real programs: a tracer that takes over work()'s return
 *             address pays here for every return its own return
 *             mispredicts (the return-stack buffer).
 *
 * Modes (every loop and wait is bounded):
 *   hot wait T BURSTS CALLS PAUSE_US [TIMEOUT_S [DEPTH [FUNC]]]
 *       T worker threads; each calls FUNC (work, work_mov, work_rip,
 *       work_blocks or work_deep; work
 *       by default) from DEPTH nested calls of nest() (default 0), so that
 *       a stack walk has that many frames. A phase is BURSTS bursts: all T
 *       threads start together, each times CALLS calls of FUNC, then the
 *       main thread
 *       sleeps PAUSE_US (time for a tracer to drain its buffers). Phases:
 *       warm-up and unprobed; "ready"; wait for the entry bytes to change
 *       ("patched") and 50 ms more; probed; bench_done() (where a debugger
 *       stops); wait for the bytes to be restored ("unpatched"); unprobed
 *       again. Each phase prints the median over bursts of ns per call, per
 *       thread, averaged over threads.
 *   hot step [MAXS [FUNC]]
 *       calls one_call() once a millisecond, which calls FUNC: the place
 *       where the benchmark counts the instructions of one call by
 *       single-stepping it.
 * Every output line is a tag followed by key=value tokens.
 */
#include "common.h"

#include <pthread.h>
#include <time.h>

#if defined(NOP5)
#define ENTRY_PAD __asm__ volatile(".byte 0x0f,0x1f,0x44,0x00,0x00" ::: "memory")
#else
#define ENTRY_PAD \
	do { \
	} while (0)
#endif

/* The probed function. */
TP_PROBED int work(int x)
{
	ENTRY_PAD;
	unsigned u = (unsigned)x * 0x9E3779B1u;
	u ^= u >> 15;
	u *= 0x85EBCA77u;
	u ^= u >> 13;
	return (int)u;
}

/* The same function, for checksums; never probed. */
static inline unsigned work_ref(int x)
{
	unsigned u = (unsigned)x * 0x9E3779B1u;
	u ^= u >> 15;
	u *= 0x85EBCA77u;
	u ^= u >> 13;
	return u;
}

/* The function: starts with `mov eax, 0x9e3779b1`. */
TP_PROBED uint64_t work_mov(uint64_t x)
{
	uint64_t r = x * 2654435761u;
	r ^= r >> 13;
	return r + 7;
}

static inline uint64_t work_mov_ref(uint64_t x)
{
	uint64_t r = x * 2654435761u;
	r ^= r >> 13;
	return r + 7;
}

/* Read by work_rip with a RIP-relative load (a global the compiler cannot
 * fold: something could write it). */
uint64_t scale = 0x9E3779B97F4A7C15ull;

/* Starts with `mov rax, [rip + scale]`. */
TP_PROBED uint64_t work_rip(uint64_t x)
{
	return scale * x + (x >> 7);
}

static inline uint64_t work_rip_ref(uint64_t x)
{
	return 0x9E3779B97F4A7C15ull * x + (x >> 7);
}

/* The iterations of work_blocks's loop (never written). */
volatile int trips = 4;

/* A loop the compiler cannot unroll: its blocks run the same number of
 * times in every call. */
TP_PROBED uint64_t work_blocks(uint64_t x)
{
	uint64_t r = x;
	int n = trips;
	for (int i = 0; i < n; i++)
		r = r * 31 + (uint64_t)i;
	return r;
}

static inline uint64_t work_blocks_ref(uint64_t x)
{
	uint64_t r = x;
	for (int i = 0; i < 4; i++)
		r = r * 31 + (uint64_t)i;
	return r;
}

/* work_deep's callers: each returns after its call (no sibling calls). */
TP_PROBED __attribute__((optimize("no-optimize-sibling-calls"))) uint64_t deep1(int x)
{
	return (uint64_t)(unsigned)work(x) + 1;
}

TP_PROBED __attribute__((optimize("no-optimize-sibling-calls"))) uint64_t deep2(int x)
{
	return deep1(x) + 1;
}

static inline uint64_t deep2_ref(int x)
{
	return (uint64_t)work_ref(x) + 2;
}

/* Called once after the probed phase: a debugger stops here. */
TP_PROBED void bench_done(void)
{
	__asm__ volatile("" ::: "memory");
}

/* The function a run calls (hot wait/step FUNC). */
enum func { WORK, WORK_MOV, WORK_RIP, WORK_DEEP, WORK_BLOCKS };
static enum func func = WORK;
static const char *const func_names[] = {"work", "work_mov", "work_rip", "work_deep", "work_blocks"};

/* One call of the function, the unit the instruction counter steps
 * through (a direct call for each, as in the timed loops). */
TP_PROBED uint64_t one_call(int x)
{
	switch (func) {
	case WORK_MOV:
		return work_mov((uint64_t)x) + 1;
	case WORK_RIP:
		return work_rip((uint64_t)x) + 1;
	case WORK_DEEP:
		return deep2(x) + 1;
	case WORK_BLOCKS:
		return work_blocks((uint64_t)x) + 1;
	default:
		return (uint64_t)(unsigned)work(x) + 1;
	}
}

static uint64_t one_call_ref(int x)
{
	switch (func) {
	case WORK_MOV:
		return work_mov_ref((uint64_t)x) + 1;
	case WORK_RIP:
		return work_rip_ref((uint64_t)x) + 1;
	case WORK_DEEP:
		return deep2_ref(x) + 1;
	case WORK_BLOCKS:
		return work_blocks_ref((uint64_t)x) + 1;
	default:
		return (uint64_t)work_ref(x) + 1;
	}
}

/* FUNC by name; 0 if unknown. */
static int set_func(const char *name)
{
	for (int i = 0; i < 5; i++)
		if (!strcmp(name, func_names[i])) {
			func = (enum func)i;
			return 1;
		}
	fprintf(stderr, "hot: no function %s (work, work_mov, work_rip, work_deep, work_blocks)\n", name);
	return 0;
}

static double now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_real(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
}

static uint64_t entry_bytes(void)
{
	const void *f = func == WORK_MOV      ? (const void *)&work_mov
			: func == WORK_RIP    ? (const void *)&work_rip
			: func == WORK_BLOCKS ? (const void *)&work_blocks
					      : (const void *)&work;
	const volatile unsigned char *p = (const volatile unsigned char *)(uintptr_t)f;
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

#define MAX_THREADS 16
/* Pause between "patched" and the probed phase. */
#define SETTLE_US 50000

static int nthreads, nbursts, depth;
static long ncalls;
static pthread_barrier_t start_line, finish_line;
static volatile int quit;

struct worker {
	int id;
	uint64_t expect; /* checksum of one burst */
	int bad;         /* bursts whose checksum failed */
	double *ns;      /* ns per call, per burst of the current phase */
	char pad[64];
};

static struct worker workers[MAX_THREADS];

/* One burst: ncalls calls of the function from `base` on, each one direct
 * call. */
TP_PROBED uint64_t burst(int base)
{
	uint64_t acc = 0;
	switch (func) {
	case WORK_MOV:
		for (long i = 0; i < ncalls; i++)
			acc += work_mov((uint64_t)(base + (int)i));
		break;
	case WORK_RIP:
		for (long i = 0; i < ncalls; i++)
			acc += work_rip((uint64_t)(base + (int)i));
		break;
	case WORK_DEEP:
		for (long i = 0; i < ncalls; i++)
			acc += deep2(base + (int)i);
		break;
	case WORK_BLOCKS:
		for (long i = 0; i < ncalls; i++)
			acc += work_blocks((uint64_t)(base + (int)i));
		break;
	default:
		for (long i = 0; i < ncalls; i++)
			acc += (unsigned)work(base + (int)i);
	}
	return acc;
}

static uint64_t calls_ref(int base)
{
	uint64_t acc = 0;
	for (long i = 0; i < ncalls; i++)
		acc += func == WORK_MOV	   ? work_mov_ref((uint64_t)(base + (int)i))
		       : func == WORK_RIP  ? work_rip_ref((uint64_t)(base + (int)i))
		       : func == WORK_DEEP ? deep2_ref(base + (int)i)
		       : func == WORK_BLOCKS ? work_blocks_ref((uint64_t)(base + (int)i))
					   : work_ref(base + (int)i);
	return acc;
}

/* A burst under `d` more frames (without sibling-call optimization, each
 * stays a call). */
TP_PROBED __attribute__((optimize("no-optimize-sibling-calls"))) uint64_t nest(int d, int base)
{
	return d > 0 ? nest(d - 1, base) : burst(base);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	int base = w->id * 1000003;
	for (;;) {
		for (int b = 0; b < nbursts; b++) {
			pthread_barrier_wait(&start_line);
			if (quit)
				return NULL;
			double t0 = now_mono();
			uint64_t acc = nest(depth, base);
			double t1 = now_mono();
			w->ns[b] = (t1 - t0) * 1e9 / (double)ncalls;
			if (acc != w->expect)
				w->bad++;
			pthread_barrier_wait(&finish_line);
		}
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Runs one phase; returns ns per call per thread (the mean over threads of
 * each thread's median burst) and prints it with the spread. */
static double phase(const char *name, long pause_us)
{
	for (int b = 0; b < nbursts; b++) {
		pthread_barrier_wait(&start_line);
		pthread_barrier_wait(&finish_line);
		if (pause_us > 0)
			sleep_us(pause_us);
	}
	double mean = 0, lo = 1e300, hi = 0;
	for (int t = 0; t < nthreads; t++) {
		qsort(workers[t].ns, (size_t)nbursts, sizeof(double), cmp_double);
		double med = workers[t].ns[nbursts / 2];
		mean += med / nthreads;
		lo = med < lo ? med : lo;
		hi = med > hi ? med : hi;
	}
	say("phase name=%s ns=%.4f thread_min=%.4f thread_max=%.4f calls=%ld\n", name, mean, lo, hi,
	    (long)nthreads * nbursts * ncalls);
	return mean;
}

static int wait_entry(uint64_t orig, int want_changed, double timeout)
{
	double deadline = now_mono() + timeout;
	while ((entry_bytes() != orig) != want_changed) {
		if (now_mono() > deadline)
			return 0;
		sleep_us(1000);
	}
	return 1;
}

static int mode_wait(int t, int bursts, long calls, long pause_us, double timeout)
{
	if (t < 1 || t > MAX_THREADS || bursts < 1 || calls < 1 || pause_us < 0) {
		fprintf(stderr, "hot: bad wait arguments\n");
		return 1;
	}
	nthreads = t;
	nbursts = bursts;
	ncalls = calls;
	uint64_t orig = entry_bytes();
	pthread_barrier_init(&start_line, NULL, (unsigned)t + 1);
	pthread_barrier_init(&finish_line, NULL, (unsigned)t + 1);
	pthread_t tids[MAX_THREADS];
	for (int i = 0; i < t; i++) {
		workers[i].id = i;
		workers[i].ns = calloc((size_t)bursts, sizeof(double));
		workers[i].expect = calls_ref(i * 1000003);
		pthread_create(&tids[i], NULL, worker_main, &workers[i]);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	phase("warmup", pause_us);
	double pre = phase("base_pre", pause_us);
	say("ready pid=%d threads=%d entry=%016llx t=%.6f\n", (int)getpid(), t, (unsigned long long)orig, now_real());
	if (!wait_entry(orig, 1, timeout)) {
		say("error=patch_timeout\n");
		return 3;
	}
	say("patched t=%.6f entry=%016llx\n", now_real(), (unsigned long long)entry_bytes());
	/* Let the tracer finish attaching (its own work after the patch) first. */
	sleep_us(SETTLE_US);
	double probed = phase("probed", pause_us);
	bench_done();
	say("probed t=%.6f\n", now_real());
	if (!wait_entry(orig, 0, timeout)) {
		say("error=unpatch_timeout entry=%016llx\n", (unsigned long long)entry_bytes());
		return 4;
	}
	say("unpatched t=%.6f\n", now_real());
	double post = phase("base_post", pause_us);
	int bad = 0;
	for (int i = 0; i < t; i++)
		bad += workers[i].bad;
	quit = 1;
	pthread_barrier_wait(&start_line);
	for (int i = 0; i < t; i++)
		pthread_join(tids[i], NULL);
	say("result base_pre=%.4f probed=%.4f base_post=%.4f probed_calls=%ld checksum=%s\n", pre, probed, post,
	    (long)t * bursts * calls, bad ? "BAD" : "ok");
	return bad ? 2 : 0;
}

static int mode_step(double max_s)
{
	tp_ready();
	double end = now_mono() + max_s;
	int bad = 0;
	for (int i = 0; now_mono() < end; i++) {
		if (one_call(i) != one_call_ref(i))
			bad++;
		sleep_us(1000);
	}
	say("exit checksum=%s\n", bad ? "BAD" : "ok");
	return bad ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 6 && !strcmp(argv[1], "wait")) {
		depth = argc >= 8 ? atoi(argv[7]) : 0;
		if (argc >= 9 && !set_func(argv[8]))
			return 1;
		return mode_wait(atoi(argv[2]), atoi(argv[3]), atol(argv[4]), atol(argv[5]),
				 argc >= 7 ? atof(argv[6]) : 60.0);
	}
	if (argc >= 2 && !strcmp(argv[1], "step")) {
		if (argc >= 4 && !set_func(argv[3]))
			return 1;
		return mode_step(argc >= 3 ? atof(argv[2]) : 60.0);
	}
	fprintf(stderr, "usage: %s wait THREADS BURSTS CALLS PAUSE_US [TIMEOUT_S [DEPTH [FUNC]]] | step [MAXS [FUNC]]\n",
		argv[0]);
	return 1;
}
