/* nested: a call tree whose shape and sleeps are known, for the self times
 * of `tp profile`: outer() only calls inner(), which only sleeps; walk()
 * sleeps, then calls itself one level less deep.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   outer K US   outer calls inner K times, each sleeping US µs
 *                -> "done outer calls=C" (C: inner's calls made)
 *   inner US     one call of inner alone -> "done inner"
 *   walk N US    walk(N): N + 1 nested calls of walk, each sleeping US µs
 *                before its callee -> "done walk calls=C" (C: walk's calls)
 *   quit         -> exit status 0, or 1 if a count came out wrong
 */
#include "common.h"

#include <time.h>

static unsigned long inner_calls, walk_calls;

static void sleep_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	while (nanosleep(&ts, &ts) != 0)
		;
}

/* inner: sleeps, nothing else. */
TP_PROBED long inner(long us)
{
	inner_calls++;
	sleep_us(us);
	return us;
}

/* outer: its time is its calls of inner's, and a loop. */
TP_PROBED long outer(long k, long us)
{
	long sum = 0;
	for (long i = 0; i < k; i++)
		sum += inner(us);
	return sum;
}

TP_PROBED long walk(long n, long us);

/* How walk calls itself: through a pointer the compiler cannot see
 * through, so that it does not turn the recursion into a loop. */
static long (*volatile walk_again)(long, long) = walk;

/* walk: each level sleeps, then calls the next (not a tail call: it adds
 * one to what the callee returns). */
TP_PROBED long walk(long n, long us)
{
	walk_calls++;
	sleep_us(us);
	if (n <= 0)
		return 1;
	return walk_again(n - 1, us) + 1;
}

int main(void)
{
	tp_ready();
	char line[256];
	int bad = 0;
	long k, us;
	while (tp_read_command(line, sizeof line)) {
		if (sscanf(line, "outer %ld %ld", &k, &us) == 2) {
			unsigned long before = inner_calls;
			long sum = outer(k, us);
			bad |= sum != k * us;
			printf("done outer calls=%lu\n", inner_calls - before);
		} else if (sscanf(line, "inner %ld", &us) == 1) {
			bad |= inner(us) != us;
			printf("done inner\n");
		} else if (sscanf(line, "walk %ld %ld", &k, &us) == 2) {
			unsigned long before = walk_calls;
			bad |= walk(k, us) != k + 1;
			printf("done walk calls=%lu\n", walk_calls - before);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return bad;
}
