/* agg: threads that pass lengths to two functions, an argument and a struct
 * field, and keep their own books of them, for the aggregates tp keeps in
 * the target (`--agg 'hist(len), sum(len)'`, `--by tid`).
 *
 * Commands (one per line on stdin; each answer ends with a "done" line):
 *   run T N   T threads, each calling consume(fd, buf, len) and
 *             submit(&msg) N times: len (a signed long) and msg.size (an
 *             unsigned int field) vary with the thread and the call, len
 *             now and then negative. Each thread prints
 *             "thread tid=X calls=N sum=S min=m max=M fsum=S fmin=m fmax=M";
 *             then, over every call of the run, "hist len B N" and
 *             "hist size B N" per bucket with calls, B as tp numbers them
 *             (0 negative, 1 zero, 2+k for [2^k, 2^(k+1))) -> "done run"
 *   spin T N NS
 *             T threads, each calling spin(fd, ns) N times, fd 3 + its
 *             number: spin keeps running until CLOCK_MONOTONIC has moved
 *             NS ns since it read it first, and returns how long that was
 *             (its inner time); the caller reads the clock around the call
 *             too (its outer time). A call's latency as a probe measures it
 *             lies between the two. Each thread prints "spin t=T tid=X
 *             calls=N inner=SUM outer=SUM imin=MIN omax=MAX" -> "done spin"
 *   quit      -> exit status 0
 */
#include "common.h"

#include <limits.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>

struct msg {
	int kind;
	unsigned size;
	const char *data;
};

static volatile long sink;

TP_PROBED long consume(int fd, const char *buf, long len)
{
	sink += fd + (buf ? buf[0] : 0);
	return len;
}

TP_PROBED int submit(struct msg *m)
{
	sink += m->kind;
	return m->size > 0;
}

static long monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

TP_PROBED long spin(int fd, long ns)
{
	long start = monotonic_ns(), now;
	do
		now = monotonic_ns();
	while (now - start < ns);
	sink += fd;
	return now - start;
}

struct spins {
	int t;
	long n, ns;
};

static void *spinner(void *arg)
{
	struct spins *s = arg;
	long tid = syscall(SYS_gettid);
	long inner = 0, outer = 0, imin = LONG_MAX, omax = 0;
	for (long i = 0; i < s->n; i++) {
		long before = monotonic_ns();
		long in = spin(3 + s->t, s->ns);
		long out = monotonic_ns() - before;
		inner += in;
		outer += out;
		imin = in < imin ? in : imin;
		omax = out > omax ? out : omax;
	}
	printf("spin t=%d tid=%ld calls=%ld inner=%ld outer=%ld imin=%ld omax=%ld\n", s->t, tid, s->n, inner, outer, imin,
	       omax);
	return NULL;
}

#define BUCKETS 66

static int bucket(long v, int sign)
{
	unsigned long u = (unsigned long)v;
	if (sign && v < 0)
		return 0;
	if (u == 0)
		return 1;
	return 2 + (63 - __builtin_clzl(u));
}

struct books {
	int t;
	long n;
	long sum, min, max;
	unsigned long fsum;
	unsigned fmin, fmax;
	long hist_len[BUCKETS];
	long hist_size[BUCKETS];
};

static void *worker(void *arg)
{
	struct books *b = arg;
	char buf[16] = "payload";
	long tid = syscall(SYS_gettid);
	b->min = LONG_MAX;
	b->max = LONG_MIN;
	b->fmin = UINT_MAX;
	b->fmax = 0;
	for (long i = 0; i < b->n; i++) {
		long len = (i * 7919 + b->t * 104729) % 5000;
		if (i % 97 == 5)
			len = -1 - b->t;
		unsigned size = (unsigned)((i * 13 + b->t * 1000) % 3000);
		struct msg m = {.kind = (int)(i % 3), .size = size, .data = buf};
		if (consume(3 + b->t, buf, len) != len || submit(&m) != (size > 0))
			abort();
		b->sum += len;
		b->min = len < b->min ? len : b->min;
		b->max = len > b->max ? len : b->max;
		b->fsum += size;
		b->fmin = size < b->fmin ? size : b->fmin;
		b->fmax = size > b->fmax ? size : b->fmax;
		b->hist_len[bucket(len, 1)]++;
		b->hist_size[bucket((long)size, 0)]++;
	}
	printf("thread t=%d tid=%ld calls=%ld sum=%ld min=%ld max=%ld fsum=%lu fmin=%u fmax=%u\n", b->t, tid, b->n, b->sum,
	       b->min, b->max, b->fsum, b->fmin, b->fmax);
	return NULL;
}

int main(void)
{
	tp_ready();
	char line[256];
	int threads;
	long n, ns;
	while (tp_read_command(line, sizeof line)) {
		if (sscanf(line, "run %d %ld", &threads, &n) == 2 && threads > 0 && threads <= 64) {
			struct books books[64];
			pthread_t ids[64];
			memset(books, 0, sizeof books);
			for (int t = 0; t < threads; t++) {
				books[t].t = t;
				books[t].n = n;
				if (pthread_create(&ids[t], NULL, worker, &books[t]) != 0)
					abort();
			}
			for (int t = 0; t < threads; t++)
				pthread_join(ids[t], NULL);
			for (int k = 0; k < BUCKETS; k++) {
				long a = 0, s = 0;
				for (int t = 0; t < threads; t++) {
					a += books[t].hist_len[k];
					s += books[t].hist_size[k];
				}
				if (a)
					printf("hist len %d %ld\n", k, a);
				if (s)
					printf("hist size %d %ld\n", k, s);
			}
			printf("done run\n");
		} else if (sscanf(line, "spin %d %ld %ld", &threads, &n, &ns) == 3 && threads > 0 && threads <= 64) {
			struct spins spins[64];
			pthread_t ids[64];
			for (int t = 0; t < threads; t++) {
				spins[t] = (struct spins){.t = t, .n = n, .ns = ns};
				if (pthread_create(&ids[t], NULL, spinner, &spins[t]) != 0)
					abort();
			}
			for (int t = 0; t < threads; t++)
				pthread_join(ids[t], NULL);
			printf("done spin\n");
		} else if (strcmp(line, "quit") == 0) {
			return 0;
		} else {
			printf("unknown command\n");
		}
	}
	return 0;
}
