/* interrupted: a thread held in a signal handler that interrupted it inside
 * a function's first bytes (x86-64 only).
 *
 * stops_inside(p) begins `push rbx; mov rax, [rdi]`: given NULL, its load
 * faults, so the thread takes SIGSEGV with its PC one byte into the
 * function, inside any window a 5-byte jump needs (an implicit null check,
 * as JVMs make them). The kernel saves that PC in the signal frame on the
 * thread's stack; the handler points rdi at the answer, and its return
 * runs the load again. While the handler waits, tp must leave stops_inside
 * unpatched, or the thread would resume in the middle of the jump.
 *
 * Interactive (see common.h): prints "ready pid=P", then
 *   block   calls stops_inside(NULL): the handler prints "inside", waits
 *           for a line "go", and points rdi at 42; prints
 *           "returned V ok|BAD" (V must be 42)
 *   call N  calls foo and stops_inside(&answer) N times each ->
 *           "done calls=N checksum=ok|BAD"
 *   quit    -> exit status 0
 */
#include "common.h"

#include <signal.h>
#include <ucontext.h>

uint64_t stops_inside(const uint64_t *p);
__asm__(".text\n"
	".globl stops_inside\n"
	".type stops_inside, @function\n"
	".p2align 4\n"
	"stops_inside:\n"
	"	push %rbx\n"
	"	mov (%rdi), %rax\n"
	"	pop %rbx\n"
	"	ret\n"
	".size stops_inside, . - stops_inside\n");

TP_PROBED uint64_t foo(uint64_t x)
{
	return x * 2654435761u + 11;
}

static const uint64_t answer = 42;

/* Points rdi at the answer, after a line "go". */
static void on_segv(int sig, siginfo_t *info, void *uc_)
{
	(void)sig;
	(void)info;
	ucontext_t *uc = uc_;
	char c;
	static const char inside[] = "inside\n";
	(void)!write(1, inside, sizeof inside - 1);
	/* The line "go" with raw reads: stdio is not for handlers. */
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	uc->uc_mcontext.gregs[REG_RDI] = (greg_t)&answer;
}

int main(void)
{
	char line[128];
	struct sigaction sa = {0};
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigaction(SIGSEGV, &sa, NULL);
	/* Raw reads in the handler and fgets here share stdin: no buffering. */
	setvbuf(stdin, NULL, _IONBF, 0);
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		if (strcmp(line, "block") == 0) {
			uint64_t v = stops_inside(NULL);
			printf("returned %llu %s\n", (unsigned long long)v, v == 42 ? "ok" : "BAD");
		} else if (strncmp(line, "call ", 5) == 0) {
			uint64_t n = strtoull(line + 5, NULL, 10);
			int ok = 1;
			for (uint64_t i = 0; i < n; i++) {
				ok &= foo(i) == i * 2654435761u + 11;
				ok &= stops_inside(&answer) == 42;
			}
			printf("done calls=%llu checksum=%s\n", (unsigned long long)n, ok ? "ok" : "BAD");
		} else if (strcmp(line, "quit") == 0) {
			return 0;
		}
	}
	return 0;
}
