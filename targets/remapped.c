/* remapped: a program that maps a second copy of part of its own code far
 * away and runs it from there, as node does. V8's "short builtin calls"
 * (on by default on x86-64 with 4 GiB of memory or more) reserve a code
 * range for the JIT near the top of the address space, then map the
 * embedded builtins, part of node's own text, a second time at its start
 * (OS::RemapPages: the file that /proc/self/maps names for the code is
 * opened and its pages mapped again, MAP_FIXED|MAP_PRIVATE, PROT_READ |
 * PROT_EXEC), so that JIT code reaches them with short calls. The module
 * then has mappings terabytes apart.
 *
 * `hop` (position-independent, no data) starts a page, which is mapped a
 * second time at the start of a 128 MiB PROT_NONE reservation, as V8's
 * code range, at least 8 GiB from the program's own code; `stay` is
 * ordinary code outside that page.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   where           -> "copy at=A of=B" (hop's address in the copy and in the file's own mapping)
 *   call hop N      N calls of hop through the file's own code and N through the copy
 *                   -> "done hop calls=2N own=N copy=N checksum=ok|BAD"
 *   call stay N     -> "done stay calls=N checksum=ok|BAD"
 *   quit            -> exit status 0, or 1 if any checksum failed
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>

#define PAGE 4096ul
/* V8's code range on x86-64. */
#define RESERVATION (128ul << 20)

/* At the start of a page: that page is copied. */
__attribute__((noinline, noclone, noipa, used, aligned(PAGE), section(".text.remapped_hop"))) uint64_t
hop(uint64_t x)
{
	return (x ^ (x >> 7)) * 0x2545f4914f6cdd1dull + 11;
}

static inline uint64_t hop_ref(uint64_t x)
{
	return (x ^ (x >> 7)) * 0x2545f4914f6cdd1dull + 11;
}

TP_PROBED uint64_t stay(uint64_t x)
{
	return x * 3 + (x >> 3);
}

static inline uint64_t stay_ref(uint64_t x)
{
	return x * 3 + (x >> 3);
}

/* A code range: RESERVATION bytes of PROT_NONE, near `hint` if free. */
static char *reserve(void *hint)
{
	return mmap(hint, RESERVATION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

/* Maps the page holding `code` again inside a fresh PROT_NONE reservation,
 * from the file /proc/self/maps names for it; returns `code`'s address in
 * the copy. */
static uint64_t (*remap(void *code))(uint64_t)
{
	uintptr_t page = (uintptr_t)code & ~(PAGE - 1);
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[4096], path[4096] = "";
	unsigned long start = 0, end = 0, offset = 0;
	int found = 0;
	while (maps && fgets(line, sizeof line, maps)) {
		if (sscanf(line, "%lx-%lx %*s %lx %*s %*s %4095s", &start, &end, &offset, path) == 4 &&
		    start <= page && page < end) {
			found = 1;
			break;
		}
	}
	if (maps)
		fclose(maps);
	if (!found) {
		fprintf(stderr, "remapped: no file mapping holds %p\n", code);
		exit(2);
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *range = reserve(NULL);
	/* A static-pie lives where mmap places things, at the top: then
	 * reserve 64 GiB below it (above it, if it is low), terabytes away as
	 * node's copy is. */
	uintptr_t distance = (uintptr_t)range > page ? (uintptr_t)range - page : page - (uintptr_t)range;
	if (range != MAP_FAILED && distance < (8ul << 30)) {
		munmap(range, RESERVATION);
		uintptr_t far = page > (128ul << 30) ? page - (64ul << 30) : page + (64ul << 30);
		range = reserve((void *)(far & ~(PAGE - 1)));
	}
	if (fd < 0 || range == MAP_FAILED) {
		perror("remapped: open or reserve");
		exit(2);
	}
	char *copy = mmap(range, PAGE, PROT_READ | PROT_EXEC, MAP_FIXED | MAP_PRIVATE, fd, offset + (page - start));
	if (copy == MAP_FAILED) {
		perror("remapped: map the copy");
		exit(2);
	}
	close(fd);
	return (uint64_t (*)(uint64_t))(copy + ((uintptr_t)code - page));
}

int main(void)
{
	uint64_t (*copy)(uint64_t) = remap((void *)hop);
	/* Through a volatile pointer, so the compiler calls the file's own hop. */
	uint64_t (*volatile own)(uint64_t) = hop;
	int failed = 0;
	char cmd[256];
	tp_ready();
	while (tp_read_command(cmd, sizeof cmd)) {
		char what[32];
		unsigned long long n;
		if (!strcmp(cmd, "where")) {
			printf("copy at=%llu of=%llu\n", (unsigned long long)(uintptr_t)copy,
			       (unsigned long long)(uintptr_t)hop);
		} else if (sscanf(cmd, "call %31s %llu", what, &n) == 2 && !strcmp(what, "hop")) {
			uint64_t got = 0, want = 0;
			for (uint64_t i = 0; i < n; i++) {
				got += own(i) + copy(i + n);
				want += hop_ref(i) + hop_ref(i + n);
			}
			failed |= got != want;
			printf("done hop calls=%llu own=%llu copy=%llu checksum=%s\n", 2 * n, n, n,
			       got == want ? "ok" : "BAD");
		} else if (sscanf(cmd, "call %31s %llu", what, &n) == 2 && !strcmp(what, "stay")) {
			uint64_t got = 0, want = 0;
			for (uint64_t i = 0; i < n; i++) {
				got += stay(i);
				want += stay_ref(i);
			}
			failed |= got != want;
			printf("done stay calls=%llu checksum=%s\n", n, got == want ? "ok" : "BAD");
		} else if (!strcmp(cmd, "quit")) {
			break;
		} else {
			printf("error unknown command: %s\n", cmd);
		}
	}
	return failed;
}
