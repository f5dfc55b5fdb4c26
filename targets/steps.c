/* steps: functions whose every instruction tp steps with --steps
 * (tests/e2e/steps.rs). steploop is written in assembly so that the
 * instructions a call executes are known exactly (the seed's loop: two
 * per iteration); the program says how many it expects. A ticker thread
 * runs all along: the other threads run while one call is stepped.
 *
 * Commands:
 *   loop N    steploop(N) (N >= 1) -> "done loop N ret=R insns=E ns=T"
 *             (E: the instructions the call executes; T: its time)
 *   nap MS    napper(MS): sleeps MS ms in a syscall -> "done nap MS"
 *   chain N   chain(N): calls leaf N times -> "done chain N sum=S"
 *   ticks     -> "done ticks ticks=T" (the ticker's rounds so far)
 *   quit
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

int steploop(int n);

#if defined(__x86_64__)
/* 3 instructions, 2 per iteration, 3: 2n + 6. */
#define STEPLOOP_INSNS(n) (2 * (uint64_t)(n) + 6)
__asm__(".text\n"
	".globl steploop\n"
	".type steploop, @function\n"
	"steploop:\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	mov %edi, %ecx\n"
	"1:	dec %ecx\n"
	"	jnz 1b\n"
	"	mov %edi, %eax\n"
	"	pop %rbp\n"
	"	ret\n"
	".size steploop, .-steploop\n");
#elif defined(__aarch64__)
/* 1 instruction, 2 per iteration, 1: 2n + 2. */
#define STEPLOOP_INSNS(n) (2 * (uint64_t)(n) + 2)
__asm__(".text\n"
	".globl steploop\n"
	".type steploop, %function\n"
	"steploop:\n"
	"	mov w1, w0\n"
	"1:	subs w1, w1, #1\n"
	"	b.ne 1b\n"
	"	ret\n"
	".size steploop, .-steploop\n");
#endif

TP_PROBED int leaf(int i)
{
	int x = i * 3;
	return x + 1;
}

TP_PROBED int chain(int n)
{
	int sum = 0;
	for (int i = 0; i < n; i++)
		sum += leaf(i);
	return sum;
}

TP_PROBED void napper(int ms)
{
	usleep((useconds_t)ms * 1000);
}

static atomic_ulong ticks;

static void *ticker(void *arg)
{
	(void)arg;
	for (;;) {
		atomic_fetch_add(&ticks, 1);
		usleep(1000);
	}
	return NULL;
}

int main(void)
{
	char line[256];
	pthread_t t;
	pthread_create(&t, NULL, ticker, NULL);
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		int n;
		if (sscanf(line, "loop %d", &n) == 1 && n >= 1) {
			struct timespec a, b;
			clock_gettime(CLOCK_MONOTONIC, &a);
			int r = steploop(n);
			clock_gettime(CLOCK_MONOTONIC, &b);
			long long ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
			printf("done loop %d ret=%d insns=%llu ns=%lld\n", n, r, (unsigned long long)STEPLOOP_INSNS(n), ns);
		} else if (sscanf(line, "nap %d", &n) == 1) {
			napper(n);
			printf("done nap %d\n", n);
		} else if (sscanf(line, "chain %d", &n) == 1) {
			int want = 0;
			for (int i = 0; i < n; i++)
				want += i * 3 + 1;
			int sum = chain(n);
			printf("done chain %d sum=%d%s\n", n, sum, sum == want ? "" : " BAD");
		} else if (!strcmp(line, "ticks")) {
			printf("done ticks ticks=%lu\n", atomic_load(&ticks));
		} else if (!strcmp(line, "quit")) {
			return 0;
		}
	}
	return 0;
}
