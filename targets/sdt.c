/* sdt: static probes (USDT) with arguments of every kind and a semaphore,
 * written with targets/sdt.h. Each command logs what it passes to the
 * probes, so a test can compare tp's events with the target's own record.
 *
 * Probes:
 *   tpsdt:tick   in tick(), under its semaphore: the loop counter (a signed
 *                4-byte value, usually in a register), a 64-bit value, a
 *                signed 2-byte field of a struct in memory, the constant -7,
 *                and a global (memory at a symbol, `level(%rip)` on x86-64)
 *   tpsdt:idle   in idle(), without a semaphore or arguments
 *   tpsdt:leaf   in leaf(), a leaf function that keeps its locals below the
 *                stack pointer (the red zone) around the probe
 *
 * Commands (answers end with a "done" line; log lines come before it):
 *   tick N       N calls of tick(i, ...); each whose semaphore is set
 *                fires tpsdt:tick -> "log tick i=I v=V d=D c=-7 g=G" per
 *                fire, then "done tick N fired=F"
 *   idle N       N calls of idle() -> "done idle N"
 *   leaf N       N calls of leaf(i) -> "done leaf N sum=S bad=B"
 *   sem          -> "sem tick=S" (the semaphore's value)
 *   quit
 */
#include "common.h"
#include "sdt.h"

TP_SDT_SEMAPHORE(tpsdt, tick);

struct item {
	uint64_t id;
	int16_t delta;
};

/* Read by the probe through its symbol; changed by every call. */
volatile int32_t level = -3;
static unsigned long fired;

TP_PROBED void tick(int32_t i, uint64_t v, struct item *it)
{
	if (TP_SDT_ENABLED(tpsdt, tick)) {
		fired++;
		TP_SDT_PROBE_SEM(tpsdt, tick, "-4@%[i] 8@%[v] -2@%[d] -4@%[c] -4@%[g]", [i] "nor"(i), [v] "nor"(v),
				 [d] "nor"(it->delta), [c] "nor"(-7), [g] "nor"(level));
		printf("log tick i=%d v=%llu d=%d c=-7 g=%d\n", i, (unsigned long long)v, it->delta, level);
	}
	level = level * 5 + i;
}

static volatile unsigned long idles;

TP_PROBED void idle(void)
{
	TP_SDT_PROBE(tpsdt, idle, "");
	idles++;
}

/* A leaf: its locals live below the stack pointer, where a detour that
 * pushed without stepping over the red zone would overwrite them. */
__attribute__((noinline, noclone, noipa, used, optimize("O0"))) int leaf(int i)
{
	volatile int a = i * 7, b = i ^ 0x55, c = a + b;
	TP_SDT_PROBE(tpsdt, leaf, "-4@%[i]", [i] "nor"(i));
	return a + b + c;
}

static int leaf_ref(int i)
{
	int a = i * 7, b = i ^ 0x55;
	return a + b + (a + b);
}

int main(void)
{
	tp_ready();
	char cmd[256];
	struct item it = {42, -300};
	while (tp_read_command(cmd, sizeof cmd)) {
		long n;
		if (sscanf(cmd, "tick %ld", &n) == 1) {
			unsigned long before = fired;
			for (long k = 0; k < n; k++) {
				it.delta = (int16_t)(it.delta + 37);
				tick((int32_t)k - 5, 0xfeedface00000000ull + (uint64_t)k, &it);
			}
			printf("done tick %ld fired=%lu\n", n, fired - before);
		} else if (sscanf(cmd, "idle %ld", &n) == 1) {
			for (long k = 0; k < n; k++)
				idle();
			printf("done idle %ld\n", n);
		} else if (sscanf(cmd, "leaf %ld", &n) == 1) {
			long sum = 0, bad = 0;
			for (long k = 0; k < n; k++) {
				int r = leaf((int)k);
				sum += r;
				bad += r != leaf_ref((int)k);
			}
			printf("done leaf %ld sum=%ld bad=%ld\n", n, sum, bad);
		} else if (!strcmp(cmd, "sem")) {
			printf("sem tick=%u\n", (unsigned)tpsdt_tick_semaphore);
		} else if (!strcmp(cmd, "quit")) {
			return 0;
		}
	}
	return 0;
}
