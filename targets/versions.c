/* versions: calls libc functions that have two versions (x86-64 glibc
 * keeps `pthread_cond_signal@GLIBC_2.2.5`, the LinuxThreads-era condition
 * variable, beside the default `pthread_cond_signal@@GLIBC_2.3.2` that
 * programs link against today), so a probe on the plain name must go on
 * the version the program calls.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call signal N     N calls of pthread_cond_signal -> "done signal calls=N checksum=ok"
 *   call broadcast N  N calls of pthread_cond_broadcast
 *   quit
 */
#include "common.h"

#include <pthread.h>

int main(void)
{
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	int failed = 0;
	char cmd[256];
	tp_ready();
	while (tp_read_command(cmd, sizeof cmd)) {
		char what[32];
		unsigned long long n;
		if (sscanf(cmd, "call %31s %llu", what, &n) == 2 && (!strcmp(what, "signal") || !strcmp(what, "broadcast"))) {
			int bad = 0;
			for (unsigned long long i = 0; i < n; i++)
				bad |= (what[0] == 's' ? pthread_cond_signal(&cond) : pthread_cond_broadcast(&cond)) != 0;
			failed |= bad;
			printf("done %s calls=%llu checksum=%s\n", what, n, bad ? "BAD" : "ok");
		} else if (!strcmp(cmd, "quit")) {
			break;
		} else {
			printf("error unknown command: %s\n", cmd);
		}
	}
	return failed;
}
