/* trapcost: what the in-target stepping engine's floor is on this machine
 * (benches/tp/stepping.rs): the time of one single-step trap delivered to
 * an empty SIGTRAP handler (the trap flag set over a loop of N
 * instructions), beside the time of one signal a thread sends itself and
 * handles (tgkill: the delivery and sigreturn without the debug
 * exception). Prints "trap_ns=T signal_ns=S". */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t traps, signals;

static void on_trap(int sig)
{
	(void)sig;
	traps++;
}

static void on_usr1(int sig)
{
	(void)sig;
	signals++;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	signal(SIGTRAP, on_trap);
	signal(SIGUSR1, on_usr1);
	uint64_t a = now_ns();
	long left = n;
	__asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq\n"
			 "1: dec %0\n"
			 "jnz 1b\n"
			 "pushfq; andq $~0x100, (%%rsp); popfq"
			 : "+r"(left)
			 :
			 : "cc", "memory");
	uint64_t b = now_ns();
	pid_t pid = getpid(), tid = (pid_t)syscall(SYS_gettid);
	for (long i = 0; i < n; i++)
		syscall(SYS_tgkill, pid, tid, SIGUSR1);
	uint64_t c = now_ns();
	printf("trap_ns=%.0f signal_ns=%.0f traps=%llu signals=%llu\n", (double)(b - a) / (double)traps,
	       (double)(c - b) / (double)signals, (unsigned long long)traps, (unsigned long long)signals);
	return 0;
}
