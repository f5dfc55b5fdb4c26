/* blocks: a function of loops and branches whose basic blocks and lines tp
 * counts with --blocks, and gcov counts in a --coverage build of this same
 * file (tests/e2e/blocks.rs compares the two). Built at -O0 -g: every line
 * a statement of its own. Each result is checked against a reference copy.
 * A ticker thread runs all along (the program keeps running while probed).
 *
 * Commands (answers end with a "done" line):
 *   run N T    T threads each call shape(i % 23) for i in 0..N-1
 *              -> "done run N T sum=S bad=B"
 *   mix N T    T threads each call dispatch(i % 13) for i in 0..N-1
 *              -> "done mix N T sum=S bad=B"
 *   ticks      -> "done ticks ticks=N" (the ticker's count so far)
 *   quit
 */
#include "common.h"

#include <pthread.h>

/* The brace on the signature's line: gcov puts a function's entry on the
 * line of its name, DWARF on the line of its brace. */
TP_PROBED int shape(int n) {
	int acc = 0;
	for (int i = 0; i < n; i++) {
		if (i % 3 == 0)
			acc += i;
		else if (i % 5 == 0)
			acc -= 2;
		else
			acc ^= i; /* LINE_XOR */
	}
	while (acc > 40)
		acc = acc / 3 + 1;
	if (n > 20)
		return -acc; /* LINE_NEG */
	return acc;
}

static int shape_ref(int n)
{
	int acc = 0;
	for (int i = 0; i < n; i++)
		acc = i % 3 == 0 ? acc + i : i % 5 == 0 ? acc - 2 : acc ^ i;
	while (acc > 40)
		acc = acc / 3 + 1;
	return n > 20 ? -acc : acc;
}

/* Optimized, with a switch the compiler makes a jump table of: its cases
 * are reached only through the table, and no probe's window may take one in. */
__attribute__((noinline, noclone, noipa, used, optimize("O2"))) int dispatch(int n)
{
	int acc = 0;
	for (int i = 0; i < n; i++) {
		switch ((i * 7 + n) % 9) {
		case 0: acc += 3; break;
		case 1: acc ^= i; break;
		case 2: acc -= n; break;
		case 3: acc *= 3; break;
		case 4: acc += i * i; break;
		case 5: acc |= 1; break;
		case 6: acc >>= 1; break;
		case 7: acc += 11; break;
		default: acc -= 1;
		}
	}
	return acc;
}

static int dispatch_ref(int n)
{
	int acc = 0;
	for (int i = 0; i < n; i++) {
		int k = (i * 7 + n) % 9;
		acc = k == 0 ? acc + 3 : k == 1 ? acc ^ i : k == 2 ? acc - n : k == 3 ? acc * 3 : k == 4 ? acc + i * i
		    : k == 5 ? acc | 1 : k == 6 ? acc >> 1 : k == 7 ? acc + 11 : acc - 1;
	}
	return acc;
}

struct job {
	long n, sum, bad;
	int mix;
	pthread_t tid;
};

static void *run_job(void *arg)
{
	struct job *j = arg;
	for (long i = 0; i < j->n; i++) {
		int r = j->mix ? dispatch((int)(i % 13)) : shape((int)(i % 23));
		j->sum += r;
		j->bad += r != (j->mix ? dispatch_ref((int)(i % 13)) : shape_ref((int)(i % 23)));
	}
	return NULL;
}

static volatile long ticks;

static void *ticker(void *arg)
{
	(void)arg;
	for (;;) {
		ticks++;
		usleep(1000);
	}
	return NULL;
}

int main(void)
{
	pthread_t t;
	pthread_create(&t, NULL, ticker, NULL);
	tp_ready();
	char cmd[256];
	while (tp_read_command(cmd, sizeof cmd)) {
		long n, k, threads;
		char what[8];
		if (sscanf(cmd, "%7s %ld %ld", what, &n, &threads) == 3 && (!strcmp(what, "run") || !strcmp(what, "mix"))
		    && threads >= 1 && threads <= 16) {
			struct job jobs[16] = {0};
			for (k = 0; k < threads; k++) {
				jobs[k].n = n;
				jobs[k].mix = !strcmp(what, "mix");
				pthread_create(&jobs[k].tid, NULL, run_job, &jobs[k]);
			}
			long sum = 0, bad = 0;
			for (k = 0; k < threads; k++) {
				pthread_join(jobs[k].tid, NULL);
				sum += jobs[k].sum;
				bad += jobs[k].bad;
			}
			printf("done %s %ld %ld sum=%ld bad=%ld\n", what, n, threads, sum, bad);
		} else if (!strcmp(cmd, "ticks")) {
			printf("done ticks ticks=%ld\n", ticks);
		} else if (!strcmp(cmd, "quit")) {
			return 0;
		}
	}
	return 0;
}
