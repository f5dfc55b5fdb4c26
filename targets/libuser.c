/* libuser: a program whose probe-able functions live in two shared
 * libraries with identical names (libalpha.so and libbeta.so).
 *
 * Commands (see common.h):
 *   call alpha N   N calls of lib_work in libalpha  -> "done alpha calls=N checksum=ok|BAD"
 *   call beta N    N calls of lib_work in libbeta
 *   call only N    N calls each of alpha_only and beta_only
 *   load gamma     dlopen libgamma.so (not linked)   -> "loaded gamma"
 *   call gamma N   N calls of lib_work in libgamma
 *   quit
 */
#include "common.h"

#include <dlfcn.h>
#include <libgen.h>

uint64_t alpha_only(uint64_t);
uint64_t beta_only(uint64_t);

typedef uint64_t (*work_fn)(uint64_t);

int main(void)
{
	/* Each library's lib_work, by handle (a plain call would bind to the first). */
	void *a = dlopen("libalpha.so", RTLD_NOW | RTLD_NOLOAD);
	void *b = dlopen("libbeta.so", RTLD_NOW | RTLD_NOLOAD);
	if (!a || !b) {
		printf("error %s\n", dlerror());
		return 2;
	}
	work_fn alpha = (work_fn)dlsym(a, "lib_work"), beta = (work_fn)dlsym(b, "lib_work"), gamma = NULL;
	char line[256];
	int failed = 0;
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		char what[32] = "";
		unsigned long long n = 0;
		if (strcmp(line, "load gamma") == 0) {
			/* Next to the executable, by absolute path. */
			char exe[4096] = "", path[4200];
			ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
			exe[len > 0 ? len : 0] = 0;
			snprintf(path, sizeof path, "%s/libgamma.so", dirname(exe));
			void *g = dlopen(path, RTLD_NOW);
			gamma = g ? (work_fn)dlsym(g, "lib_work") : NULL;
			printf(gamma ? "loaded gamma\n" : "error %s\n", dlerror());
		} else if (sscanf(line, "call %31s %llu", what, &n) == 2) {
			uint64_t got = 0, want = 0;
			for (uint64_t i = 0; i < n; i++) {
				if (strcmp(what, "alpha") == 0) {
					got += alpha(i);
					want += i * 3 + 7;
				} else if (strcmp(what, "beta") == 0) {
					got += beta(i);
					want += i * 5 + 7;
				} else if (strcmp(what, "gamma") == 0 && gamma) {
					got += gamma(i);
					want += i * 7 + 7;
				} else {
					got += alpha_only(i) + beta_only(i);
					want += ((i ^ 3) + 1) + ((i ^ 5) + 1);
				}
			}
			failed |= got != want;
			printf("done %s calls=%llu checksum=%s\n", what, n, got == want ? "ok" : "BAD");
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	return failed;
}
