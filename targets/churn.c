/* churn: threads created and exiting all the time. Spawner threads each
 * create a short-lived worker, which calls work() a few hundred times,
 * checks the results and exits; half the workers are joined, half are
 * detached and count their own exit. So at any moment threads are being
 * cloned and are exiting.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   churn S    S spawner threads (1..16) start -> "churning S"
 *   progress   waits until every spawner has created two more workers
 *              -> "progress created=C exited=E"
 *   call N     one new thread calls measured N times -> "done calls=N checksum=ok|BAD"
 *   counts     -> "counts work=W"
 *   stop       stops the spawners and waits for every worker to exit
 *              -> "stopped created=C exited=E checksum=ok|BAD"
 *   quit       -> exit status 0, or 1 if any check failed
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define MAX_SPAWNERS 16
#define CALLS_PER_WORKER 300

TP_PROBED uint64_t work(uint64_t x)
{
	return (x ^ 0x5bd1e995u) * 0x2545f4914f6cdd1dull;
}

static inline uint64_t work_ref(uint64_t x)
{
	return (x ^ 0x5bd1e995u) * 0x2545f4914f6cdd1dull;
}

TP_PROBED uint64_t measured(uint64_t x)
{
	return x * 7 + 3;
}

static inline uint64_t measured_ref(uint64_t x)
{
	return x * 7 + 3;
}

static atomic_int stop_spawning;
static atomic_uint_fast64_t created, exited, work_calls, errors;
static _Alignas(64) atomic_uint_fast64_t spawned[MAX_SPAWNERS];
static int nspawners;
static pthread_t spawners[MAX_SPAWNERS];

static void *worker_main(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg * 7919, got = 0, want = 0;
	for (int i = 0; i < CALLS_PER_WORKER; i++) {
		got += work(seed + i);
		want += work_ref(seed + i);
	}
	atomic_fetch_add(&work_calls, CALLS_PER_WORKER);
	if (got != want)
		atomic_fetch_add(&errors, 1);
	atomic_fetch_add(&exited, 1);
	return NULL;
}

static void *spawner_main(void *arg)
{
	int me = (int)(uintptr_t)arg;
	pthread_attr_t detached;
	pthread_attr_init(&detached);
	pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
	for (uint64_t n = 0; !atomic_load(&stop_spawning); n++) {
		pthread_t t;
		int join = n % 2 == 0;
		if (pthread_create(&t, join ? NULL : &detached, worker_main, (void *)(uintptr_t)n) != 0) {
			atomic_fetch_add(&errors, 1);
			printf("error pthread_create failed\n");
			break;
		}
		atomic_fetch_add(&created, 1);
		if (join)
			pthread_join(t, NULL);
		atomic_fetch_add(&spawned[me], 1);
	}
	return NULL;
}

static void *call_main(void *arg)
{
	uint64_t n = *(uint64_t *)arg, got = 0, want = 0;
	for (uint64_t i = 0; i < n; i++) {
		got += measured(i);
		want += measured_ref(i);
	}
	*(uint64_t *)arg = got == want;
	return NULL;
}

/* Waits (at most 60 s) for f() to hold. */
static int wait_for(int (*f)(const void *), const void *arg)
{
	struct timespec ms = {0, 1000000};
	for (int i = 0; i < 60000; i++) {
		if (f(arg))
			return 1;
		nanosleep(&ms, NULL);
	}
	return 0;
}

static int spawners_progressed(const void *arg)
{
	const uint64_t *before = arg;
	for (int i = 0; i < nspawners; i++)
		if (atomic_load(&spawned[i]) < before[i] + 2)
			return 0;
	return 1;
}

static int all_exited(const void *arg)
{
	(void)arg;
	return atomic_load(&exited) == atomic_load(&created);
}

int main(void)
{
	char line[256];
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		int s = 0;
		unsigned long long n = 0;
		if (sscanf(line, "churn %d", &s) == 1) {
			if (nspawners == 0) {
				nspawners = s < 1 ? 1 : s > MAX_SPAWNERS ? MAX_SPAWNERS : s;
				for (int i = 0; i < nspawners; i++)
					pthread_create(&spawners[i], NULL, spawner_main, (void *)(uintptr_t)i);
			}
			printf("churning %d\n", nspawners);
		} else if (strcmp(line, "progress") == 0) {
			uint64_t before[MAX_SPAWNERS];
			for (int i = 0; i < nspawners; i++)
				before[i] = atomic_load(&spawned[i]);
			if (!wait_for(spawners_progressed, before))
				printf("error spawners made no progress\n");
			printf("progress created=%llu exited=%llu\n", (unsigned long long)atomic_load(&created),
			       (unsigned long long)atomic_load(&exited));
		} else if (sscanf(line, "call %llu", &n) == 1) {
			uint64_t arg = n;
			pthread_t t;
			pthread_create(&t, NULL, call_main, &arg);
			pthread_join(t, NULL);
			printf("done calls=%llu checksum=%s\n", n, arg ? "ok" : "BAD");
		} else if (strcmp(line, "counts") == 0) {
			printf("counts work=%llu\n", (unsigned long long)atomic_load(&work_calls));
		} else if (strcmp(line, "stop") == 0) {
			atomic_store(&stop_spawning, 1);
			for (int i = 0; i < nspawners; i++)
				pthread_join(spawners[i], NULL);
			nspawners = 0;
			int ok = wait_for(all_exited, NULL);
			printf("stopped created=%llu exited=%llu checksum=%s\n", (unsigned long long)atomic_load(&created),
			       (unsigned long long)atomic_load(&exited), ok && !atomic_load(&errors) ? "ok" : "BAD");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return atomic_load(&errors) ? 1 : 0;
}
