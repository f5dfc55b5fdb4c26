/* blocked: threads that spend their lives blocked in syscalls, each checking
 * that nothing a tracer does is visible to it: no EINTR, no short sleep, no
 * lost wake-up. Every syscall is made raw (no libc retry loop) so the
 * program sees exactly what the kernel returns.
 *
 * Threads, each in a loop:
 *   read     read(2) of one byte from a pipe
 *   sleep    clock_nanosleep(2) of 100 ms, checked against CLOCK_MONOTONIC
 *   futex    FUTEX_WAIT on a word until it changes
 *   accept   accept(2) on a listening AF_UNIX socket (abstract name)
 *   epoll    epoll_wait(2), no timeout, on an eventfd (epoll_pwait(2)
 *            with no signal mask where there is no epoll_wait: AArch64)
 *   waitpid  wait4(2) for a child blocked reading a pipe
 * The main thread blocks in read(2) on stdin for commands.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   blocked  -> "blocked" once every thread is inside its blocking syscall
 *              (checked in /proc/self/task/TID/syscall)
 *   wake     wakes each waiting thread once and waits until each has
 *            counted the wake-up -> "woken read=N futex=N accept=N epoll=N
 *            waitpid=N sleeps=N errors=N"
 *   tids     -> "tids epoll=TID"
 *   signals  -> "signals handled=H epoll_eintr=E": SIGUSR1 handler runs
 *              (installed without SA_RESTART), and epoll_wait EINTRs that
 *              came with one (the program's own, so not errors)
 *   quit     -> exit status 0, or 1 if any check failed
 * command_seen() is called once per command: a function to probe.
 * Each failed check prints "error THREAD: what" on stdout at once.
 */
#include "common.h"

#include <errno.h>
#include <stddef.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#ifdef SYS_epoll_wait
#define SYS_EPOLL SYS_epoll_wait
#else
#define SYS_EPOLL SYS_epoll_pwait
#endif

enum { T_READ, T_SLEEP, T_FUTEX, T_ACCEPT, T_EPOLL, T_WAITPID, NTHREADS };
static const char *names[NTHREADS] = {"read", "sleep", "futex", "accept", "epoll", "waitpid"};
/* The syscall each thread blocks in, as /proc/.../syscall reports it. */
static const long blocking_nr[NTHREADS] = {SYS_read,   SYS_clock_nanosleep, SYS_futex,
					   SYS_accept, SYS_EPOLL,           SYS_wait4};

static atomic_long done[NTHREADS];
static atomic_int errors;
static atomic_int tids[NTHREADS];
static int pipe_fds[2];
static atomic_int futex_word;
static int listen_fd;
static struct sockaddr_un listen_addr;
static socklen_t listen_len;
static int epoll_fd, event_fd;
static int child_pipe[2];
/* SIGUSR1 handler runs (installed without SA_RESTART), and the EINTRs the
 * epoll thread saw with a handler run: those are the program's own. */
static atomic_long handled, epoll_eintr_after_handler;

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&handled, 1);
}

static void fail(int t, const char *what, long rc)
{
	atomic_fetch_add(&errors, 1);
	printf("error %s: %s (rc=%ld errno=%d)\n", names[t], what, rc, rc < 0 ? (int)-rc : 0);
}

static long sys(long nr, long a, long b, long c, long d, long e, long f)
{
	long rc = syscall(nr, a, b, c, d, e, f);
	return rc < 0 ? -errno : rc;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *thread_main(void *arg)
{
	int t = (int)(uintptr_t)arg;
	atomic_store(&tids[t], (int)gettid());
	for (;;) {
		long rc;
		switch (t) {
		case T_READ: {
			char c;
			rc = sys(SYS_read, pipe_fds[0], (long)&c, 1, 0, 0, 0);
			if (rc != 1 || c != 'w')
				fail(t, "read did not return the byte written", rc);
			break;
		}
		case T_SLEEP: {
			struct timespec req = {0, 100 * 1000 * 1000};
			uint64_t start = now_ns();
			rc = sys(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&req, 0, 0, 0);
			uint64_t slept = now_ns() - start;
			if (rc != 0)
				fail(t, "clock_nanosleep failed", rc);
			else if (slept < 100 * 1000 * 1000)
				fail(t, "slept short", (long)slept);
			break;
		}
		case T_FUTEX: {
			int seen = atomic_load(&futex_word);
			do {
				rc = sys(SYS_futex, (long)&futex_word, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
				if (rc != 0 && rc != -EAGAIN) {
					fail(t, "FUTEX_WAIT failed", rc);
					break;
				}
			} while (atomic_load(&futex_word) == seen);
			break;
		}
		case T_ACCEPT: {
			rc = sys(SYS_accept, listen_fd, 0, 0, 0, 0, 0);
			if (rc < 0)
				fail(t, "accept failed", rc);
			else
				close((int)rc);
			break;
		}
		case T_EPOLL: {
			struct epoll_event ev;
			long handled_before = atomic_load(&handled);
			rc = sys(SYS_EPOLL, epoll_fd, (long)&ev, 1, -1, 0, 0);
			if (rc == -EINTR && atomic_load(&handled) != handled_before) {
				/* A signal handler ran: EINTR is what the program asked for. */
				atomic_fetch_add(&epoll_eintr_after_handler, 1);
				continue;
			}
			if (rc != 1) {
				fail(t, "epoll_wait did not return the event", rc);
			} else {
				uint64_t n;
				if (read(event_fd, &n, sizeof n) != sizeof n)
					fail(t, "eventfd read failed", -errno);
			}
			break;
		}
		case T_WAITPID: {
			pid_t child = fork();
			if (child == 0) {
				/* Dies with the target, whatever kills it. */
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() == 1)
					_exit(4);
				char c;
				_exit(read(child_pipe[0], &c, 1) == 1 ? 0 : 3);
			}
			int status = 0;
			rc = sys(SYS_wait4, child, (long)&status, 0, 0, 0, 0);
			if (rc != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
				fail(t, "wait4 did not reap the child", rc);
			break;
		}
		}
		atomic_fetch_add(&done[t], 1);
	}
	return NULL;
}

/* Probe-able: the main thread calls it once per command. */
TP_PROBED long command_seen(char c)
{
	static long n;
	return n += c;
}

/* The syscall number thread t is in right now, or -1 if it runs. */
static long in_syscall(int t)
{
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", atomic_load(&tids[t]));
	FILE *f = fopen(path, "r");
	if (!f)
		return -2;
	long nr = -1;
	if (fgets(buf, sizeof buf, f))
		nr = strtol(buf, NULL, 10);
	fclose(f);
	return nr;
}

/* Waits until every thread is blocked in its syscall; 0 on timeout. */
static int wait_blocked(void)
{
	for (int tries = 0; tries < 60000; tries++) {
		int all = 1;
		for (int t = 0; t < NTHREADS; t++)
			if (atomic_load(&tids[t]) == 0 || in_syscall(t) != blocking_nr[t])
				all = 0;
		if (all)
			return 1;
		usleep(1000);
	}
	return 0;
}

/* Wakes each waiting thread once; waits until each counted it. */
static int wake(void)
{
	long before[NTHREADS];
	for (int t = 0; t < NTHREADS; t++)
		before[t] = atomic_load(&done[t]);
	if (write(pipe_fds[1], "w", 1) != 1)
		return 0;
	atomic_fetch_add(&futex_word, 1);
	syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&listen_addr, listen_len) != 0)
		return 0;
	close(c);
	uint64_t one = 1;
	if (write(event_fd, &one, sizeof one) != sizeof one)
		return 0;
	if (write(child_pipe[1], "w", 1) != 1)
		return 0;
	/* Bounded wait (60 s): a lost wake-up shows as a count that never moves. */
	for (int tries = 0; tries < 60000; tries++) {
		int all = 1;
		for (int t = 0; t < NTHREADS; t++)
			if (t != T_SLEEP && atomic_load(&done[t]) != before[t] + 1)
				all = 0;
		if (all)
			return 1;
		usleep(1000);
	}
	return 0;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (pipe(pipe_fds) || pipe(child_pipe))
		return 2;
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	listen_addr.sun_family = AF_UNIX;
	/* Abstract name: no file anywhere. */
	int n = snprintf(listen_addr.sun_path + 1, sizeof listen_addr.sun_path - 1, "tp-blocked-%d", (int)getpid());
	listen_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
	if (bind(listen_fd, (struct sockaddr *)&listen_addr, listen_len) || listen(listen_fd, 16))
		return 2;
	epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	event_fd = eventfd(0, EFD_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN};
	if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, event_fd, &ev))
		return 2;
	for (int t = 0; t < NTHREADS; t++) {
		pthread_t th;
		pthread_create(&th, NULL, thread_main, (void *)(uintptr_t)t);
	}
	struct sigaction sa = {.sa_handler = on_usr1};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	tp_ready();

	/* Commands, read with raw read(2) so EINTR on stdin is seen too. */
	char line[256];
	size_t len = 0;
	for (;;) {
		long rc = sys(SYS_read, 0, (long)(line + len), 1, 0, 0, 0);
		if (rc == 0)
			break;
		if (rc < 0) {
			atomic_fetch_add(&errors, 1);
			printf("error main: read of stdin failed (rc=%ld)\n", rc);
			continue;
		}
		if (line[len] != '\n' && len + 1 < sizeof line) {
			len++;
			continue;
		}
		line[len] = 0;
		len = 0;
		command_seen(line[0]);
		if (strcmp(line, "blocked") == 0) {
			printf(wait_blocked() ? "blocked\n" : "error main: threads never blocked\n");
		} else if (strcmp(line, "wake") == 0) {
			if (!wake()) {
				atomic_fetch_add(&errors, 1);
				printf("error main: a wake-up was lost\n");
			}
			printf("woken read=%ld futex=%ld accept=%ld epoll=%ld waitpid=%ld sleeps=%ld errors=%d\n",
			       atomic_load(&done[T_READ]), atomic_load(&done[T_FUTEX]), atomic_load(&done[T_ACCEPT]),
			       atomic_load(&done[T_EPOLL]), atomic_load(&done[T_WAITPID]), atomic_load(&done[T_SLEEP]),
			       atomic_load(&errors));
		} else if (strcmp(line, "tids") == 0) {
			printf("tids epoll=%d\n", atomic_load(&tids[T_EPOLL]));
		} else if (strcmp(line, "signals") == 0) {
			printf("signals handled=%ld epoll_eintr=%ld\n", atomic_load(&handled),
			       atomic_load(&epoll_eintr_after_handler));
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return atomic_load(&errors) ? 1 : 0;
}
