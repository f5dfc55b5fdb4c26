/* stacks: known call paths, argument values and durations, for --stack,
 * --if, --by and the histograms kept in the target. Built with frame
 * pointers (`stacks`) and without (`stacks-nofp`). Every call it makes is
 * counted by the target itself, so a test compares tp's answer with the
 * target's own.
 *
 * Commands (each answer is one "done" line):
 *   paths N      N rounds of: path_a -> a_mid -> leaf(1), and twice
 *                path_b -> leaf(2) -> "done paths N a=N b=2N"
 *   deep D N     N calls of leaf(3) under D levels of descend()
 *                -> "done deep D N"
 *   values N     leaf(i % 10) for i < N -> "done values N"
 *   naps US N    N calls of nap(US), which sleeps US microseconds; the
 *                target times each call itself -> "done naps US N hist=K:C,K:C"
 *                (C calls took from 2^K ns to less than 2^(K+1))
 *   quit
 */
#include "common.h"

#include <time.h>

/* Without sibling-call optimization every call stays a call (a tail call
 * would leave its caller off the stack). */
#define TP_CALLS __attribute__((optimize("no-optimize-sibling-calls")))

TP_PROBED long leaf(int n)
{
	return 2L * n + 1;
}

TP_PROBED TP_CALLS long a_mid(int n)
{
	return leaf(n) + 1;
}

TP_PROBED TP_CALLS long path_a(int n)
{
	return a_mid(n) + 1;
}

TP_PROBED TP_CALLS long path_b(int n)
{
	return leaf(n) + 1;
}

TP_PROBED TP_CALLS long descend(int depth, int n)
{
	return depth == 0 ? leaf(n) + 1 : descend(depth - 1, n) + 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

TP_PROBED int nap(int us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
	while (nanosleep(&ts, &ts) != 0)
		;
	return us;
}

static volatile long sink;

TP_PROBED TP_CALLS void run_paths(long n)
{
	for (long i = 0; i < n; i++) {
		sink += path_a(1);
		sink += path_b(2);
		sink += path_b(2);
	}
}

TP_PROBED TP_CALLS void run_deep(int depth, long n)
{
	for (long i = 0; i < n; i++)
		sink += descend(depth, 3);
}

int main(void)
{
	char line[256];
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		long a = 0, b = 0;
		if (sscanf(line, "paths %ld", &a) == 1) {
			run_paths(a);
			printf("done paths %ld a=%ld b=%ld\n", a, a, 2 * a);
		} else if (sscanf(line, "deep %ld %ld", &a, &b) == 2) {
			run_deep((int)a, b);
			printf("done deep %ld %ld\n", a, b);
		} else if (sscanf(line, "values %ld", &a) == 1) {
			for (long i = 0; i < a; i++)
				sink += leaf((int)(i % 10));
			printf("done values %ld\n", a);
		} else if (sscanf(line, "naps %ld %ld", &a, &b) == 2) {
			long hist[64] = {0};
			for (long i = 0; i < b; i++) {
				uint64_t t0 = now_ns();
				nap((int)a);
				uint64_t d = now_ns() - t0;
				hist[63 - __builtin_clzll(d | 1)]++;
			}
			printf("done naps %ld %ld hist=", a, b);
			const char *sep = "";
			for (int k = 0; k < 64; k++)
				if (hist[k]) {
					printf("%s%d:%ld", sep, k, hist[k]);
					sep = ",";
				}
			printf("\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("unknown command\n");
		}
	}
	return 0;
}
