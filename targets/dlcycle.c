/* dlcycle N [wait|first]: loads libloaded.so (next to the executable) with dlopen, calls
 * its `loaded_work` at once, and unloads it with dlclose, N times; its
 * initializer calls `loaded_work` on every load too. Prints
 * "calls=C checksum=ok ns_per_cycle=T" with C the calls the library
 * counted itself and T the mean time of one load, call and unload, and
 * exits 0 (2 if a load fails); with `wait`, only once a line comes on
 * stdin after that; with `first`, it prints "ready pid=P" and waits for a
 * line on stdin before its first load (a tracer attaches meanwhile), and
 * after the last as `wait` does. */
#include <dlfcn.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

typedef uint64_t (*work_fn)(uint64_t);
typedef uint64_t (*calls_fn)(void);

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
	char exe[4096] = "", path[4200];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
	exe[len > 0 ? len : 0] = 0;
	snprintf(path, sizeof path, "%s/libloaded.so", dirname(exe));
	if (argc > 2 && strcmp(argv[2], "first") == 0) {
		char line[16];
		printf("ready pid=%d\n", (int)getpid());
		fflush(stdout);
		if (!fgets(line, sizeof line, stdin))
			return 0;
	}
	uint64_t total = 0;
	int ok = 1;
	uint64_t started = now_ns();
	for (unsigned long i = 0; i < n; i++) {
		void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			printf("error %s\n", dlerror());
			return 2;
		}
		work_fn work = (work_fn)dlsym(h, "loaded_work");
		calls_fn calls = (calls_fn)dlsym(h, "loaded_calls");
		if (!work || !calls) {
			printf("error %s\n", dlerror());
			return 2;
		}
		ok &= work(i) == i * 13 + 5;
		total += calls();
		dlclose(h);
	}
	uint64_t per = n ? (now_ns() - started) / n : 0;
	printf("calls=%llu checksum=%s ns_per_cycle=%llu\n", (unsigned long long)total, ok ? "ok" : "BAD",
	       (unsigned long long)per);
	if (argc > 2 && (strcmp(argv[2], "wait") == 0 || strcmp(argv[2], "first") == 0)) {
		char line[16];
		fflush(stdout);
		if (!fgets(line, sizeof line, stdin))
			return 0;
	}
	return 0;
}
