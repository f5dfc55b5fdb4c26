/* callers: one function called from three call sites a known number of
 * times each, for --by caller. work() notes the return address of every
 * call (__builtin_return_address), so the target's own books say, per
 * call site, its return address and its calls.
 *
 * Commands (each answer ends with one "done" line):
 *   calls A B C   A calls of work from from_a, B from from_b, C from
 *                 from_c; then one line per call site
 *                 "site NAME ret=0xADDR calls=N" and "done calls A B C"
 *   chains N      N calls of hub() through chain_x -> hub and 2N through
 *                 chain_y -> hub: work has one caller (hub) reached by two
 *                 call chains -> "done chains N"
 *   quit
 */
#include "common.h"

/* Every call stays a call (a tail call would leave its caller out). */
#define TP_CALLS __attribute__((optimize("no-optimize-sibling-calls")))

static volatile long sink;

/* The return addresses work saw, and the calls per address. */
static uint64_t seen_ret[8];
static long seen_calls[8];

TP_PROBED long work(long n)
{
	uint64_t ret = (uint64_t)__builtin_extract_return_addr(__builtin_return_address(0));
	for (unsigned i = 0; i < 8; i++) {
		if (seen_ret[i] == ret || seen_ret[i] == 0) {
			seen_ret[i] = ret;
			seen_calls[i]++;
			break;
		}
	}
	return n * 3 + 1;
}

TP_PROBED TP_CALLS void from_a(long n)
{
	for (long i = 0; i < n; i++)
		sink += work(i);
}

TP_PROBED TP_CALLS void from_b(long n)
{
	for (long i = 0; i < n; i++)
		sink += work(i);
}

TP_PROBED TP_CALLS void from_c(long n)
{
	for (long i = 0; i < n; i++)
		sink += work(i);
}

TP_PROBED TP_CALLS long hub(long n)
{
	return work(n) + 1;
}

TP_PROBED TP_CALLS long chain_x(long n)
{
	return hub(n) + 1;
}

TP_PROBED TP_CALLS long chain_y(long n)
{
	return hub(n) + 2;
}

int main(void)
{
	char line[256];
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		long a = 0, b = 0, c = 0;
		if (sscanf(line, "calls %ld %ld %ld", &a, &b, &c) == 3) {
			memset(seen_ret, 0, sizeof seen_ret);
			memset(seen_calls, 0, sizeof seen_calls);
			from_a(a);
			from_b(b);
			from_c(c);
			/* Each function's site: the smallest address noted above it
			 * that no other function's start lies between. */
			uint64_t starts[] = {(uint64_t)from_a, (uint64_t)from_b, (uint64_t)from_c};
			const char *names[] = {"from_a", "from_b", "from_c"};
			for (unsigned k = 0; k < 3; k++) {
				uint64_t ret = 0;
				long calls = 0;
				for (unsigned i = 0; i < 8; i++) {
					uint64_t r = seen_ret[i];
					if (r <= starts[k] || (ret && r >= ret))
						continue;
					int other = 0;
					for (unsigned j = 0; j < 3; j++)
						if (starts[j] > starts[k] && starts[j] < r)
							other = 1;
					if (!other) {
						ret = r;
						calls = seen_calls[i];
					}
				}
				printf("site %s ret=0x%llx calls=%ld\n", names[k], (unsigned long long)ret, calls);
			}
			printf("done calls %ld %ld %ld\n", a, b, c);
		} else if (sscanf(line, "chains %ld", &a) == 1) {
			for (long i = 0; i < a; i++)
				sink += chain_x(i);
			for (long i = 0; i < 2 * a; i++)
				sink += chain_y(i);
			printf("done chains %ld\n", a);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("unknown command\n");
		}
	}
	return 0;
}
