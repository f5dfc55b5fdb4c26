/* events: functions with typed arguments and return values, a recursive
 * function, one that sleeps a known time, and one left by longjmp. Each
 * command logs every call it makes, so a test can compare tp's events with
 * the target's own record, in order, per thread.
 *
 * Commands (answers end with a "done" line; log lines come before it):
 *   call N [T]     T threads (default 1) each call add, mix and greet N times
 *                  -> "log TID add a=A b=B ret=R", "log TID mix c=.. s=.. u=.. l=.. flag=.. ch=.. ret=R",
 *                     "log TID greet name=NAME ret=R" per call, then "done call"
 *   fib K          -> "done fib K calls=C ret=R" (C: calls of fib made)
 *   nap MS         one call of nap(MS), which sleeps MS milliseconds -> "done nap MS"
 *   jump D         recurse D levels in jumper(), then longjmp out -> "done jump D"
 *   deep D         recurse D levels in descend(), which returns the sum of
 *                  1..D -> "done deep D ret=R"
 *   quiet N        N calls of add without logging -> "done quiet N"
 *   tail N         N calls of tail_outer, which tail-calls tail_inner
 *                  -> "done tail N sum=S"
 *   burst R        R rounds of: a 1 ms sleep, one call of pulse(1), which
 *                  spins 200 us, then 99 calls of pulse(0), which return at
 *                  once -> "done burst R"
 *   many N         N calls of eight, which takes eight integer arguments,
 *                  and of by_ref, which takes a struct of 24 bytes (in memory
 *                  or by reference, by the ABI) and a long
 *                  -> "log TID eight a=.. b=.. c=.. d=.. e=.. f=.. g=.. h=.. ret=R",
 *                     "log TID by_ref after=.. ret=R" per call, then "done many"
 *   ipa N          N calls of ipa_caller, which keeps values in registers the
 *                  ABI lets a callee clobber across its call of ipa_leaf
 *                  -> "done ipa N bad=B" (B: calls whose result was wrong)
 *   signals N      N calls of interrupted while a timer signal every 20 us
 *                  runs a handler that calls it too (so a call's entry or
 *                  exit is interrupted by another's)
 *                  -> "done signals N calls=C handled=H bad=B" (C: calls
 *                     made in all, H: by the handler)
 *   paint N        N calls of paint, whose first argument is an enum, its
 *                  values RED, GREEN and BLUE in turn
 *                  -> "log TID paint c=NAME n=N ret=R" per call, then "done paint N"
 *   quit
 *
 * AArch64 builds `events-pac` too (-DTP_BTI, -mbranch-protection=standard):
 * the probed functions that call others sign their return address
 * (paciasp; greet with key B: pacibsp), the others start with `bti c`, and
 * they lie in pages the program guards with PROT_BTI at start, after it
 * checked that an indirect call there without a landing pad faults; `add`
 * is called through a pointer. It prints "guarded pac=P bti=B" first.
 */
#include "common.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>

#ifdef TP_BTI
#include <errno.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#ifndef PROT_BTI
#define PROT_BTI 0x10
#endif
/* The probed functions go into pages of their own, between two markers
 * (the build keeps top-level order: -fno-toplevel-reorder). */
#define TP_GUARDED __attribute__((section("tp_guarded")))
__asm__(".pushsection tp_guarded, \"ax\", @progbits\n"
	".balign 4096\n"
	".globl tp_guarded_start\n"
	"tp_guarded_start:\n"
	/* No landing pad: an indirect call here must fault under the guard. */
	".globl tp_bti_canary\n"
	".type tp_bti_canary, %function\n"
	"tp_bti_canary:\n"
	"	mov x0, #1\n"
	"	ret\n"
	".size tp_bti_canary, .-tp_bti_canary\n"
	".popsection");
extern char tp_guarded_start[], tp_guarded_end[];
long tp_bti_canary(void);
#define TP_KEY_B __attribute__((target("branch-protection=pac-ret+b-key+bti")))
#else
#define TP_GUARDED
#define TP_KEY_B
#endif

#define TP_EVENT TP_PROBED TP_GUARDED

TP_EVENT long add(int a, long b)
{
	return a + b;
}

TP_EVENT unsigned long mix(unsigned char c, unsigned short s, unsigned int u, unsigned long l, bool flag, char ch)
{
	return c + s + u + l + flag + (unsigned char)ch;
}

TP_EVENT TP_KEY_B int greet(const char *name, const void *where)
{
	(void)where;
	return (int)strlen(name);
}

enum color { RED, GREEN = 5, BLUE = -2 };

TP_EVENT int paint(enum color c, int n)
{
	return (int)c * n;
}

TP_EVENT long eight(int a, long b, unsigned c, short d, long e, unsigned long f, signed char g, long h)
{
	return a + b + c + d + e + (long)f + g + h;
}

struct big {
	long x[3];
};

TP_EVENT long by_ref(struct big s, long after)
{
	return s.x[0] + s.x[1] + s.x[2] + after;
}

static unsigned long fib_calls;

/* Without sibling-call optimization GCC keeps both recursive calls as calls
 * (it would otherwise loop over one), so every call enters the function. */
#define TP_RECURSIVE __attribute__((optimize("no-optimize-sibling-calls")))

TP_EVENT TP_RECURSIVE long fib(int n)
{
	fib_calls++;
	return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

TP_EVENT int nap(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0)
		;
	return ms;
}

static jmp_buf escape;

/* Its only way out is the longjmp at the bottom, which GCC calls infinite recursion. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winfinite-recursion"
TP_EVENT TP_RECURSIVE int jumper(int depth)
{
	if (depth == 0)
		longjmp(escape, 1);
	return jumper(depth - 1) + 1;
}
#pragma GCC diagnostic pop

TP_EVENT TP_RECURSIVE long descend(int depth)
{
	if (depth == 0)
		return 0;
	return descend(depth - 1) + depth;
}

TP_EVENT long tail_inner(long x)
{
	return x * 3;
}

/* A sibling call: GCC makes it a jmp, so tail_inner runs with the return
 * address tail_outer was given. */
TP_EVENT long tail_outer(long x)
{
	return tail_inner(x + 1);
}

/* ipa_caller(x) keeps x in every register the ABI lets a callee clobber
 * but the one ipa_leaf returns in (x86-64: rsi, rcx, r8-r11 and rdi;
 * AArch64: x1-x15 and x18, but x16 and x17, which GCC never keeps across
 * a call), and a comparison in the flags, across its call of ipa_leaf,
 * which touches none of them: GCC's -fipa-ra does this with local callees.
 * A probe that clobbers any of them on entry or on return breaks the
 * result, (IPA_KEPT + 1) x + 1 + (x == 5). */
long ipa_caller(long x);
#if defined(__x86_64__)
#define IPA_KEPT 7
__asm__(".text\n"
	".globl ipa_leaf\n"
	".type ipa_leaf, @function\n"
	"ipa_leaf:\n"
	"	leaq 1(%rdi), %rax\n"
	"	leaq (%rax), %rax\n"
	"	ret\n"
	".size ipa_leaf, .-ipa_leaf\n"
	".globl ipa_caller\n"
	".type ipa_caller, @function\n"
	"ipa_caller:\n"
	"	pushq %rbx\n"
	"	movq %rdi, %rsi\n"
	"	movq %rdi, %rcx\n"
	"	movq %rdi, %r8\n"
	"	movq %rdi, %r9\n"
	"	movq %rdi, %r10\n"
	"	movq %rdi, %r11\n"
	"	xorl %edx, %edx\n"
	"	cmpq $5, %rdi\n"
	"	call ipa_leaf\n"
	"	sete %dl\n"
	"	addq %rdx, %rax\n"
	"	addq %rdi, %rax\n"
	"	addq %rsi, %rax\n"
	"	addq %rcx, %rax\n"
	"	addq %r8, %rax\n"
	"	addq %r9, %rax\n"
	"	addq %r10, %rax\n"
	"	addq %r11, %rax\n"
	"	popq %rbx\n"
	"	ret\n"
	".size ipa_caller, .-ipa_caller\n");
#elif defined(__aarch64__)
#define IPA_KEPT 16
__asm__(".text\n"
	".globl ipa_leaf\n"
	".type ipa_leaf, %function\n"
	"ipa_leaf:\n"
	"	add x0, x0, #1\n"
	"	ret\n"
	".size ipa_leaf, .-ipa_leaf\n"
	".globl ipa_caller\n"
	".type ipa_caller, %function\n"
	"ipa_caller:\n"
	"	stp x29, x30, [sp, #-16]!\n"
	"	mov x29, sp\n"
	"	mov x1, x0\n"
	"	mov x2, x0\n"
	"	mov x3, x0\n"
	"	mov x4, x0\n"
	"	mov x5, x0\n"
	"	mov x6, x0\n"
	"	mov x7, x0\n"
	"	mov x8, x0\n"
	"	mov x9, x0\n"
	"	mov x10, x0\n"
	"	mov x11, x0\n"
	"	mov x12, x0\n"
	"	mov x13, x0\n"
	"	mov x14, x0\n"
	"	mov x15, x0\n"
	"	mov x18, x0\n"
	"	cmp x0, #5\n"
	"	bl ipa_leaf\n"
	"	cset x16, eq\n"
	"	add x0, x0, x16\n"
	"	add x0, x0, x1\n"
	"	add x0, x0, x2\n"
	"	add x0, x0, x3\n"
	"	add x0, x0, x4\n"
	"	add x0, x0, x5\n"
	"	add x0, x0, x6\n"
	"	add x0, x0, x7\n"
	"	add x0, x0, x8\n"
	"	add x0, x0, x9\n"
	"	add x0, x0, x10\n"
	"	add x0, x0, x11\n"
	"	add x0, x0, x12\n"
	"	add x0, x0, x13\n"
	"	add x0, x0, x14\n"
	"	add x0, x0, x15\n"
	"	add x0, x0, x18\n"
	"	ldp x29, x30, [sp], #16\n"
	"	ret\n"
	".size ipa_caller, .-ipa_caller\n");
#else
#error "events.c: no ipa_caller for this architecture"
#endif

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The first call after a pause is long, the rest short: a profiler that
 * times the first calls after an instant sees mostly the long one. */
TP_EVENT int pulse(int long_one)
{
	if (long_one) {
		uint64_t end = now_ns() + 200000;
		while (now_ns() < end)
			;
	}
	return long_one;
}

#ifdef TP_BTI
__asm__(".pushsection tp_guarded, \"ax\", @progbits\n"
	".balign 4096\n"
	".globl tp_guarded_end\n"
	"tp_guarded_end:\n"
	".popsection");

static sigjmp_buf bti_jump;

static void on_sigill(int sig)
{
	siglongjmp(bti_jump, sig);
}

/* Guards the probed functions' pages with BTI where the CPU has it
 * (HWCAP2_BTI), and checks that an indirect call there to code without a
 * landing pad then faults; says whether the CPU signs return addresses
 * (HWCAP_PACA; without it paciasp and autiasp are NOPs). */
static void guard_with_bti(void)
{
	static long (*volatile canary)(void) = tp_bti_canary;
	size_t len = (size_t)(tp_guarded_end - tp_guarded_start);
	int bti = 0;
	if (getauxval(AT_HWCAP2) >> 17 & 1) {
		if (mprotect(tp_guarded_start, len, PROT_READ | PROT_EXEC | PROT_BTI) != 0) {
			printf("error mprotect(PROT_BTI): %s\n", strerror(errno));
			exit(2);
		}
		signal(SIGILL, on_sigill);
		bti = sigsetjmp(bti_jump, 1) != 0;
		if (!bti) {
			canary();
			printf("error BTI is not enforced: an indirect call without a landing pad returned\n");
			exit(2);
		}
		signal(SIGILL, SIG_DFL);
	}
	printf("guarded pac=%lu bti=%d pages=%zu\n", (unsigned long)(getauxval(AT_HWCAP) >> 30 & 1), bti, len / 4096);
}
#endif

/* Called by the main loop and by a timer signal's handler. */
TP_PROBED long interrupted(long x)
{
	return x * 3 + 1;
}

static volatile sig_atomic_t handled;
static volatile long handler_bad;

static void on_timer(int sig)
{
	(void)sig;
	long x = handled;
	handler_bad += interrupted(x) != x * 3 + 1;
	handled = x + 1;
}

/* The "signals N" command; returns the calls whose result was wrong. */
static unsigned long signals(unsigned long n)
{
	struct sigaction sa = {0};
	sa.sa_handler = on_timer;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval every = {{0, 20}, {0, 20}}, off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &every, NULL);
	unsigned long bad = 0;
	for (unsigned long i = 0; i < n; i++)
		bad += interrupted((long)i) != (long)i * 3 + 1;
	setitimer(ITIMER_REAL, &off, NULL);
	return bad + (unsigned long)handler_bad;
}

static pid_t tid(void)
{
	return (pid_t)syscall(SYS_gettid);
}

static const char *names[] = {"ada", "grace", "", "linus torvalds", "x"};

/* Through a volatile pointer: an indirect call (blr), which under the BTI
 * guard must land on add's landing pad. */
static long (*volatile add_ptr)(int, long) = add;

struct job {
	pthread_t thread;
	unsigned long n;
	int seed;
	char *log; /* this thread's log lines */
	size_t len, cap;
};

static void logf_(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(struct job *j, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (j->len + n + 1 > j->cap) {
		j->cap = (j->cap + n + 1) * 2;
		j->log = realloc(j->log, j->cap);
	}
	memcpy(j->log + j->len, line, n);
	j->len += n;
}

static void *job_main(void *arg)
{
	struct job *j = arg;
	pid_t me = tid();
	for (unsigned long i = 0; i < j->n; i++) {
		int a = (int)(i * 7) - 50 + j->seed;
		long b = (long)i * 1000003L - 77;
		long r = add_ptr(a, b);
		logf_(j, "log %d add a=%d b=%ld ret=%ld\n", me, a, b, r);
		unsigned char c = (unsigned char)(i * 31 + j->seed);
		unsigned short s = (unsigned short)(i * 977);
		unsigned int u = (unsigned int)(i * 2654435761u);
		unsigned long l = i * 0x9e3779b97f4a7c15ul;
		bool flag = i % 3 == 0;
		char ch = (char)('a' + i % 26);
		unsigned long m = mix(c, s, u, l, flag, ch);
		logf_(j, "log %d mix c=%u s=%u u=%u l=%lu flag=%s ch=%c ret=%lu\n", me, c, s, u, l, flag ? "true" : "false",
		      ch, m);
		const char *name = names[(i + j->seed) % 5];
		int g = greet(name, name);
		logf_(j, "log %d greet name=%s ret=%d\n", me, name, g);
	}
	return NULL;
}

/* The main thread's TID, kept in a thread-local variable as programs that
 * log it do: tp, attaching while this thread is the only one, then finds
 * the TID in two places near its TCB, and the runtime tells them apart in
 * the first thread the target starts. */
static __thread volatile pid_t main_tid;

int main(void)
{
	char line[256];
	main_tid = tid();
#ifdef TP_BTI
	setvbuf(stdout, NULL, _IOLBF, 0);
	guard_with_bti();
#endif
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		unsigned long n = 0;
		int t = 1, k = 0;
		if (sscanf(line, "call %lu %d", &n, &t) >= 1) {
			if (t < 1 || t > 64)
				t = 1;
			struct job jobs[64];
			for (int i = 0; i < t; i++) {
				jobs[i] = (struct job){.n = n, .seed = i * 1000};
				pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]);
			}
			for (int i = 0; i < t; i++) {
				pthread_join(jobs[i].thread, NULL);
				fwrite(jobs[i].log, 1, jobs[i].len, stdout);
				free(jobs[i].log);
			}
			printf("done call\n");
		} else if (sscanf(line, "fib %d", &k) == 1) {
			fib_calls = 0;
			long r = fib(k);
			printf("done fib %d calls=%lu ret=%ld\n", k, fib_calls, r);
		} else if (sscanf(line, "nap %d", &k) == 1) {
			nap(k);
			printf("done nap %d\n", k);
		} else if (sscanf(line, "jump %d", &k) == 1) {
			if (setjmp(escape) == 0)
				jumper(k);
			printf("done jump %d\n", k);
		} else if (sscanf(line, "deep %d", &k) == 1) {
			printf("done deep %d ret=%ld\n", k, descend(k));
		} else if (sscanf(line, "tail %lu", &n) == 1) {
			long sum = 0;
			for (unsigned long i = 0; i < n; i++)
				sum += tail_outer((long)i);
			printf("done tail %lu sum=%ld\n", n, sum);
		} else if (sscanf(line, "burst %lu", &n) == 1) {
			for (unsigned long r = 0; r < n; r++) {
				struct timespec ms = {0, 1000000};
				nanosleep(&ms, NULL);
				pulse(1);
				for (int i = 0; i < 99; i++)
					pulse(0);
			}
			printf("done burst %lu\n", n);
		} else if (sscanf(line, "many %lu", &n) == 1) {
			pid_t me = tid();
			for (unsigned long i = 0; i < n; i++) {
				int a = (int)i - 3;
				long b = (long)i * 100003;
				unsigned c = (unsigned)(i * 7);
				short d = (short)(-(long)i);
				long e = 1L << (i % 60);
				unsigned long f = ~i;
				signed char g = (signed char)(i * 13 - 60);
				long h = -(long)i * 1000000007L;
				long r = eight(a, b, c, d, e, f, g, h);
				printf("log %d eight a=%d b=%ld c=%u d=%d e=%ld f=%lu g=%d h=%ld ret=%ld\n", me, a, b, c, d, e, f, g,
				       h, r);
				struct big s = {{(long)i, 2 * (long)i, 3}};
				long after = 77 - (long)i;
				r = by_ref(s, after);
				printf("log %d by_ref after=%ld ret=%ld\n", me, after, r);
			}
			printf("done many\n");
		} else if (sscanf(line, "ipa %lu", &n) == 1) {
			unsigned long bad = 0;
			for (unsigned long i = 0; i < n; i++)
				bad += ipa_caller((long)(i % 11)) != (IPA_KEPT + 1) * (long)(i % 11) + 1 + (i % 11 == 5);
			printf("done ipa %lu bad=%lu\n", n, bad);
		} else if (sscanf(line, "signals %lu", &n) == 1) {
			unsigned long bad = signals(n);
			printf("done signals %lu calls=%lu handled=%lu bad=%lu\n", n, n + (unsigned long)handled,
			       (unsigned long)handled, bad);
		} else if (sscanf(line, "paint %lu", &n) == 1) {
			static const enum color colors[] = {RED, GREEN, BLUE};
			static const char *color_names[] = {"RED", "GREEN", "BLUE"};
			for (unsigned long i = 0; i < n; i++) {
				int r = paint(colors[i % 3], (int)i);
				printf("log %d paint c=%s n=%lu ret=%d\n", (int)tid(), color_names[i % 3], i, r);
			}
			printf("done paint %lu\n", n);
		} else if (sscanf(line, "quiet %lu", &n) == 1) {
			long sum = 0;
			for (unsigned long i = 0; i < n; i++)
				sum += add((int)i, (long)i);
			printf("done quiet %lu sum=%ld\n", n, sum);
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	return 0;
}
