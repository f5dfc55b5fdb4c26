/* vectors: a thread that keeps values in its vector registers while tp
 * attaches, for the AArch64 state a syscall discards (the SVE registers
 * beyond their low 128 bits, the predicates): tp's syscalls, made by a
 * stopped thread, must leave that thread's registers as they were.
 *
 * The main thread loads a pattern into v2 (NEON) and, on a CPU with SVE,
 * z0 and p0, then checks them in a loop that makes no call and no syscall
 * until another thread, which reads stdin, tells it to stop:
 *   prints "ready pid=P sve=VL" (VL: the SVE vector length in bytes, 0
 *   without SVE), then
 *     vpcs N -> calls vpcs_scale N times: "done vpcs calls=N checksum=ok|BAD"
 *     stop   -> "intact rounds=N" or "changed at round N: WHAT"
 *     quit   -> exit status 0
 * idle is there to be probed; nothing calls it. vpcs_scale is a function
 * of the vector calling convention (its symbol marked
 * STO_AARCH64_VARIANT_PCS, as SVE functions are), which tp only counts.
 */
#include "common.h"

#include <arm_neon.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/auxv.h>

#ifndef HWCAP_SVE
#define HWCAP_SVE (1 << 22)
#endif

TP_PROBED int idle(int x)
{
	return x + 1;
}

static atomic_int stop;

TP_PROBED __attribute__((aarch64_vector_pcs)) float64x2_t vpcs_scale(float64x2_t x)
{
	return vaddq_f64(x, x);
}

static void call_vpcs(long n)
{
	int ok = 1;
	for (long i = 0; i < n; i++) {
		float64x2_t v = vpcs_scale(vdupq_n_f64((double)i));
		ok &= vgetq_lane_f64(v, 0) == 2.0 * (double)i && vgetq_lane_f64(v, 1) == 2.0 * (double)i;
	}
	printf("done vpcs calls=%ld checksum=%s\n", n, ok ? "ok" : "BAD");
}

/* What the loop found: 0 when every round saw the pattern. */
struct verdict {
	uint64_t rounds;
	uint64_t what; /* 1: v2 changed, 2: p0 changed, 3: z0 changed */
	uint64_t seen;
};

/* Loads the pattern, into z0 and p0 too when sve (the vector length in
 * bytes) is not 0, and checks it every round until *flag is set. */
static struct verdict spin(atomic_int *flag, uint64_t sve)
{
	uint64_t rounds = 0, what = 0, seen = 0;
	__asm__ volatile(
		".arch_extension sve\n"
		"movi v2.16b, #0x5a\n"
		"movz x10, #0x5a5a\n"
		"movk x10, #0x5a5a, lsl #16\n"
		"movk x10, #0x5a5a, lsl #32\n"
		"movk x10, #0x5a5a, lsl #48\n"
		"cbz %[sve], 1f\n"
		"ptrue p0.b\n"
		"index z0.b, #1, #1\n"
		"uaddv d1, p0, z0.b\n"
		"fmov x13, d1\n"
		"1: ldar w9, [%[flag]]\n"
		"cbnz w9, 2f\n"
		"umov x11, v2.d[0]\n"
		"cmp x11, x10\n"
		"b.ne 3f\n"
		"umov x11, v2.d[1]\n"
		"cmp x11, x10\n"
		"b.ne 3f\n"
		"cbz %[sve], 7f\n"
		"cntp x11, p0, p0.b\n"
		"cmp x11, %[sve]\n"
		"b.ne 4f\n"
		"uaddv d1, p0, z0.b\n"
		"fmov x11, d1\n"
		"cmp x11, x13\n"
		"b.ne 5f\n"
		"7: add %[rounds], %[rounds], #1\n"
		"b 1b\n"
		"3: mov %[what], #1\n"
		"b 6f\n"
		"4: mov %[what], #2\n"
		"b 6f\n"
		"5: mov %[what], #3\n"
		"6: mov %[seen], x11\n"
		"2:\n"
		: [rounds] "+r"(rounds), [what] "+r"(what), [seen] "+r"(seen)
		: [flag] "r"(flag), [sve] "r"(sve)
		: "x9", "x10", "x11", "x13", "v0", "v1", "v2", "p0", "cc", "memory");
	return (struct verdict){ rounds, what, seen };
}

static uint64_t sve_bytes(void)
{
	if (!(getauxval(AT_HWCAP) & HWCAP_SVE))
		return 0;
	uint64_t vl;
	__asm__ volatile(".arch_extension sve\ncntb %0" : "=r"(vl));
	return vl;
}

static void *commands(void *arg)
{
	(void)arg;
	char line[64];
	while (tp_read_command(line, sizeof line)) {
		if (strncmp(line, "vpcs ", 5) == 0) {
			call_vpcs(atol(line + 5));
			continue;
		}
		if (strcmp(line, "stop") == 0) {
			atomic_store(&stop, 1);
			return NULL;
		}
	}
	atomic_store(&stop, 1);
	return NULL;
}

int main(void)
{
	uint64_t vl = sve_bytes();
	tp_ready();
	/* The ready line already said the PID; this one says what is checked. */
	printf("spinning sve=%llu\n", (unsigned long long)vl);
	pthread_t t;
	if (pthread_create(&t, NULL, commands, NULL) != 0)
		return 2;
	struct verdict v = spin(&stop, vl);
	static const char *names[] = { "", "v2", "p0", "z0" };
	if (v.what)
		printf("changed at round %llu: %s (%#llx)\n", (unsigned long long)v.rounds, names[v.what],
		       (unsigned long long)v.seen);
	else
		printf("intact rounds=%llu\n", (unsigned long long)v.rounds);
	pthread_join(t, NULL);
	char line[64];
	while (tp_read_command(line, sizeof line))
		if (strcmp(line, "quit") == 0)
			return 0;
	return 0;
}
