/* jitted: code in anonymous executable memory, as a JIT compiler makes it,
 * that calls a probe-able function: stacks through it name it only by the
 * perf map (/tmp/perf-PID.map) a test writes for it. Built with frame
 * pointers; the copied code keeps the frame record chain too.
 *
 * Commands (each answer is one line):
 *   where        -> "code at=0xADDR size=N" (the copied code)
 *   calls N      N calls of leaf() from the copied code, called by
 *                run_jitted -> "done calls N"
 *   quit
 */
#include "common.h"

#include <sys/mman.h>

TP_PROBED long leaf(void)
{
	return 7;
}

/* The copied code: a function of one argument that sets up a frame record
 * and calls the function it is given. */
#if defined(__x86_64__)
static const unsigned char stub[] = {
	0x55,             /* push frame pointer */
	0x48, 0x89, 0xe5, /* frame pointer = stack pointer */
	0xff, 0xd7,       /* call the first argument */
	0x5d,             /* pop frame pointer */
	0xc3,             /* return */
};
#elif defined(__aarch64__)
static const uint32_t stub[] = {
	0xa9bf7bfd, /* stp x29, x30, [sp, #-16]! */
	0x910003fd, /* mov x29, sp */
	0xd63f0000, /* blr x0 */
	0xa8c17bfd, /* ldp x29, x30, [sp], #16 */
	0xd65f03c0, /* ret */
};
#else
#error "jitted: no code for this architecture"
#endif

typedef long (*caller_fn)(long (*)(void));

static caller_fn jit;
static volatile long sink;

TP_PROBED __attribute__((optimize("no-optimize-sibling-calls"))) void run_jitted(long n)
{
	for (long i = 0; i < n; i++)
		sink += jit(leaf);
}

int main(void)
{
	long page = sysconf(_SC_PAGESIZE);
	void *code = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (code == MAP_FAILED)
		return 1;
	memcpy(code, stub, sizeof stub);
	__builtin___clear_cache((char *)code, (char *)code + sizeof stub);
	if (mprotect(code, (size_t)page, PROT_READ | PROT_EXEC) != 0)
		return 1;
	jit = (caller_fn)code;

	tp_ready();
	char line[256];
	long a;
	while (tp_read_command(line, sizeof line)) {
		if (strcmp(line, "where") == 0) {
			printf("code at=%#lx size=%zu\n", (unsigned long)code, sizeof stub);
		} else if (sscanf(line, "calls %ld", &a) == 1) {
			run_jitted(a);
			printf("done calls %ld\n", a);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("unknown command\n");
		}
	}
	return 0;
}
