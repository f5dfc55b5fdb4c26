// exceptions: C++ exceptions thrown through probed functions, so that tp's
// return probes must step aside for the unwinder (tp puts the original
// return addresses back when _Unwind_RaiseException starts).
//
// Commands (see common.h):
//   throw N     N times: catcher() calls middle(), which calls thrower(),
//               which throws; catcher catches -> "done throw N caught=C checksum=ok|BAD"
//   plain N     N calls of middle(-1), which returns normally -> "done plain N checksum=ok|BAD"
//   quit
#include "common.h"

#include <stdexcept>

#define PROBED __attribute__((noinline, noclone, noipa))

PROBED long thrower(long x)
{
	if (x >= 0)
		throw std::runtime_error("thrown on purpose");
	return -x;
}

PROBED long middle(long x)
{
	// Work on both sides of the call, so the frame is a real one.
	long before = x * 3;
	long r = thrower(x);
	return r + before;
}

PROBED long catcher(long x)
{
	try {
		return middle(x);
	} catch (const std::runtime_error &) {
		return 1000 + x;
	}
}

int main()
{
	char line[256];
	int failed = 0;
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		unsigned long n = 0;
		if (sscanf(line, "throw %lu", &n) == 1) {
			unsigned long caught = 0;
			long got = 0, want = 0;
			for (unsigned long i = 0; i < n; i++) {
				long r = catcher((long)i);
				caught += r == 1000 + (long)i;
				got += r;
				want += 1000 + (long)i;
			}
			failed |= got != want;
			printf("done throw %lu caught=%lu checksum=%s\n", n, caught, got == want ? "ok" : "BAD");
		} else if (sscanf(line, "plain %lu", &n) == 1) {
			long got = 0, want = 0;
			for (unsigned long i = 1; i <= n; i++) {
				got += catcher(-(long)i);
				want += (long)i - 3 * (long)i;
			}
			failed |= got != want;
			printf("done plain %lu checksum=%s\n", n, got == want ? "ok" : "BAD");
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	return failed;
}
