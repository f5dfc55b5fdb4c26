/* hammer: hot threads that call probe-able functions as fast as they can,
 * each checking every result against an unprobed reference copy, and a
 * measured function called an exact number of times on command, so a test
 * can toggle probes on and off under load and still demand exact counts.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   start T    T hot threads (1..16) call hot_a and hot_b in turn, forever,
 *              in batches of 1000 calls each -> "started T"
 *   counts     -> "counts a=A b=B" (exact calls so far, over all hot threads)
 *   burst N T  T threads (1..96) each call measured N times; then waits until every
 *              hot thread has finished two more batches (so each made at
 *              least one whole batch after the command began)
 *              -> "burst calls=C checksum=ok|BAD"
 *   forkburst N  the main thread calls measured once, forks, and the
 *              parent's main thread and the child's (which has the parent
 *              thread's TCB, at the same address) each call measured N
 *              times at once; the child exits 0 if every result held
 *              -> "forkburst calls=C child=ok|BAD checksum=ok|BAD"
 *   check      -> "check errors=E" (results that differed from the reference)
 *   quit       -> exit status 0, or 1 if any result differed
 * tiny() is too short to probe, for tests of refusals.
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#define BATCH 1000
#define MAX_HOT 16

/* hot_a: a leaf whose entry is a single long instruction. */
TP_PROBED uint64_t hot_a(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 31);
}

static inline uint64_t hot_a_ref(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 31);
}

TP_PROBED uint64_t mix(uint64_t x)
{
	return x ^ (x << 7) ^ (x >> 9);
}

static inline uint64_t mix_ref(uint64_t x)
{
	return x ^ (x << 7) ^ (x >> 9);
}

/* hot_b: keeps a frame pointer and calls out: a window of several
 * instructions, so threads are often caught inside it. */
__attribute__((noinline, noclone, noipa, used, optimize("no-omit-frame-pointer")))
uint64_t hot_b(uint64_t x, uint64_t y)
{
	return mix(x) + y * 5;
}

static inline uint64_t hot_b_ref(uint64_t x, uint64_t y)
{
	return mix_ref(x) + y * 5;
}

TP_PROBED uint64_t measured(uint64_t x)
{
	return x * 3 + 1;
}

static inline uint64_t measured_ref(uint64_t x)
{
	return x * 3 + 1;
}

/* tiny: a bare `ret`, too short for a jump: tp must refuse it. */
TP_PROBED void tiny(void)
{
}

/* Per hot thread, on its own cache line: exact call counts and batches. */
struct hot {
	pthread_t thread;
	_Alignas(64) atomic_uint_fast64_t calls_a, calls_b, batches;
};

static struct hot hot[MAX_HOT];
static int nhot;
static atomic_int stop_hot;
static atomic_uint_fast64_t errors;

static void *hot_main(void *arg)
{
	struct hot *h = arg;
	uint64_t seed = (uint64_t)(h - hot) << 40;
	while (!atomic_load_explicit(&stop_hot, memory_order_relaxed)) {
		uint64_t got = 0, want = 0;
		for (int i = 0; i < BATCH; i++) {
			uint64_t x = seed++;
			got += hot_a(x);
			want += hot_a_ref(x);
			atomic_store_explicit(&h->calls_a, atomic_load_explicit(&h->calls_a, memory_order_relaxed) + 1,
					      memory_order_relaxed);
			got += hot_b(x, i);
			want += hot_b_ref(x, i);
			atomic_store_explicit(&h->calls_b, atomic_load_explicit(&h->calls_b, memory_order_relaxed) + 1,
					      memory_order_relaxed);
		}
		if (got != want) {
			atomic_fetch_add(&errors, 1);
			printf("error thread %d: checksum\n", (int)(h - hot));
		}
		atomic_fetch_add(&h->batches, 1);
	}
	return NULL;
}

struct burst {
	pthread_t thread;
	uint64_t n, seed;
	int ok;
};

static void *burst_main(void *arg)
{
	struct burst *b = arg;
	uint64_t got = 0, want = 0;
	for (uint64_t i = 0; i < b->n; i++) {
		got += measured(b->seed + i);
		want += measured_ref(b->seed + i);
	}
	b->ok = got == want;
	return NULL;
}

/* `forkburst N`: see the header. Both processes start calling together
 * (a pipe), so they count in one probe at the same moments. */
static void forkburst(uint64_t n)
{
	int ok = measured(7) == measured_ref(7);
	int go[2];
	if (pipe(go) != 0) {
		printf("error pipe\n");
		return;
	}
	fflush(stdout);
	pid_t child = fork();
	if (child < 0) {
		printf("error fork\n");
		return;
	}
	struct burst b = {.n = n, .seed = child == 0 ? 1ull << 40 : 2ull << 40};
	if (child == 0) {
		char c;
		close(go[1]);
		if (read(go[0], &c, 1) != 1)
			_exit(2);
		burst_main(&b);
		_exit(b.ok ? 0 : 1);
	}
	close(go[0]);
	if (write(go[1], "g", 1) != 1)
		printf("error pipe write\n");
	close(go[1]);
	burst_main(&b);
	int status = 0;
	waitpid(child, &status, 0);
	int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	printf("forkburst calls=%llu child=%s checksum=%s\n", 2 * (unsigned long long)n + 1, child_ok ? "ok" : "BAD",
	       ok && b.ok ? "ok" : "BAD");
}

/* Waits (at most 60 s) until every hot thread finished two more batches. */
static int hot_progressed(const uint64_t *before)
{
	struct timespec ms = {0, 1000000};
	for (int tries = 0; tries < 60000; tries++) {
		int all = 1;
		for (int i = 0; i < nhot; i++)
			if (atomic_load(&hot[i].batches) < before[i] + 2)
				all = 0;
		if (all)
			return 1;
		nanosleep(&ms, NULL);
	}
	return 0;
}

int main(void)
{
	char line[256];
	tiny();
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		unsigned long long n = 0;
		int t = 0;
		if (sscanf(line, "start %d", &t) == 1) {
			if (nhot == 0) {
				nhot = t < 1 ? 1 : t > MAX_HOT ? MAX_HOT : t;
				for (int i = 0; i < nhot; i++)
					pthread_create(&hot[i].thread, NULL, hot_main, &hot[i]);
			}
			printf("started %d\n", nhot);
		} else if (strcmp(line, "counts") == 0) {
			uint64_t a = 0, b = 0;
			for (int i = 0; i < nhot; i++) {
				a += atomic_load(&hot[i].calls_a);
				b += atomic_load(&hot[i].calls_b);
			}
			printf("counts a=%llu b=%llu\n", (unsigned long long)a, (unsigned long long)b);
		} else if (sscanf(line, "burst %llu %d", &n, &t) == 2) {
			uint64_t before[MAX_HOT];
			for (int i = 0; i < nhot; i++)
				before[i] = atomic_load(&hot[i].batches);
			if (t < 1 || t > 96)
				t = 1;
			static struct burst bs[96];
			for (int i = 0; i < t; i++) {
				bs[i] = (struct burst){.n = n, .seed = (uint64_t)i << 32};
				pthread_create(&bs[i].thread, NULL, burst_main, &bs[i]);
			}
			int ok = 1;
			for (int i = 0; i < t; i++) {
				pthread_join(bs[i].thread, NULL);
				ok &= bs[i].ok;
			}
			if (!hot_progressed(before))
				printf("error hot threads made no progress\n");
			printf("burst calls=%llu checksum=%s\n", n * (unsigned long long)t, ok ? "ok" : "BAD");
		} else if (sscanf(line, "forkburst %llu", &n) == 1) {
			forkburst(n);
		} else if (strcmp(line, "check") == 0) {
			printf("check errors=%llu\n", (unsigned long long)atomic_load(&errors));
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	atomic_store(&stop_hot, 1);
	for (int i = 0; i < nhot; i++)
		pthread_join(hot[i].thread, NULL);
	return atomic_load(&errors) ? 1 : 0;
}
