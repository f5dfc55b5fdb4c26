/* stacks: known call paths, argument values and durations, for --stack,
 * --if, --by and the histograms kept in the target. Built with frame
 * pointers (`stacks`) and without (`stacks-nofp`). Every call it makes is
 * counted by the target itself, so a test compares tp's answer with the
 * target's own.
 *
 * Commands (each answer is one "done" line):
 *   paths N      N rounds of: path_a -> a_mid -> leaf(1), and twice
 *                path_b -> leaf(2) -> "done paths N a=N b=2N"
 *   deep D N     N calls of leaf(3) under D levels of descend()
 *                -> "done deep D N"
 *   values N     leaf(i % 10) for i < N -> "done values N"
 *   naps US N    N calls of nap(US), which sleeps US microseconds; the
 *                target times each call itself -> "done naps US N ns=D,D,..."
 *                (each call's duration in ns)
 *   inlined N    N calls of leaf(4) from inner_helper, which the compiler
 *                inlines into run_inlined -> "done inlined N"
 *   threads T N  T threads, each running paths N -> "done threads T N"
 *   wild N       N rounds of calls of leaf(5) whose caller's frame pointer
 *                is hostile (x86-64, AArch64; elsewhere plain calls): misaligned, a
 *                PROT_NONE page, a record on the heap pointing there, a
 *                record on the stack pointing to itself, to that page, and
 *                to the stack's last word -> "done wild N calls=C"
 *   quit
 */
#include "common.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

/* Without sibling-call optimization every call stays a call (a tail call
 * would leave its caller off the stack). */
#define TP_CALLS __attribute__((optimize("no-optimize-sibling-calls")))

TP_PROBED long leaf(int n)
{
	return 2L * n + 1;
}

TP_PROBED TP_CALLS long a_mid(int n)
{
	return leaf(n) + 1;
}

TP_PROBED TP_CALLS long path_a(int n)
{
	return a_mid(n) + 1;
}

TP_PROBED TP_CALLS long path_b(int n)
{
	return leaf(n) + 1;
}

TP_PROBED TP_CALLS long descend(int depth, int n)
{
	return depth == 0 ? leaf(n) + 1 : descend(depth - 1, n) + 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

TP_PROBED int nap(int us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
	while (nanosleep(&ts, &ts) != 0)
		;
	return us;
}

static volatile long sink;

TP_PROBED TP_CALLS void run_paths(long n)
{
	for (long i = 0; i < n; i++) {
		sink += path_a(1);
		sink += path_b(2);
		sink += path_b(2);
	}
}

TP_PROBED TP_CALLS void run_deep(int depth, long n)
{
	for (long i = 0; i < n; i++)
		sink += descend(depth, 3);
}

/* Inlined into run_inlined: a frame only DWARF tells about. */
static inline __attribute__((always_inline)) long inner_helper(int n)
{
	return leaf(n) + 1;
}

TP_PROBED TP_CALLS void run_inlined(long n)
{
	for (long i = 0; i < n; i++)
		sink += inner_helper(4);
}

TP_PROBED TP_CALLS void *thread_main(void *arg)
{
	run_paths((long)arg);
	return NULL;
}

#if defined(__x86_64__)
/* Calls leaf(n) with rbp set to `fp`, as code that keeps no frame pointer
 * may leave it (rbp is then any value). */
__attribute__((noinline, noclone)) static long call_with_fp(uint64_t fp, int n)
{
	long r;
	__asm__ volatile("sub $136, %%rsp\n\t" /* past the red zone, 16-aligned with the push */
			 "push %%rbp\n\t"
			 "mov %1, %%rbp\n\t"
			 "mov %2, %%edi\n\t"
			 "call leaf\n\t"
			 "pop %%rbp\n\t"
			 "add $136, %%rsp"
			 : "=a"(r)
			 : "r"(fp), "r"(n)
			 : "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
	return r;
}
#elif defined(__aarch64__)
/* The same with x29 set to `fp`: the frame record is pushed and popped
 * around the call here, as the compiler would. */
__attribute__((noinline, noclone)) static long call_with_fp(uint64_t fp, int n)
{
	long r;
	__asm__ volatile("stp x29, x30, [sp, #-16]!\n\t"
			 "mov x29, %1\n\t"
			 "mov w0, %w2\n\t"
			 "bl leaf\n\t"
			 "ldp x29, x30, [sp], #16\n\t"
			 "mov %0, x0"
			 : "=r"(r)
			 : "r"(fp), "r"(n)
			 : "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14",
			   "x15", "x16", "x17", "x18", "x30", "memory", "cc");
	return r;
}
#else
__attribute__((noinline, noclone)) static long call_with_fp(uint64_t fp, int n)
{
	(void)fp;
	return leaf(n);
}
#endif

/* The hostile frame pointers of `wild`: returns the calls of leaf made. */
static long run_wild(long rounds)
{
	static void *none;
	if (!none)
		none = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t *heap = malloc(4 * sizeof(uint64_t));
	volatile uint64_t frame[4];
	uint64_t stack_end = 0;
	FILE *maps = fopen("/proc/self/maps", "r");
	char l[512];
	while (maps && fgets(l, sizeof l, maps))
		if (strstr(l, "[stack]"))
			sscanf(l, "%*x-%lx", &stack_end);
	if (maps)
		fclose(maps);
	long calls = 0;
	for (long i = 0; i < rounds; i++) {
		heap[0] = (uint64_t)none;
		heap[1] = 0x1234;
		uint64_t wild[] = {1, (uint64_t)none, (uint64_t)heap, (uint64_t)&frame[0], (uint64_t)&frame[0],
				   (uint64_t)&frame[0], stack_end - 8, stack_end};
		uint64_t next[] = {0, 0, 0, (uint64_t)&frame[0], (uint64_t)none, stack_end - 8, 0, 0};
		for (unsigned k = 0; k < sizeof wild / sizeof wild[0]; k++) {
			frame[0] = next[k];
			frame[1] = 0x5678;
			sink += call_with_fp(wild[k], 5);
			calls++;
		}
	}
	free(heap);
	return calls;
}

int main(void)
{
	char line[256];
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		long a = 0, b = 0;
		if (sscanf(line, "paths %ld", &a) == 1) {
			run_paths(a);
			printf("done paths %ld a=%ld b=%ld\n", a, a, 2 * a);
		} else if (sscanf(line, "deep %ld %ld", &a, &b) == 2) {
			run_deep((int)a, b);
			printf("done deep %ld %ld\n", a, b);
		} else if (sscanf(line, "values %ld", &a) == 1) {
			for (long i = 0; i < a; i++)
				sink += leaf((int)(i % 10));
			printf("done values %ld\n", a);
		} else if (sscanf(line, "naps %ld %ld", &a, &b) == 2) {
			printf("done naps %ld %ld ns=", a, b);
			for (long i = 0; i < b; i++) {
				uint64_t t0 = now_ns();
				nap((int)a);
				uint64_t d = now_ns() - t0;
				printf("%s%llu", i ? "," : "", (unsigned long long)d);
			}
			printf("\n");
		} else if (sscanf(line, "threads %ld %ld", &a, &b) == 2) {
			pthread_t t[16];
			if (a > 16)
				a = 16;
			for (long i = 0; i < a; i++)
				pthread_create(&t[i], NULL, thread_main, (void *)b);
			for (long i = 0; i < a; i++)
				pthread_join(t[i], NULL);
			printf("done threads %ld %ld\n", a, b);
		} else if (sscanf(line, "inlined %ld", &a) == 1) {
			run_inlined(a);
			printf("done inlined %ld\n", a);
		} else if (sscanf(line, "wild %ld", &a) == 1) {
			long calls = run_wild(a);
			printf("done wild %ld calls=%ld\n", a, calls);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("unknown command\n");
		}
	}
	return 0;
}
