/* many: 10,000 probe-able functions, for the attach and detach benchmarks
 * (benches/tp). The preprocessor writes them at build time: fn0000 ..
 * fn9999, each a distinct one-line hash (distinct constants, so identical
 * code folding cannot merge them), so globs select 1, 100, 1,000 or 10,000
 * of them: `fn0000`, `fn00*`, `fn0*`, `fn*`.
 *
 *   many [MAXS]   prints "ready pid=N", then calls every function once a
 *                 millisecond (about 2 % of a core), checking the results,
 *                 until SIGUSR1 or for at most MAXS seconds (default 600);
 *                 then prints "exit rounds=N checksum=ok|BAD".
 *   many spread N  calls fn0000 .. fn(N-1) in a random order as fast as it
 *                 can (an indirect call each, as a program's calls of many
 *                 different functions), printing "ns/call T" every 5 million
 *                 calls, until SIGUSR1; then "exit calls=N checksum=ok|BAD"
 *                 (benches/profile/footprint.py).
 */
#include "common.h"

#include <signal.h>
#include <time.h>

#define F(n) \
	TP_PROBED unsigned fn##n(unsigned x) \
	{ \
		return x * 0x9E3779B1u + __COUNTER__; \
	}
#define D10(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9)
#define D100(M, p) \
	D10(M, p##0) D10(M, p##1) D10(M, p##2) D10(M, p##3) D10(M, p##4) D10(M, p##5) D10(M, p##6) D10(M, p##7) \
	D10(M, p##8) D10(M, p##9)
#define D1000(M, p) \
	D100(M, p##0) D100(M, p##1) D100(M, p##2) D100(M, p##3) D100(M, p##4) D100(M, p##5) D100(M, p##6) \
	D100(M, p##7) D100(M, p##8) D100(M, p##9)
#define D10000(M) \
	D1000(M, 0) D1000(M, 1) D1000(M, 2) D1000(M, 3) D1000(M, 4) D1000(M, 5) D1000(M, 6) D1000(M, 7) \
	D1000(M, 8) D1000(M, 9)

#define COUNT 10000

D10000(F)

#define ENTRY(n) fn##n,
static unsigned (*const table[COUNT])(unsigned) = {D10000(ENTRY)};

static volatile sig_atomic_t done;

static void on_usr1(int sig)
{
	(void)sig;
	done = 1;
}

static double seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int spread(unsigned n)
{
	uint64_t x = 88172645463325252ull, calls = 0;
	int bad = 0;
	tp_ready();
	while (!done) {
		double t = seconds();
		for (int k = 0; k < 5000000; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			unsigned i = (unsigned)(x % n);
			if (table[i]((unsigned)x) != (unsigned)x * 0x9E3779B1u + i)
				bad++;
		}
		calls += 5000000;
		printf("ns/call %.3f\n", (seconds() - t) / 5e6 * 1e9);
		fflush(stdout);
	}
	printf("exit calls=%llu checksum=%s\n", (unsigned long long)calls, bad ? "BAD" : "ok");
	return bad ? 2 : 0;
}

int main(int argc, char **argv)
{
	signal(SIGUSR1, on_usr1);
	if (argc >= 3 && strcmp(argv[1], "spread") == 0) {
		unsigned n = (unsigned)atoi(argv[2]);
		return spread(n >= 1 && n <= COUNT ? n : COUNT);
	}
	double max_s = argc >= 2 ? atof(argv[1]) : 600.0;
	/* fn_i(x) - x * K is the function's constant: i, as __COUNTER__ counted. */
	tp_ready();
	struct timespec start, now, nap = {0, 1000000};
	clock_gettime(CLOCK_MONOTONIC, &start);
	int bad = 0;
	unsigned round;
	for (round = 0; !done; round++) {
		for (unsigned i = 0; i < COUNT; i++)
			if (table[i](round) != round * 0x9E3779B1u + i)
				bad++;
		nanosleep(&nap, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9 > max_s)
			break;
	}
	printf("exit rounds=%u checksum=%s\n", round, bad ? "BAD" : "ok");
	return bad ? 2 : 0;
}
