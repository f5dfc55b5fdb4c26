/* hostile: a process that attacks its tracer. tp runs as root; this
 * program may run as anyone (the tests run it as `nobody`) and does what a
 * process may do to its own memory and descriptors: it maps a memfd named
 * like tp's data region with contents of its choosing, rewrites bytes of a
 * real region tp gave it, and swaps descriptors while tp attaches. It keeps
 * its own books on `work`, a probe-able function, so a test can check that
 * tp still counts exactly and restores the code.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call work N [T]    calls work N times (T is ignored: one thread)
 *                      -> "done work calls=N checksum=ok|BAD"
 *   map SIZE HOW ADDR LEN
 *                      then LEN raw bytes on stdin: a memfd named tp-data of
 *                      SIZE bytes (sparse) holding them, mapped shared and
 *                      writable at ADDR (hex); HOW bit 0: sealed against
 *                      shrinking and growing; bit 1: then shrunk to LEN
 *                      (rounded up to a page), so the mapping runs past its
 *                      end -> "mapped" | "error WHAT"
 *   unmap              unmaps what map mapped -> "unmapped"
 *   poke OFF HEX       writes the bytes HEX at offset OFF (hex) of the
 *                      tp-data region in /proc/self/maps -> "poked" | "error"
 *   swap FD LO HI      a thread dup2s FD over descriptors LO..HI, then a
 *                      writable memfd of its own, then closes them, again
 *                      and again -> "swapping"
 *   calm               stops that thread and closes LO..HI -> "calm rounds=R"
 *   anon ADDR SIZE     maps SIZE bytes of its own anonymous private memory
 *                      at ADDR (hex), filled with 0x5a -> "anon mapped"
 *   anon check ADDR SIZE
 *                      -> "anon intact" if still all 0x5a, else "anon gone"
 *   hold MASKED        a thread keeps the word MASKED ^ HOLD_MASK (hex) live
 *                      on its stack and sleeps until "unhold"; masked, the
 *                      word is nowhere else in the process (not in what the
 *                      main thread parsed) -> "holding", once it is there
 *   unhold             -> "unheld"
 *   quit               -> exit status 0, or 1 if a checksum failed
 */
#include "common.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

TP_PROBED uint64_t work(uint64_t x)
{
	return (x ^ (x >> 17)) * 0xbf58476d1ce4e5b9ull + 7;
}

static inline uint64_t work_ref(uint64_t x)
{
	return (x ^ (x >> 17)) * 0xbf58476d1ce4e5b9ull + 7;
}

static int checksum_failed;
static void *mapped_at;
static size_t mapped_len;

static void do_map(const char *args)
{
	unsigned long long size, addr, len;
	int how;
	if (sscanf(args, "%llu %d %llx %llu", &size, &how, &addr, &len) != 4) {
		printf("error usage\n");
		return;
	}
	unsigned char *bytes = malloc(len ? len : 1);
	if (!bytes || fread(bytes, 1, len, stdin) != len) {
		printf("error short input\n");
		exit(2);
	}
	int fd = memfd_create("tp-data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		printf("error memfd %d\n", errno);
		return;
	}
	size_t n = len < size ? len : size;
	if (pwrite(fd, bytes, n, 0) != (ssize_t)n) {
		printf("error write %d\n", errno);
		return;
	}
	free(bytes);
	if ((how & 1) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
		printf("error seal %d\n", errno);
		return;
	}
	void *at = mmap((void *)(uintptr_t)addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd,
			0);
	if (at == MAP_FAILED || at != (void *)(uintptr_t)addr) {
		printf("error mmap %d\n", errno);
		return;
	}
	if ((how & 2) && ftruncate(fd, (off_t)((len + 4095) & ~4095ull)) != 0) {
		printf("error shrink %d\n", errno);
		return;
	}
	close(fd);
	mapped_at = at;
	mapped_len = size;
	printf("mapped\n");
}

/* The start of the tp-data mapping in /proc/self/maps, or NULL. */
static unsigned char *find_region(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned char *at = NULL;
	while (f && fgets(line, sizeof line, f)) {
		unsigned long long lo;
		if (strstr(line, "/memfd:tp-data") && sscanf(line, "%llx-", &lo) == 1) {
			at = (unsigned char *)(uintptr_t)lo;
			break;
		}
	}
	if (f)
		fclose(f);
	return at;
}

static void do_poke(const char *args)
{
	unsigned long long off;
	char hex[4096];
	unsigned char *region = find_region();
	if (!region || sscanf(args, "%llx %4095s", &off, hex) != 2) {
		printf("error\n");
		return;
	}
	for (size_t i = 0; hex[2 * i] && hex[2 * i + 1]; i++) {
		unsigned int b;
		sscanf(hex + 2 * i, "%2x", &b);
		region[off + i] = (unsigned char)b;
	}
	printf("poked\n");
}

static pthread_t swapper;
static atomic_int swap_stop;
static atomic_ulong swap_rounds;
static int swap_fd, swap_lo, swap_hi;

/* Puts FD on each descriptor number in LO..HI, then a writable memfd of
 * its own, then frees them: a memfd the process is made to create lands on
 * a freed number, and is soon FD (which a tracer reopening the number
 * would open with its own rights), then the decoy (which a tracer mapping
 * the number through the process would map instead). */
static void *swap_main(void *arg)
{
	(void)arg;
	int made = memfd_create("decoy", MFD_CLOEXEC);
	if (made < 0 || ftruncate(made, 64 << 20) != 0)
		return NULL;
	/* Out of the way of the numbers it swaps. */
	int decoy = dup2(made, 200);
	close(made);
	while (!atomic_load(&swap_stop)) {
		for (int n = swap_lo; n <= swap_hi; n++)
			if (n != decoy)
				dup2(swap_fd, n);
		for (int n = swap_lo; n <= swap_hi; n++)
			if (n != decoy)
				dup2(decoy, n);
		for (int n = swap_lo; n <= swap_hi; n++)
			if (n != decoy)
				close(n);
		atomic_fetch_add(&swap_rounds, 1);
	}
	close(decoy);
	return NULL;
}

static pthread_t holder;
static atomic_int hold_stop;
static atomic_int hold_started;

#define HOLD_MASK 0x5a5a5a5a5a5a5a5aull

/* Keeps `arg` unmasked in a word of this thread's stack that it reads
 * again and again, so the word is live, until told to stop. */
static void *hold_main(void *arg)
{
	volatile uintptr_t word = (uintptr_t)arg ^ HOLD_MASK;
	atomic_store(&hold_started, 1);
	while (!atomic_load(&hold_stop)) {
		usleep(1000);
		(void)word;
	}
	return (void *)word;
}

int main(void)
{
	char line[256];
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		unsigned long long n;
		if (sscanf(line, "call work %llu", &n) == 1) {
			uint64_t got = 0, want = 0;
			for (uint64_t i = 0; i < n; i++) {
				got += work(i);
				want += work_ref(i);
			}
			if (got != want)
				checksum_failed = 1;
			printf("done work calls=%llu checksum=%s\n", n, got == want ? "ok" : "BAD");
		} else if (!strncmp(line, "map ", 4)) {
			do_map(line + 4);
		} else if (!strcmp(line, "unmap")) {
			if (mapped_at)
				munmap(mapped_at, mapped_len);
			mapped_at = NULL;
			printf("unmapped\n");
		} else if (!strncmp(line, "poke ", 5)) {
			do_poke(line + 5);
		} else if (sscanf(line, "swap %d %d %d", &swap_fd, &swap_lo, &swap_hi) == 3) {
			atomic_store(&swap_stop, 0);
			pthread_create(&swapper, NULL, swap_main, NULL);
			printf("swapping\n");
		} else if (!strcmp(line, "calm")) {
			atomic_store(&swap_stop, 1);
			pthread_join(swapper, NULL);
			for (int k = swap_lo; k <= swap_hi; k++)
				close(k);
			printf("calm rounds=%lu\n", atomic_load(&swap_rounds));
		} else if (!strncmp(line, "anon check ", 11)) {
			unsigned long long addr, size;
			int intact = sscanf(line + 11, "%llx %llu", &addr, &size) == 2;
			unsigned char vec[1];
			/* mincore fails with ENOMEM where nothing is mapped. */
			for (unsigned long long o = 0; intact && o < size; o += 4096)
				intact = mincore((void *)(uintptr_t)(addr + o), 4096, vec) == 0 &&
					 ((volatile unsigned char *)(uintptr_t)addr)[o] == 0x5a;
			printf("anon %s\n", intact ? "intact" : "gone");
		} else if (!strncmp(line, "anon ", 5)) {
			unsigned long long addr, size;
			void *at = MAP_FAILED;
			if (sscanf(line + 5, "%llx %llu", &addr, &size) == 2)
				at = mmap((void *)(uintptr_t)addr, size, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			if (at == MAP_FAILED) {
				printf("error mmap %d\n", errno);
			} else {
				memset(at, 0x5a, size);
				printf("anon mapped\n");
			}
		} else if (sscanf(line, "hold %llx", &n) == 1) {
			atomic_store(&hold_stop, 0);
			atomic_store(&hold_started, 0);
			pthread_create(&holder, NULL, hold_main, (void *)(uintptr_t)n);
			/* "holding" once the word is on the holder's stack. */
			while (!atomic_load(&hold_started))
				usleep(100);
			printf("holding\n");
		} else if (!strcmp(line, "unhold")) {
			atomic_store(&hold_stop, 1);
			pthread_join(holder, NULL);
			printf("unheld\n");
		} else if (!strcmp(line, "quit")) {
			return checksum_failed;
		} else {
			printf("unknown command\n");
		}
	}
	return checksum_failed;
}
