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
 *   caller N  stepcaller(N) (N >= 1): calls stepleaf N times ->
 *             "done caller N ret=R own=O all=A" (O: the instructions of
 *             stepcaller itself; A: with stepleaf's)
 *   rec N D   steprec(N), recursive, N frames below the first ->
 *             "done rec N ret=R insns=E" (E: the instructions of the first
 *             D + 1 frames, all of them if D < 0)
 *   sigloop N US  steploop(N) while another thread sends this one SIGUSR1
 *             every US microseconds (a handler counts them) ->
 *             "done sigloop N ret=R insns=E handled=H"
 *   spawn     stepspawn(): starts a thread and joins it -> "done spawn ran=1"
 *   fork      stepfork(): forks a child that exits 7 and waits for it ->
 *             "done fork status=7"
 *   sigtrap   installs a SIGTRAP handler of its own -> "done sigtrap"
 *   quit
 */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdatomic.h>
#include <time.h>

int steploop(int n);
int stepcaller(int n);
int steprec(int n);

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
/* stepleaf: 1, 2 per iteration (5), 1: 12. stepcaller: 4, 3 per call of
 * stepleaf, 4: 3n + 8. steprec: 7 in a frame with n > 0, 4 in the last. */
#define LEAF_INSNS 12
#define CALLER_INSNS(n) (3 * (uint64_t)(n) + 8)
#define REC_FRAME 7
#define REC_LAST 4
__asm__(".text\n"
	".type stepleaf, @function\n"
	"stepleaf:\n"
	"	mov $5, %ecx\n"
	"1:	dec %ecx\n"
	"	jnz 1b\n"
	"	ret\n"
	".size stepleaf, .-stepleaf\n"
	".globl stepcaller\n"
	".type stepcaller, @function\n"
	"stepcaller:\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	push %rbx\n"
	"	mov %edi, %ebx\n"
	"1:	call stepleaf\n"
	"	dec %ebx\n"
	"	jnz 1b\n"
	"	mov %edi, %eax\n"
	"	pop %rbx\n"
	"	pop %rbp\n"
	"	ret\n"
	".size stepcaller, .-stepcaller\n"
	".globl steprec\n"
	".type steprec, @function\n"
	"steprec:\n"
	"	xor %eax, %eax\n"
	"	test %edi, %edi\n"
	"	jz 1f\n"
	"	dec %edi\n"
	"	call steprec\n"
	"	inc %eax\n"
	"1:	ret\n"
	".size steprec, .-steprec\n");
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
/* stepleaf: 1, 2 per iteration (5), 1: 12. stepcaller: 4, 3 per call of
 * stepleaf, 3: 3n + 7. steprec: 7 in a frame with n > 0, 2 in the last. */
#define LEAF_INSNS 12
#define CALLER_INSNS(n) (3 * (uint64_t)(n) + 7)
#define REC_FRAME 7
#define REC_LAST 2
__asm__(".text\n"
	".type stepleaf, %function\n"
	"stepleaf:\n"
	"	mov w1, #5\n"
	"1:	subs w1, w1, #1\n"
	"	b.ne 1b\n"
	"	ret\n"
	".size stepleaf, .-stepleaf\n"
	".globl stepcaller\n"
	".type stepcaller, %function\n"
	"stepcaller:\n"
	"	stp x29, x30, [sp, #-32]!\n"
	"	mov x29, sp\n"
	"	str x19, [sp, #16]\n"
	"	mov w19, w0\n"
	"1:	bl stepleaf\n"
	"	subs w19, w19, #1\n"
	"	b.ne 1b\n"
	"	ldr x19, [sp, #16]\n"
	"	ldp x29, x30, [sp], #32\n"
	"	ret\n"
	".size stepcaller, .-stepcaller\n"
	".globl steprec\n"
	".type steprec, %function\n"
	"steprec:\n"
	"	cbz w0, 1f\n"
	"	stp x29, x30, [sp, #-16]!\n"
	"	sub w0, w0, #1\n"
	"	bl steprec\n"
	"	add w0, w0, #1\n"
	"	ldp x29, x30, [sp], #16\n"
	"1:	ret\n"
	".size steprec, .-steprec\n");
#endif

/* The instructions of steprec(n)'s first depth + 1 frames (all if depth < 0). */
static uint64_t rec_insns(int n, int depth)
{
	uint64_t total = 0;
	for (int i = 0; i <= n && (depth < 0 || i <= depth); i++)
		total += i < n ? REC_FRAME : REC_LAST;
	return total;
}

static volatile sig_atomic_t handled;

static void on_usr1(int sig)
{
	(void)sig;
	handled++;
}

static atomic_int pestering;

static useconds_t pester_us;

/* Sends the thread `arg` points at SIGUSR1 every pester_us while asked to. */
static void *pester(void *arg)
{
	pthread_t target = *(pthread_t *)arg;
	while (atomic_load(&pestering)) {
		pthread_kill(target, SIGUSR1);
		usleep(pester_us);
	}
	return NULL;
}

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

static void *spawned(void *arg)
{
	*(int *)arg = 1;
	return NULL;
}

/* A thread created while the call is stepped (with the trap flag set,
 * which a new thread inherits). */
TP_PROBED int stepspawn(void)
{
	int ran = 0;
	pthread_t t;
	if (pthread_create(&t, NULL, spawned, &ran) != 0)
		return -1;
	pthread_join(t, NULL);
	return ran;
}

/* A child forked while the call is stepped. */
TP_PROBED int stepfork(void)
{
	pid_t child = fork();
	if (child == 0)
		_exit(7);
	int status = 0;
	if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

static void on_trap(int sig)
{
	(void)sig;
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
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		int n, d;
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
		} else if (sscanf(line, "caller %d", &n) == 1 && n >= 1) {
			int r = stepcaller(n);
			printf("done caller %d ret=%d own=%llu all=%llu\n", n, r, (unsigned long long)CALLER_INSNS(n),
			       (unsigned long long)(CALLER_INSNS(n) + (uint64_t)n * LEAF_INSNS));
		} else if (sscanf(line, "rec %d %d", &n, &d) == 2 && n >= 0) {
			int r = steprec(n);
			printf("done rec %d ret=%d insns=%llu\n", n, r, (unsigned long long)rec_insns(n, d));
		} else if (sscanf(line, "sigloop %d %d", &n, &d) == 2 && n >= 1 && d >= 1) {
			pthread_t self = pthread_self(), p;
			pester_us = (useconds_t)d;
			handled = 0;
			atomic_store(&pestering, 1);
			pthread_create(&p, NULL, pester, &self);
			int r = steploop(n);
			atomic_store(&pestering, 0);
			pthread_join(p, NULL);
			printf("done sigloop %d ret=%d insns=%llu handled=%d\n", n, r, (unsigned long long)STEPLOOP_INSNS(n),
			       (int)handled);
		} else if (!strcmp(line, "spawn")) {
			printf("done spawn ran=%d\n", stepspawn());
		} else if (!strcmp(line, "fork")) {
			printf("done fork status=%d\n", stepfork());
		} else if (!strcmp(line, "sigtrap")) {
			signal(SIGTRAP, on_trap);
			printf("done sigtrap\n");
		} else if (!strcmp(line, "ticks")) {
			printf("done ticks ticks=%lu\n", atomic_load(&ticks));
		} else if (!strcmp(line, "quit")) {
			return 0;
		}
	}
	return 0;
}
