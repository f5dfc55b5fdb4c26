/* launched: a program for `tp run` and `tp attach --follow-exec`, which
 * keeps its own count of the calls it makes to foo.
 *
 *   launched calls N [exit S | kill SIG]
 *       calls foo N times, prints "foo calls=N checksum=ok|BAD" on stdout and
 *       "to stderr" on stderr, then exits with status S (default 0) or dies
 *       of signal SIG
 *   launched after MS calls N ...
 *       the same, after sleeping MS milliseconds first
 *   launched echo
 *       copies stdin to stdout line by line, calling foo once per line, and
 *       ends with "foo calls=N" on stderr
 *   launched
 *       interactive (see common.h): prints "ready pid=P", then
 *         call N     -> "done foo calls=N checksum=ok|BAD"
 *         exec PATH  execs PATH with no arguments (another target)
 *         quit       -> exit status 0
 * only_here exists in this program alone, for --follow-exec to miss.
 */
#include "common.h"

#include <signal.h>

TP_PROBED uint64_t foo(uint64_t x)
{
	return x * 2654435761u + 11;
}

static inline uint64_t foo_ref(uint64_t x)
{
	return x * 2654435761u + 11;
}

TP_PROBED uint64_t only_here(uint64_t x)
{
	return x ^ 0x5a5a;
}

/* Calls foo n times; returns 1 if every result was right. */
static int calls(uint64_t n)
{
	int ok = 1;
	for (uint64_t i = 0; i < n; i++)
		ok &= foo(i) == foo_ref(i);
	return ok;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "after") == 0) {
		usleep((useconds_t)atoi(argv[2]) * 1000);
		argc -= 2;
		argv += 2;
	}
	if (argc >= 3 && strcmp(argv[1], "calls") == 0) {
		uint64_t n = strtoull(argv[2], NULL, 10);
		int ok = calls(n);
		printf("foo calls=%llu checksum=%s\n", (unsigned long long)n, ok ? "ok" : "BAD");
		fprintf(stderr, "to stderr\n");
		if (argc >= 5 && strcmp(argv[3], "kill") == 0) {
			fflush(NULL);
			signal(atoi(argv[4]), SIG_DFL);
			raise(atoi(argv[4]));
		}
		return argc >= 5 && strcmp(argv[3], "exit") == 0 ? atoi(argv[4]) : (ok ? 0 : 1);
	}
	if (argc >= 2 && strcmp(argv[1], "echo") == 0) {
		char line[4096];
		uint64_t n = 0;
		int ok = 1;
		while (fgets(line, sizeof line, stdin)) {
			ok &= foo(n) == foo_ref(n);
			n++;
			fputs(line, stdout);
		}
		fprintf(stderr, "foo calls=%llu checksum=%s\n", (unsigned long long)n, ok ? "ok" : "BAD");
		return ok ? 0 : 1;
	}
	char line[4200];
	tp_ready();
	(void)only_here(1);
	while (tp_read_command(line, sizeof line)) {
		unsigned long long n = 0;
		char path[4096];
		if (sscanf(line, "call %llu", &n) == 1) {
			int ok = calls(n);
			printf("done foo calls=%llu checksum=%s\n", n, ok ? "ok" : "BAD");
		} else if (sscanf(line, "exec %4095s", path) == 1) {
			char *args[] = {path, NULL};
			execv(path, args);
			printf("error exec %s\n", path);
		} else if (strcmp(line, "quit") == 0) {
			return 0;
		}
	}
	return 0;
}
