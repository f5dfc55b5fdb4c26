/* forker: a process that forks while return probes are live, so that the
 * parent and every child return through the same probed frames, each
 * checking every result.
 *
 *   forker        interactive (see common.h): prints "ready pid=P", then
 *     forks N [P] N times (P µs apart): level(DEPTH) recurses through the probed `level`
 *                 down to the probed `spawn`, which forks; the parent and
 *                 the child each return through spawn and every level
 *                 frame (live at the fork), then the child calls work W
 *                 times on its main thread and W times on a thread of its
 *                 own and exits 0 if every result held, the parent waits
 *                 for it. -> "done forks=N children_ok=K calls=C work=W
 *                 checksum=ok|BAD" (C: the parent's calls of `level`,
 *                 which every child returns through too)
 *     spin        a thread calls work every 100 µs from now on (a thread
 *                 the children do not have) -> "spinning"
 *     stop        stops that thread -> "stopped spins=S checksum=ok|BAD"
 *     doomed SIG  forks a child (in `level` frames, as `forks`) that
 *                 returns through them, then dies of signal SIG
 *                 -> "reaped pid=P signal=SIG"
 *     foreign N   a new thread calls work N times with its thread pointer
 *                 (the FS base; AArch64: TPIDR_EL0) moved to a block of
 *                 zeros, as Go's threads run (no glibc TCB there, no TID
 *                 where glibc keeps it) -> "foreign tid=T calls=N
 *                 checksum=ok|BAD"
 *     exec PATH   execs PATH with no arguments
 *     die SIG     dies of signal SIG (its default action)
 *     quit        -> exit status 0 (after the spinning thread stops)
 */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#define DEPTH 3
#define WORK 50

static volatile int stop_spinning;
static volatile int spin_ok = 1;
static volatile unsigned long long spins;

TP_PROBED uint64_t work(uint64_t x)
{
	return x * 0x9e3779b97f4a7c15ull + 7;
}

static inline uint64_t work_ref(uint64_t x)
{
	return x * 0x9e3779b97f4a7c15ull + 7;
}

static int works(uint64_t seed)
{
	int ok = 1;
	for (uint64_t i = 0; i < WORK; i++)
		ok &= work(seed + i) == work_ref(seed + i);
	return ok;
}

static void *child_thread(void *arg)
{
	return (void *)(intptr_t)works((uint64_t)(intptr_t)arg);
}

/* The child's life after its fork: its own calls on two threads. */
static int child_work(uint64_t seed)
{
	int ok = works(seed);
	pthread_t t;
	void *res = 0;
	if (pthread_create(&t, NULL, child_thread, (void *)(intptr_t)(seed + 1000)) != 0)
		return 0;
	pthread_join(t, &res);
	return ok && (intptr_t)res;
}

/* Forks; returns the child's PID in the parent, 0 in the child, as fork
 * does, plus a value both check on the way back up. */
TP_PROBED uint64_t spawn(uint64_t x, pid_t *child)
{
	*child = fork();
	return x + 1;
}

/* Recursion the compiler cannot turn into a loop: the result is mixed
 * after the call returns. */
TP_PROBED uint64_t level(int depth, uint64_t x, pid_t *child)
{
	uint64_t r = depth == 0 ? spawn(x, child) : level(depth - 1, x + (uint64_t)depth, child);
	return r ^ (r >> 7) ^ (uint64_t)depth;
}

static uint64_t level_ref(int depth, uint64_t x)
{
	uint64_t r = depth == 0 ? x + 1 : level_ref(depth - 1, x + (uint64_t)depth);
	return r ^ (r >> 7) ^ (uint64_t)depth;
}

#if defined(__x86_64__) || defined(__aarch64__)
#ifdef __x86_64__
/* The FS base, through the kernel (no libc: nothing here may touch TLS). */
static inline uint64_t fs_base(void)
{
	uint64_t v = 0, ret;
	__asm__ volatile("syscall" : "=a"(ret) : "0"(158ull), "D"(0x1003ull), "S"(&v) : "rcx", "r11", "memory");
	return v;
}

static inline void set_fs_base(uint64_t v)
{
	uint64_t ret;
	__asm__ volatile("syscall" : "=a"(ret) : "0"(158ull), "D"(0x1002ull), "S"(v) : "rcx", "r11", "memory");
}
#else
/* TPIDR_EL0, which user space reads and writes itself. */
static inline uint64_t fs_base(void)
{
	uint64_t v;
	__asm__ volatile("mrs %0, tpidr_el0" : "=r"(v));
	return v;
}

static inline void set_fs_base(uint64_t v)
{
	__asm__ volatile("msr tpidr_el0, %0" : : "r"(v) : "memory");
}
#endif

/* A thread's TLS as Go sets it up: a block of its own, its first word 0. */
static uint64_t foreign_tls[1024] __attribute__((aligned(64)));

struct foreign {
	uint64_t n;
	int ok;
	long tid;
};

/* Runs with the FS base moved: no libc call, no stack protector. */
__attribute__((noinline, optimize("no-stack-protector"))) static int foreign_calls(uint64_t n)
{
	int ok = 1;
	uint64_t saved = fs_base();
	set_fs_base((uint64_t)(foreign_tls + 512));
	for (uint64_t i = 0; i < n; i++)
		ok &= work(i) == work_ref(i);
	set_fs_base(saved);
	return ok;
}

static void *foreign_thread(void *arg)
{
	struct foreign *f = arg;
	f->tid = gettid();
	f->ok = foreign_calls(f->n);
	return NULL;
}
#endif

static void *spinner(void *arg)
{
	(void)arg;
	for (uint64_t i = 0; !stop_spinning; i++) {
		if (work(i) != work_ref(i))
			spin_ok = 0;
		spins = i + 1;
		usleep(100);
	}
	return NULL;
}

int main(void)
{
	char line[4200];
	pthread_t spin_thread;
	int spinning = 0;
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		unsigned long long n = 0, pause = 0;
		int sig = 0;
		char path[4096];
		if (sscanf(line, "forks %llu %llu", &n, &pause) >= 1) {
			int ok = 1;
			unsigned long long children_ok = 0, calls = 0;
			for (unsigned long long i = 0; i < n; i++) {
				pid_t child = -1;
				uint64_t got = level(DEPTH, i, &child);
				calls += DEPTH + 1;
				if (child == 0) {
					int good = got == level_ref(DEPTH, i) && child_work(i);
					_exit(good ? 0 : 1);
				}
				ok &= got == level_ref(DEPTH, i);
				int status = 0;
				if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
				    WEXITSTATUS(status) == 0)
					children_ok++;
				else if (child > 0 && WIFSIGNALED(status))
					printf("child %d died of signal %d\n", (int)child, WTERMSIG(status));
				if (pause)
					usleep(pause);
			}
			ok &= spin_ok;
			printf("done forks=%llu children_ok=%llu calls=%llu work=%d checksum=%s\n", n, children_ok,
			       calls, WORK, ok ? "ok" : "BAD");
		} else if (strcmp(line, "spin") == 0 && !spinning) {
			stop_spinning = 0;
			spinning = pthread_create(&spin_thread, NULL, spinner, NULL) == 0;
			printf("spinning\n");
		} else if (strcmp(line, "stop") == 0) {
			if (spinning) {
				stop_spinning = 1;
				pthread_join(spin_thread, NULL);
				spinning = 0;
			}
			printf("stopped spins=%llu checksum=%s\n", spins, spin_ok ? "ok" : "BAD");
		} else if (sscanf(line, "doomed %d", &sig) == 1) {
			pid_t child = -1;
			uint64_t got = level(DEPTH, 1, &child);
			if (child == 0) {
				signal(sig, SIG_DFL);
				raise(sig);
				_exit(got == level_ref(DEPTH, 1) ? 0 : 1);
			}
			int status = 0;
			waitpid(child, &status, 0);
			printf("reaped pid=%d signal=%d\n", (int)child, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
		} else if (sscanf(line, "foreign %llu", &n) == 1) {
#if defined(__x86_64__) || defined(__aarch64__)
			struct foreign f = {n, 0, 0};
			pthread_t t;
			if (pthread_create(&t, NULL, foreign_thread, &f) == 0)
				pthread_join(t, NULL);
			printf("foreign tid=%ld calls=%llu checksum=%s\n", f.tid, n, f.ok ? "ok" : "BAD");
#else
			printf("foreign unsupported\n");
#endif
		} else if (sscanf(line, "exec %4095s", path) == 1) {
			char *args[] = {path, NULL};
			execv(path, args);
			printf("error exec %s\n", path);
		} else if (sscanf(line, "die %d", &sig) == 1) {
			fflush(NULL);
			signal(sig, SIG_DFL);
			raise(sig);
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	if (spinning) {
		stop_spinning = 1;
		pthread_join(spin_thread, NULL);
	}
	return spin_ok ? 0 : 1;
}
