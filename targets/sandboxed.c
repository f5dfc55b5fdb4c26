/* sandboxed: a program that installs a seccomp filter on itself, as
 * sandboxed servers do, before it reports ready; tests/e2e/seccomp.rs
 * attaches to it.
 *
 *   sandboxed MODE
 *
 * MODE is the filter, installed with NO_NEW_PRIVS on the main thread
 * (which any thread started later inherits):
 *   kill-memfd       memfd_create kills the process (KILL_PROCESS)
 *   errno-memfd      memfd_create fails with EPERM
 *   kill-mmap-exec   mmap with PROT_EXEC kills the process
 *   errno-mmap-exec  mmap with PROT_EXEC fails with EPERM
 *   trap-munmap      munmap raises SIGSYS (TRAP)
 *   errno-mmap-fd    mmap of a file descriptor other than 0 (and -1,
 *                    anonymous) fails with EACCES: tp learns the memfd's
 *                    descriptor only once it exists
 *   kill-gettid      gettid kills the process: tp's remote calls pass, its
 *                    runtime's (events, return probes) would not
 *   kill-process-vm-readv  process_vm_readv kills the process: tp's
 *                    runtime makes it only for --if on strings
 *   thread-kill-gettid  only a second thread, started before the ready
 *                    line and blocked until quit, has a filter, which
 *                    kills the process on gettid; the main thread has none
 *   errno-runtime    kill fails with EPERM, and so does arch_prctl where
 *                    there is one: errors tp's runtime goes on from
 *   errno-exit-group exit_group fails with EPERM (glibc's _exit goes on to
 *                    exit each thread): tp's runtime could not end a process
 *                    whose return address it lost (return probes that
 *                    replace return addresses)
 *   allow            everything tp needs runs: close is logged (LOG),
 *                    reboot kills, the rest is allowed; a second filter
 *                    answers ERRNO for kexec_load
 *   strict           seccomp strict mode (only read, write, exit and
 *                    sigreturn), after the ready line
 *   none             no filter
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call work N      calls work(x) for x = 1..N -> "done work calls=N checksum=ok|BAD"
 *   ping             -> "pong"
 *   quit             exit status 0 (in strict mode by the exit syscall)
 * In strict mode the commands are read and answered with raw read and
 * write syscalls, as nothing else is allowed.
 */
#include "common.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif

TP_PROBED uint64_t work(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 31);
}

static uint64_t work_ref(uint64_t x)
{
	return (x * 0x9e3779b97f4a7c15ull) ^ (x >> 31);
}

#define LD(field) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, field))
#define LD_ARG_LO(n) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[n]))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
/* The arch check every real filter starts with: a foreign ABI is killed. */
#define ARCH_CHECK LD(arch), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0), RET(SECCOMP_RET_KILL_PROCESS)

static void install(struct sock_filter *f, unsigned short len)
{
	struct sock_fprog prog = {len, f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
		perror("seccomp");
		exit(2);
	}
}

/* Answers `ret` for syscall `nr`, allows the rest. */
static void deny(long nr, unsigned ret)
{
	struct sock_filter f[] = {
		ARCH_CHECK,
		LD(nr),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
		RET(ret),
		RET(SECCOMP_RET_ALLOW),
	};
	install(f, sizeof f / sizeof *f);
}

/* Answers `ret` for mmap with PROT_EXEC, allows the rest. */
static void deny_mmap_exec(unsigned ret)
{
	struct sock_filter f[] = {
		ARCH_CHECK,
		LD(nr),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 3),
		LD_ARG_LO(2),
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
		RET(ret),
		RET(SECCOMP_RET_ALLOW),
	};
	install(f, sizeof f / sizeof *f);
}

/* EACCES for mmap of a descriptor that is neither 0 nor -1. */
static void deny_mmap_fd(void)
{
	struct sock_filter f[] = {
		ARCH_CHECK,
		LD(nr),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 4),
		LD_ARG_LO(4),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
		RET(SECCOMP_RET_ERRNO | EACCES),
		RET(SECCOMP_RET_ALLOW),
	};
	install(f, sizeof f / sizeof *f);
}

static void allow_what_tp_needs(void)
{
	struct sock_filter f[] = {
		ARCH_CHECK,
		LD(nr),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_close, 0, 1),
		RET(SECCOMP_RET_LOG),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_reboot, 0, 1),
		RET(SECCOMP_RET_KILL_PROCESS),
		RET(SECCOMP_RET_ALLOW),
	};
	install(f, sizeof f / sizeof *f);
	deny(SYS_kexec_load, SECCOMP_RET_ERRNO | EPERM);
}

/* EPERM for kill and arch_prctl, the rest allowed. */
static void deny_runtime_errors(void)
{
	deny(SYS_kill, SECCOMP_RET_ERRNO | EPERM);
#ifdef SYS_arch_prctl
	deny(SYS_arch_prctl, SECCOMP_RET_ERRNO | EPERM);
#endif
}

static pthread_mutex_t filtered_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t filtered_cond = PTHREAD_COND_INITIALIZER;
static int filtered;

/* The second thread of thread-kill-gettid: installs its own filter (no
 * TSYNC: the main thread keeps none), says so, and sleeps until the
 * process exits. */
static void *filtered_thread(void *arg)
{
	(void)arg;
	deny(SYS_gettid, SECCOMP_RET_KILL_PROCESS);
	pthread_mutex_lock(&filtered_lock);
	filtered = 1;
	pthread_cond_signal(&filtered_cond);
	pthread_mutex_unlock(&filtered_lock);
	for (;;)
		pause();
	return NULL;
}

static void start_filtered_thread(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, filtered_thread, NULL) != 0) {
		perror("pthread_create");
		exit(2);
	}
	pthread_mutex_lock(&filtered_lock);
	while (!filtered)
		pthread_cond_wait(&filtered_cond, &filtered_lock);
	pthread_mutex_unlock(&filtered_lock);
}

/* Strict mode: raw read and write only, and exit (not exit_group). */
static void strict_loop(void)
{
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0) != 0) {
		perror("strict");
		exit(2);
	}
	char c, line[64];
	size_t n = 0;
	for (;;) {
		if (syscall(SYS_read, 0, &c, 1) != 1)
			break;
		if (c != '\n') {
			if (n < sizeof line - 1)
				line[n++] = c;
			continue;
		}
		line[n] = 0;
		n = 0;
		if (strcmp(line, "ping") == 0)
			syscall(SYS_write, 1, "pong\n", 5);
		else if (strcmp(line, "quit") == 0)
			break;
	}
	syscall(SYS_exit, 0);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "none";
	if (strcmp(mode, "kill-memfd") == 0)
		deny(SYS_memfd_create, SECCOMP_RET_KILL_PROCESS);
	else if (strcmp(mode, "errno-memfd") == 0)
		deny(SYS_memfd_create, SECCOMP_RET_ERRNO | EPERM);
	else if (strcmp(mode, "kill-mmap-exec") == 0)
		deny_mmap_exec(SECCOMP_RET_KILL_PROCESS);
	else if (strcmp(mode, "errno-mmap-exec") == 0)
		deny_mmap_exec(SECCOMP_RET_ERRNO | EPERM);
	else if (strcmp(mode, "trap-munmap") == 0)
		deny(SYS_munmap, SECCOMP_RET_TRAP);
	else if (strcmp(mode, "errno-mmap-fd") == 0)
		deny_mmap_fd();
	else if (strcmp(mode, "kill-gettid") == 0)
		deny(SYS_gettid, SECCOMP_RET_KILL_PROCESS);
	else if (strcmp(mode, "kill-process-vm-readv") == 0)
		deny(SYS_process_vm_readv, SECCOMP_RET_KILL_PROCESS);
	else if (strcmp(mode, "thread-kill-gettid") == 0)
		start_filtered_thread();
	else if (strcmp(mode, "errno-runtime") == 0)
		deny_runtime_errors();
	else if (strcmp(mode, "errno-exit-group") == 0)
		deny(SYS_exit_group, SECCOMP_RET_ERRNO | EPERM);
	else if (strcmp(mode, "allow") == 0)
		allow_what_tp_needs();
	else if (strcmp(mode, "strict") != 0 && strcmp(mode, "none") != 0) {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	tp_ready();
	if (strcmp(mode, "strict") == 0)
		strict_loop();
	char line[256];
	int failed = 0;
	while (tp_read_command(line, sizeof line)) {
		unsigned long long n = 0;
		if (sscanf(line, "call work %llu", &n) == 1) {
			int ok = 1;
			for (uint64_t x = 1; x <= n; x++)
				ok &= work(x) == work_ref(x);
			failed |= !ok;
			printf("done work calls=%llu checksum=%s\n", n, ok ? "ok" : "BAD");
		} else if (strcmp(line, "ping") == 0) {
			printf("pong\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	return failed;
}
