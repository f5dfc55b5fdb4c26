/* prologues_aarch64.c (AArch64 only): calls the functions of prologues_aarch64.S,
 * each starting with a PC-relative or otherwise special instruction, from
 * one or more threads, and checks every result against a C reference.
 *
 * Built twice: `prologues`, and `prologues-bti` (-DTP_BTI), which first
 * guards the pages of prologues_aarch64.S with PROT_BTI and proves the
 * guard is enforced (an indirect call to a function without a landing pad
 * must raise SIGILL) before it reports ready. p_bti and p_pac, which start
 * with landing pads, are always called through a function pointer, so in
 * the BTI build they fault unless their landing pads are still in place.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call FUNC N [T]  T threads (default 1) each call FUNC N times
 *                    -> "done FUNC calls=C checksum=ok|BAD"
 *   crowd            reserves (PROT_NONE) every free range within 129 MiB of
 *                    this program but the 256 MiB the heap and the stack may
 *                    grow into (tp leaves those alone too), so no code page
 *                    fits within `b` reach of it
 *                    -> "crowded kib=N" (-1 if it could not)
 *   quit             -> exit status 0, or 1 if any checksum failed
 */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/auxv.h>
#include <sys/mman.h>

#ifndef PROT_BTI
#define PROT_BTI 0x10
#endif

typedef uint64_t (*fn1)(uint64_t);

uint64_t p_adr(uint64_t), p_adrp(uint64_t), p_ldr_x(uint64_t), p_ldr_w(uint64_t), p_ldrsw(uint64_t);
uint64_t p_prfm(uint64_t), p_ldr_d(uint64_t), p_ldr_q(uint64_t), p_b(uint64_t), p_ret(uint64_t);
uint64_t p_cbz(uint64_t, uint64_t), p_cbnz(uint64_t, uint64_t), p_tbz(uint64_t), p_tbnz(uint64_t);
uint64_t call_p_bl(uint64_t), call_p_blr(uint64_t), call_p_bcond(uint64_t);
uint64_t p_bti(uint64_t), p_pac(uint64_t), p_self(uint64_t), tp_bti_canary(uint64_t);
extern char tp_guarded_start[], tp_guarded_end[];

#define K1 0x0123456789abcdefull
#define K2 0x5a5a5a5a00c0ffeeull
#define K3 0x89abcdefull
#define K4_HIGH 0x7766554433221100ull

/* Through a volatile pointer: the compiler must emit blr. */
static fn1 volatile indirect_bti = p_bti, indirect_pac = p_pac;

struct func {
	const char *name;
	atomic_uint_fast64_t calls;
};

static struct func funcs[] = {
	{"p_adr"}, {"p_adrp"}, {"p_ldr_x"}, {"p_ldr_w"}, {"p_ldrsw"}, {"p_prfm"}, {"p_ldr_d"},
	{"p_ldr_q"}, {"p_b"}, {"p_bl"}, {"p_bcond"}, {"p_cbz"}, {"p_cbnz"}, {"p_tbz"},
	{"p_tbnz"}, {"p_blr"}, {"p_ret"}, {"p_bti"}, {"p_pac"}, {"p_self"},
};
#define NFUNCS (int)(sizeof funcs / sizeof *funcs)

/* Calls function k on x; direct calls except where the point is a pointer. */
static uint64_t call(int k, uint64_t x)
{
	switch (k) {
	case 0: return p_adr(x);
	case 1: return p_adrp(x);
	case 2: return p_ldr_x(x);
	case 3: return p_ldr_w(x);
	case 4: return p_ldrsw(x);
	case 5: return p_prfm(x);
	case 6: return p_ldr_d(x);
	case 7: return p_ldr_q(x);
	case 8: return p_b(x);
	case 9: return call_p_bl(x);
	case 10: return call_p_bcond(x);
	case 11: return p_cbz(x, x & 1);
	case 12: return p_cbnz(x, x & 2);
	case 13: return p_tbz(x);
	case 14: return p_tbnz(x);
	case 15: return call_p_blr(x);
	case 16: return p_ret(x);
	case 17: return indirect_bti(x);
	case 18: return indirect_pac(x);
	default: return p_self(x);
	}
}

/* What function k computes. */
static uint64_t reference(int k, uint64_t x)
{
	switch (k) {
	case 0: return x + K1;
	case 1: return x ^ K2;
	case 2: return x + K1;
	case 3: return x + K3;
	case 4: return x + (uint64_t)(int64_t)(int32_t)K3;
	case 5: return x + 7;
	case 6: return x ^ K1;
	case 7: return x + K4_HIGH;
	case 8: return x + 3;
	case 9: return x + 11;
	case 10: return (x & 1) ? x - 100 : x + 100;
	case 11: return (x & 1) ? x + 1 : x + 2;
	case 12: return (x & 2) ? x ^ 0xf0 : x ^ 0xff;
	case 13: return (x & 2) ? x + 5 : x - 5;
	case 14: return (x & 4) ? x >> 1 : x << 1;
	case 15: return x + 11;
	case 16: return x;
	case 17: return x + K2;
	case 18: return x + 11;
	default: return x + 17;
	}
}

static atomic_int checksum_failed;

struct job {
	pthread_t thread;
	int k;
	uint64_t n, seed;
	int ok;
};

static void *job_main(void *arg)
{
	struct job *j = arg;
	uint64_t got = 0, want = 0;
	for (uint64_t i = 0; i < j->n; i++) {
		got += call(j->k, j->seed + i);
		want += reference(j->k, j->seed + i);
	}
	atomic_fetch_add(&funcs[j->k].calls, j->n);
	j->ok = got == want;
	if (!j->ok)
		atomic_store(&checksum_failed, 1);
	return NULL;
}

#ifdef TP_BTI
static fn1 volatile indirect_canary = tp_bti_canary;
static sigjmp_buf bti_jump;

static void on_sigill(int sig)
{
	siglongjmp(bti_jump, sig);
}

/* Guards this program's assembly pages with BTI and checks that an indirect
 * call to code without a landing pad faults there. Exits if it does not. */
static void guard_with_bti(void)
{
	size_t len = (size_t)(tp_guarded_end - tp_guarded_start);
	if (mprotect(tp_guarded_start, len, PROT_READ | PROT_EXEC | PROT_BTI) != 0) {
		printf("error mprotect(PROT_BTI): %s (HWCAP2_BTI=%lu)\n", strerror(errno),
		       (unsigned long)(getauxval(AT_HWCAP2) >> 17 & 1));
		exit(2);
	}
	signal(SIGILL, on_sigill);
	if (sigsetjmp(bti_jump, 1) == 0) {
		indirect_canary(0);
		printf("error BTI is not enforced: an indirect call without a landing pad returned\n");
		exit(2);
	}
	signal(SIGILL, SIG_DFL);
	if (indirect_bti(0) != K2 || indirect_pac(0) != 11) {
		printf("error landing-pad functions give wrong results\n");
		exit(2);
	}
}
#endif

#define CROWD_REACH (129ull << 20)
#define GROWTH_ROOM (256ull << 20)

/* See "crowd" above; returns the KiB reserved, or -1. */
static long long crowd(void)
{
	char exe[512], line[1024], path[512];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	FILE *maps = fopen("/proc/self/maps", "r");
	if (n < 0 || !maps)
		return -1;
	exe[n] = 0;
	struct { unsigned long long start, end; char kind; } m[512];
	int count = 0;
	unsigned long long lo = ~0ull, hi = 0;
	while (count < 512 && fgets(line, sizeof line, maps)) {
		path[0] = 0;
		if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %511s", &m[count].start, &m[count].end, path) < 2)
			continue;
		m[count].kind = strcmp(path, "[heap]") == 0 ? 'h' : strcmp(path, "[stack]") == 0 ? 's' : 0;
		if (strcmp(path, exe) == 0) {
			lo = m[count].start < lo ? m[count].start : lo;
			hi = m[count].end > hi ? m[count].end : hi;
		}
		count++;
	}
	fclose(maps);
	if (hi == 0)
		return -1;
	unsigned long long from = lo > CROWD_REACH + 0x10000 ? lo - CROWD_REACH : 0x10000, to = hi + CROWD_REACH;
	long long reserved = 0;
	unsigned long long prev_end = 0x10000;
	char prev_kind = 0;
	for (int i = 0; i <= count; i++) {
		unsigned long long start = i < count ? m[i].start : to;
		char next_kind = i < count ? m[i].kind : 0;
		unsigned long long a = prev_end > from ? prev_end : from, b = start < to ? start : to;
		/* Leave the heap and the stack room to grow, as tp does. */
		if (prev_kind == 'h' && a < prev_end + GROWTH_ROOM)
			a = prev_end + GROWTH_ROOM;
		if (next_kind == 's' && b > start - GROWTH_ROOM)
			b = start - GROWTH_ROOM;
		if (a < b) {
			void *p = mmap((void *)a, b - a, PROT_NONE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
			if (p != (void *)a)
				return -1;
			reserved += (long long)((b - a) >> 10);
		}
		if (i < count) {
			prev_end = m[i].end > prev_end ? m[i].end : prev_end;
			prev_kind = m[i].kind;
		}
	}
	return reserved;
}

int main(void)
{
	char line[256];
#ifdef TP_BTI
	guard_with_bti();
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("bti enforced on %p-%p\n", (void *)tp_guarded_start, (void *)tp_guarded_end);
#endif
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		char name[32] = "";
		unsigned long long n = 0;
		int t = 1, k;
		if (sscanf(line, "call %31s %llu %d", name, &n, &t) >= 2) {
			for (k = 0; k < NFUNCS && strcmp(funcs[k].name, name) != 0; k++)
				;
			if (k == NFUNCS) {
				printf("error unknown function: %s\n", name);
				continue;
			}
			if (t < 1 || t > 64) t = 1;
			struct job jobs[64];
			for (int i = 0; i < t; i++) {
				jobs[i] = (struct job){.k = k, .n = n, .seed = ((uint64_t)i << 32) + 12345};
				pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]);
			}
			int ok = 1;
			for (int i = 0; i < t; i++) {
				pthread_join(jobs[i].thread, NULL);
				ok &= jobs[i].ok;
			}
			printf("done %s calls=%llu checksum=%s\n", name, n * (unsigned long long)t, ok ? "ok" : "BAD");
		} else if (strcmp(line, "crowd") == 0) {
			printf("crowded kib=%lld\n", crowd());
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return atomic_load(&checksum_failed) ? 1 : 0;
}
