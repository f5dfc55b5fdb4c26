/* counter: probe-able functions with different prologue shapes, called from
 * one or more threads on command, with the target's own call counts and a
 * checksum of every result against an unprobed reference copy.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call FUNC N [T]  T threads (default 1) each call FUNC N times
 *                    -> "done FUNC calls=C checksum=ok|BAD"
 *   spin T [hot]     T threads call foo and bar until "stop"; without "hot"
 *                    each thread pauses 1 ms after every 1000 calls
 *                    -> "spinning T"
 *   stop             -> "stopped foo=C bar=C checksum=ok|BAD"
 *   counts           -> "counts foo=C bar=C baz=C" (all calls since start)
 *   fork             a child process calls foo 10 times a millisecond,
 *                    checking every result, until SIGTERM -> "forked pid=P"
 *   reap             waits for that child -> "reaped status=S" (its exit
 *                    code: 0 if every result was right; 128+N for signal N)
 *   quit             -> exit status 0, or 1 if any checksum failed
 * FUNC is foo, bar or baz.
 */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

static const uint64_t table[8] = {3, 1, 4, 1, 5, 9, 2, 6};

/* foo: a leaf hash; its entry is a single long instruction at -O2. */
TP_PROBED uint64_t foo(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 29);
}

static inline uint64_t foo_ref(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 29);
}

TP_PROBED uint64_t leaf(uint64_t x)
{
	return x + table[x & 7];
}

static inline uint64_t leaf_ref(uint64_t x)
{
	return x + table[x & 7];
}

/* bar: keeps a frame pointer and calls out, so its entry is the classic
 * push rbp; mov rbp, rsp pair: a window of several instructions. */
__attribute__((noinline, noclone, noipa, used, optimize("no-omit-frame-pointer")))
uint64_t bar(uint64_t x, uint64_t y)
{
	return leaf(x) + y * 3;
}

static inline uint64_t bar_ref(uint64_t x, uint64_t y)
{
	return leaf_ref(x) + y * 3;
}

/* baz: reads a global table first (a RIP-relative operand near the entry). */
TP_PROBED uint64_t baz(uint64_t x)
{
	return table[x & 7] * x + 1;
}

static inline uint64_t baz_ref(uint64_t x)
{
	return table[x & 7] * x + 1;
}

static atomic_uint_fast64_t calls_foo, calls_bar, calls_baz;
static atomic_int checksum_failed;

/* Calls one function n times; returns 1 if every result matched. */
static int run_calls(char which, uint64_t n, uint64_t seed)
{
	uint64_t got = 0, want = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t x = seed + i;
		switch (which) {
		case 'f': got += foo(x); want += foo_ref(x); break;
		case 'b': got += bar(x, i); want += bar_ref(x, i); break;
		default: got += baz(x); want += baz_ref(x); break;
		}
	}
	atomic_uint_fast64_t *c = which == 'f' ? &calls_foo : which == 'b' ? &calls_bar : &calls_baz;
	atomic_fetch_add(c, n);
	if (got != want) {
		atomic_store(&checksum_failed, 1);
		return 0;
	}
	return 1;
}

struct job {
	pthread_t thread;
	char which;
	uint64_t n;
	uint64_t seed;
	int ok;
};

static void *job_main(void *arg)
{
	struct job *j = arg;
	j->ok = run_calls(j->which, j->n, j->seed);
	return NULL;
}

/* Spinning threads: call foo and bar until told to stop. */
static atomic_int spin_stop;
static int spin_hot;
static atomic_uint_fast64_t spin_foo, spin_bar;

static void *spin_main(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg * 1000003u;
	uint64_t nfoo = 0, nbar = 0;
	struct timespec pause = {0, 1000000};
	while (!atomic_load_explicit(&spin_stop, memory_order_relaxed)) {
		if (!run_calls('f', 1000, seed)) break;
		if (!run_calls('b', 100, seed)) break;
		nfoo += 1000;
		nbar += 100;
		seed += 1000;
		if (!spin_hot)
			nanosleep(&pause, NULL);
	}
	atomic_fetch_add(&spin_foo, nfoo);
	atomic_fetch_add(&spin_bar, nbar);
	return NULL;
}

static volatile sig_atomic_t child_stop;

static void on_term(int sig)
{
	(void)sig;
	child_stop = 1;
}

/* The forked child of "fork": foo 10 times a millisecond until SIGTERM. */
static void child_main(void)
{
	/* SIGTERM was blocked across the fork: one sent at once waits for the handler. */
	signal(SIGTERM, on_term);
	sigset_t term;
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigprocmask(SIG_UNBLOCK, &term, NULL);
	struct timespec ms = {0, 1000000};
	uint64_t seed = 1ull << 40;
	int ok = 1;
	while (!child_stop) {
		ok &= run_calls('f', 10, seed);
		seed += 10;
		nanosleep(&ms, NULL);
	}
	_exit(ok ? 0 : 1);
}

int main(void)
{
	pid_t child = 0;
	char line[256];
	pthread_t spinners[64];
	int nspin = 0;

	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		char func[32] = "", mode[16] = "";
		unsigned long long n = 0;
		int t = 1;
		if (sscanf(line, "call %31s %llu %d", func, &n, &t) >= 2) {
			char which = func[0] == 'f' ? 'f' : strcmp(func, "bar") == 0 ? 'b' : 'z';
			if (t < 1 || t > 64) t = 1;
			struct job jobs[64];
			for (int i = 0; i < t; i++) {
				jobs[i] = (struct job){.which = which, .n = n, .seed = (uint64_t)i << 32};
				pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]);
			}
			int ok = 1;
			for (int i = 0; i < t; i++) {
				pthread_join(jobs[i].thread, NULL);
				ok &= jobs[i].ok;
			}
			printf("done %s calls=%llu checksum=%s\n", func, n * (unsigned long long)t, ok ? "ok" : "BAD");
		} else if (sscanf(line, "spin %d %15s", &t, mode) >= 1) {
			if (nspin == 0) {
				if (t < 1 || t > 64) t = 1;
				spin_hot = strcmp(mode, "hot") == 0;
				atomic_store(&spin_stop, 0);
				atomic_store(&spin_foo, 0);
				atomic_store(&spin_bar, 0);
				for (int i = 0; i < t; i++)
					pthread_create(&spinners[i], NULL, spin_main, (void *)(uintptr_t)(i + 1));
				nspin = t;
			}
			printf("spinning %d\n", nspin);
		} else if (strcmp(line, "stop") == 0) {
			atomic_store(&spin_stop, 1);
			for (int i = 0; i < nspin; i++)
				pthread_join(spinners[i], NULL);
			nspin = 0;
			printf("stopped foo=%llu bar=%llu checksum=%s\n",
			       (unsigned long long)atomic_load(&spin_foo), (unsigned long long)atomic_load(&spin_bar),
			       atomic_load(&checksum_failed) ? "BAD" : "ok");
		} else if (strcmp(line, "counts") == 0) {
			printf("counts foo=%llu bar=%llu baz=%llu\n", (unsigned long long)atomic_load(&calls_foo),
			       (unsigned long long)atomic_load(&calls_bar), (unsigned long long)atomic_load(&calls_baz));
		} else if (strcmp(line, "fork") == 0) {
			fflush(stdout);
			sigset_t term, old;
			sigemptyset(&term);
			sigaddset(&term, SIGTERM);
			sigprocmask(SIG_BLOCK, &term, &old);
			child = fork();
			if (child == 0)
				child_main();
			sigprocmask(SIG_SETMASK, &old, NULL);
			printf("forked pid=%d\n", (int)child);
		} else if (strcmp(line, "reap") == 0) {
			int st = 0;
			waitpid(child, &st, 0);
			printf("reaped status=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	if (nspin) {
		atomic_store(&spin_stop, 1);
		for (int i = 0; i < nspin; i++)
			pthread_join(spinners[i], NULL);
	}
	return atomic_load(&checksum_failed) ? 1 : 0;
}
