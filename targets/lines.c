/* lines: probes inside functions, by source line and by offset. Built at
 * -O0 -g, so every line is a statement of its own and a leaf function keeps
 * its locals below the stack pointer (the red zone), where a detour that
 * pushed without stepping over it would overwrite them. The test finds the
 * lines by the LINE_* markers in this file.
 *
 * On x86-64 it also has the sites where the patch replaces only nops: a
 * function with a patchable entry (five 1-byte nops), one that starts with
 * a 5-byte nop (as -mnop-mcount leaves), and the 5-byte nop of a
 * tracepoint macro in the middle of a function (seed 000's TRACE).
 *
 * Commands (answers end with a "done" line):
 *   run N T    T threads each call work(i) for i in 0..N-1
 *              -> "done run N T sum=S bad=B"
 *   nops N     N calls of each of pfe_entry, nop5_entry and traced
 *              -> "done nops N sum=S bad=B" (x86-64; elsewhere "done nops N sum=0 bad=0")
 *   quit
 */
#include "common.h"

#include <pthread.h>

/* A leaf: no frame below its locals. */
static int work(int i)
{
	int r = i * 3; /* LINE_A: every call */
	if (i % 3 == 0)
		r += 700; /* LINE_C: i % 3 == 0 (one 7-byte add: a window of its own) */
	return r;
}

static int work_ref(int i)
{
	return i * 3 + (i % 3 == 0 ? 700 : 0);
}

struct job {
	long n, sum, bad;
	pthread_t tid;
};

static void *run_job(void *arg)
{
	struct job *j = arg;
	for (long i = 0; i < j->n; i++) {
		int r = work((int)i);
		j->sum += r;
		j->bad += r != work_ref((int)i);
	}
	return NULL;
}

#if defined(__x86_64__)
/* These three are optimized, as such code is: the nops are where the patch goes. */
#define TP_NOPS __attribute__((noinline, noclone, noipa, used, optimize("O2")))

/* -fpatchable-function-entry=5: five 1-byte nops first. */
TP_NOPS __attribute__((patchable_function_entry(5, 0))) int pfe_entry(int x)
{
	return x * 5 + 1;
}

/* A 5-byte nop first, as -pg -mfentry -mnop-mcount leaves it. */
TP_NOPS int nop5_entry(int x)
{
	__asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory");
	return x * 7 + 2;
}

/* Seed 000's tracepoint: a 5-byte nop, and a record of it and of the code
 * that would run if it were a jump. */
typedef int tracepoint;
tracepoint traced_point;
#define NOP5 ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00;"
#define TRACE(_point, ...) \
	do { \
		__asm__ goto("0: " NOP5 ".pushsection trace_table, \"aw\";" \
			     ".quad " #_point ", 0b, %l0;" \
			     ".popsection" \
			     :::: __lbl_##_point); \
		if (0) { \
		__lbl_##_point: \
			printf(__VA_ARGS__); \
		} \
	} while (0)

TP_NOPS int traced(int x)
{
	int y = x * 11;
	TRACE(traced_point, "traced(%d)\n", x); /* LINE_TRACE */
	return y + 3;
}

static long nops(long n, long *bad)
{
	long sum = 0;
	for (long i = 0; i < n; i++) {
		int a = pfe_entry((int)i), b = nop5_entry((int)i), c = traced((int)i);
		sum += a + b + c;
		*bad += a != (int)i * 5 + 1 || b != (int)i * 7 + 2 || c != (int)i * 11 + 3;
	}
	return sum;
}
#else
static long nops(long n, long *bad)
{
	(void)n;
	(void)bad;
	return 0;
}
#endif

int main(void)
{
	tp_ready();
	char cmd[256];
	while (tp_read_command(cmd, sizeof cmd)) {
		long n, t;
		if (sscanf(cmd, "run %ld %ld", &n, &t) == 2 && t >= 1 && t <= 16) {
			struct job jobs[16] = {0};
			for (long k = 0; k < t; k++) {
				jobs[k].n = n;
				pthread_create(&jobs[k].tid, NULL, run_job, &jobs[k]);
			}
			long sum = 0, bad = 0;
			for (long k = 0; k < t; k++) {
				pthread_join(jobs[k].tid, NULL);
				sum += jobs[k].sum;
				bad += jobs[k].bad;
			}
			printf("done run %ld %ld sum=%ld bad=%ld\n", n, t, sum, bad);
		} else if (sscanf(cmd, "nops %ld", &n) == 1) {
			long bad = 0, sum = nops(n, &bad);
			printf("done nops %ld sum=%ld bad=%ld\n", n, sum, bad);
		} else if (!strcmp(cmd, "quit")) {
			return 0;
		}
	}
	return 0;
}
