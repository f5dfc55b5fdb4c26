/* Shared helpers for tp's target programs.
 *
 * Every target keeps its own books: it counts the calls it makes to its
 * probe-able functions, checks every result against a reference copy of the
 * function that no probe touches, prints "ready pid=N" once it can be
 * probed, and answers line commands on stdin, so a test can start a measured
 * phase and compare tp's count with the target's own.
 */
#ifndef TP_TARGET_COMMON_H
#define TP_TARGET_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A probe-able function: never inlined, cloned or reasoned about by callers. */
#define TP_PROBED __attribute__((noinline, noclone, noipa, used))

/* Prints the ready line; stdout is line-buffered so tests see it at once. */
static inline void tp_ready(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready pid=%d\n", (int)getpid());
}

/* Reads one command line into buf; returns 0 at end of input. */
static inline int tp_read_command(char *buf, size_t len)
{
	if (!fgets(buf, (int)len, stdin))
		return 0;
	buf[strcspn(buf, "\r\n")] = 0;
	return 1;
}

#endif
