/* reloc_harness: differential execution of an x86-64 window against its
 * relocated copy (tests/reloc drives it; the pattern follows
 * ../shared/aarch64/reloc_harness.c).
 *
 *   reloc_harness [-n TRIALS] [-c REG,REG..] [-d DATA_ADDR] [-z BYTES] [-o BYTES]
 *                 [-u BYTES] [-f FLAGS] [-k CACHE_ADDR,ROW_ADDR[,WAY]] [-v]
 *                 ORIG_ADDR ORIG_HEX RELOC_ADDR RELOC_HEX
 *
 * Maps ORIG_HEX at ORIG_ADDR and RELOC_HEX (the relocated instructions, which
 * end in a jump back to ORIG_ADDR + len unless they end in ret/jmp) at
 * RELOC_ADDR, each inside a 1 MiB region filled with int3, so wherever
 * control goes next (the fall-through at ORIG_ADDR + len, a branch target,
 * a return address) it traps and the trap address is recorded. A 256 KiB data
 * region at DATA_ADDR holds the stack and whatever RIP-relative operands and
 * register-based pointers reach.
 *
 * Each trial runs both snippets from one random state (every GPR, rsp,
 * the arithmetic flags, xmm0-15) and compares the final states: GPRs, rsp,
 * flags, xmm0-15, where control ended (trap address, or signal and fault
 * address) and the whole data region. Registers named with -c are not
 * compared (e.g. rcx after a syscall, which holds the address after it).
 * -z leaves out the BYTES below the initial stack pointer: a detour may
 * save registers there (at a function's entry that stack is dead). -o moves
 * them that many bytes further down: a detour inside a function saves its
 * registers below the 128-byte red zone, which must come out unchanged. -u
 * leaves out the BYTES below the final stack pointer: the detour of a
 * function's exit records the call's end before its `ret`, in the stack
 * the call leaves, which is dead once it returns. -f
 * compares only the flags of the mask FLAGS (those the window leaves
 * undefined may differ). -k writes, before each run, the harness thread's
 * entry of the thread cache at CACHE_ADDR (in the data region), with its
 * counter row at ROW_ADDR, as tp's runtime would (src/layout.rs,
 * CacheEntry), in the entry of its index (WAY 0, the default) or the one
 * paired with it (WAY 1): a counting detour then counts without calling
 * the runtime.
 * Exit status 0 when every trial matches, 1 on a mismatch, 2 on misuse.
 *
 * Entry: a signal handler rewrites the interrupted context and returns into
 * the snippet. Exit: the trap or fault handler saves the context and
 * rewrites it back to the harness's. No hand-written assembly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#define DATA_SIZE (256UL << 10)
#define REGION (1UL << 20)
#define NREG 15
#define NXMM 16
#define FLAGS_MASK 0x8d5ULL /* CF PF AF ZF SF OF */
/* Random register values are canonical addresses: a call through a
 * non-canonical pointer faults before pushing its return address, the
 * relocated push-and-jmp after, and the process dies of SIGSEGV either way. */
#define CANONICAL 0x00007fffffffffffULL

static const char *regname[NREG + 3] = {"rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9",
					"r10", "r11", "r12", "r13", "r14", "r15", "rsp", "eflags", "xmm"};
static const int greg_idx[NREG] = {REG_RAX, REG_RBX, REG_RCX, REG_RDX, REG_RSI, REG_RDI, REG_RBP, REG_R8,
				   REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

typedef struct {
	uint64_t r[NREG], sp, flags; /* flags: only FLAGS_MASK bits */
	uint32_t xmm[NXMM][4];
	uint64_t end; /* trap address, or fault address */
	int sig;      /* SIGTRAP = normal end; else the fault */
} state_t;

static state_t in_st, out_st;
static uint64_t entry_pc, data_addr = 0x10000000UL, ret_trap, cache_addr, row_addr, cache_way, compare_flags = FLAGS_MASK;
static struct {
	uint64_t r[NREG], sp, pc, flags;
	uint32_t xmm[NXMM][4];
} home; /* the harness context to return to */

static void get_ctx(ucontext_t *uc, uint64_t *r, uint64_t *sp, uint64_t *pc, uint64_t *fl, uint32_t (*x)[4])
{
	for (int i = 0; i < NREG; i++)
		r[i] = uc->uc_mcontext.gregs[greg_idx[i]];
	*sp = uc->uc_mcontext.gregs[REG_RSP];
	*pc = uc->uc_mcontext.gregs[REG_RIP];
	*fl = uc->uc_mcontext.gregs[REG_EFL];
	memcpy(x, uc->uc_mcontext.fpregs->_xmm, sizeof(uint32_t) * 4 * NXMM);
}

static void set_ctx(ucontext_t *uc, const uint64_t *r, uint64_t sp, uint64_t pc, uint64_t fl, uint32_t (*x)[4])
{
	for (int i = 0; i < NREG; i++)
		uc->uc_mcontext.gregs[greg_idx[i]] = r[i];
	uc->uc_mcontext.gregs[REG_RSP] = sp;
	uc->uc_mcontext.gregs[REG_RIP] = pc;
	uc->uc_mcontext.gregs[REG_EFL] = fl;
	memcpy(uc->uc_mcontext.fpregs->_xmm, x, sizeof(uint32_t) * 4 * NXMM);
}

static void on_enter(int sig, siginfo_t *si, void *p)
{
	(void)sig;
	(void)si;
	ucontext_t *uc = p;
	get_ctx(uc, home.r, &home.sp, &home.pc, &home.flags, home.xmm);
	uint64_t fl = (home.flags & ~FLAGS_MASK) | (in_st.flags & FLAGS_MASK);
	set_ctx(uc, in_st.r, in_st.sp, entry_pc, fl, in_st.xmm);
}

static void on_exit_sig(int sig, siginfo_t *si, void *p)
{
	ucontext_t *uc = p;
	uint64_t pc, fl;
	get_ctx(uc, out_st.r, &out_st.sp, &pc, &fl, out_st.xmm);
	out_st.flags = fl & FLAGS_MASK;
	out_st.sig = sig;
	if (sig == SIGTRAP)
		out_st.end = pc - 1; /* int3 reports the address after it */
	else if (sig == SIGALRM)
		out_st.end = 0;
	else
		out_st.end = (uint64_t)(uintptr_t)si->si_addr;
	set_ctx(uc, home.r, home.sp, home.pc, home.flags, home.xmm);
}

static void die(const char *m)
{
	fprintf(stderr, "reloc_harness: %s: %s\n", m, strerror(errno));
	exit(2);
}

static void map_at(uint64_t base, uint64_t size, int prot)
{
	void *p = mmap((void *)base, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != (void *)base)
		die("mmap (MAP_FIXED_NOREPLACE)");
}

static void map_trap_region(uint64_t addr)
{
	uint64_t base = (addr & ~(uint64_t)0xfff) - REGION / 2;
	map_at(base, REGION, PROT_READ | PROT_WRITE | PROT_EXEC);
	memset((void *)base, 0xcc, REGION); /* int3 */
}

static size_t unhex(const char *s, uint8_t *out, size_t max)
{
	size_t n = 0;
	while (*s) {
		if (*s == ' ' || *s == ':' || *s == '_') {
			s++;
			continue;
		}
		unsigned v;
		if (n >= max || sscanf(s, "%2x", &v) != 1) {
			fprintf(stderr, "reloc_harness: bad hex\n");
			exit(2);
		}
		out[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}

static uint64_t rng;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Every word of the data region holds its own address in the original's
 * trap region: loads from different addresses give different values, and a
 * `ret`, `jmp [mem]` or `call [mem]` through any of them ends at a trap. */
static void fill_data(void)
{
	uint64_t *d = (uint64_t *)data_addr;
	for (size_t i = 0; i < DATA_SIZE / 8; i++)
		d[i] = ret_trap + i * 8;
}

/* This thread's entry of the thread cache (layout.rs: cache_index,
 * CacheEntry: !word, row, state, padding). */
static void write_cache_entry(void)
{
	uint64_t word;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(word));
	uint64_t index = ((uint32_t)((uint32_t)word * 0x9e3779b1u) >> 25) ^ cache_way;
	uint64_t *e = (uint64_t *)cache_addr + 4 * index;
	e[0] = ~word;
	e[1] = row_addr;
	e[2] = 0;
}

static void run(uint64_t pc, state_t *out, uint8_t *data_copy)
{
	fill_data();
	if (cache_addr)
		write_cache_entry();
	entry_pc = pc;
	memset(&out_st, 0, sizeof out_st);
	/* a snippet that never reaches a trap ends by SIGALRM (end = 0) */
	struct itimerval it = {.it_value = {.tv_sec = 0, .tv_usec = 500000}};
	setitimer(ITIMER_REAL, &it, 0);
	syscall(SYS_tgkill, getpid(), gettid(), SIGUSR1);
	struct itimerval off = {0};
	setitimer(ITIMER_REAL, &off, 0);
	*out = out_st;
	memcpy(data_copy, (void *)data_addr, DATA_SIZE);
}

int main(int argc, char **argv)
{
	int trials = 64, verbose = 0;
	uint64_t below_sp = 0, skip_from = 0, below_end = 0;
	int skip[NREG + 3] = {0};
	int opt;
	while ((opt = getopt(argc, argv, "n:c:d:z:o:u:f:k:v")) != -1) {
		if (opt == 'n')
			trials = atoi(optarg);
		else if (opt == 'u')
			below_end = strtoull(optarg, 0, 0);
		else if (opt == 'z')
			below_sp = strtoull(optarg, 0, 0);
		else if (opt == 'o')
			skip_from = strtoull(optarg, 0, 0);
		else if (opt == 'd')
			data_addr = strtoull(optarg, 0, 0);
		else if (opt == 'f')
			compare_flags = strtoull(optarg, 0, 0) & FLAGS_MASK;
		else if (opt == 'k') {
			char *comma;
			cache_addr = strtoull(optarg, &comma, 0);
			row_addr = *comma == ',' ? strtoull(comma + 1, &comma, 0) : 0;
			cache_way = *comma == ',' ? strtoull(comma + 1, 0, 0) & 1 : 0;
		}
		else if (opt == 'v')
			verbose = 1;
		else if (opt == 'c') {
			char *s = strdup(optarg), *tok;
			for (tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
				for (int i = 0; i < NREG + 3; i++)
					if (!strcmp(tok, regname[i]))
						skip[i] = 1;
		} else {
			fprintf(stderr,
				"usage: %s [-n N] [-c regs] [-d addr] [-z bytes] [-o bytes] [-u bytes] [-f flags] [-k addr] [-v] "
				"ORIG_ADDR ORIG_HEX RELOC_ADDR RELOC_HEX\n",
				argv[0]);
			return 2;
		}
	}
	if (argc - optind != 4) {
		fprintf(stderr, "reloc_harness: need ORIG_ADDR ORIG_HEX RELOC_ADDR RELOC_HEX\n");
		return 2;
	}
	uint64_t orig = strtoull(argv[optind], 0, 0), reloc = strtoull(argv[optind + 2], 0, 0);
	static uint8_t code[4096];
	map_trap_region(orig);
	map_trap_region(reloc);
	ret_trap = orig + 0x1000;
	size_t n = unhex(argv[optind + 1], code, sizeof code);
	memcpy((void *)orig, code, n);
	size_t m = unhex(argv[optind + 3], code, sizeof code);
	memcpy((void *)reloc, code, m);
	map_at(data_addr, DATA_SIZE, PROT_READ | PROT_WRITE);

	static char altstack[1 << 16];
	stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
	if (sigaltstack(&ss, 0))
		die("sigaltstack");
	struct sigaction sa = {0};
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
	sa.sa_sigaction = on_enter;
	sigaction(SIGUSR1, &sa, 0);
	sa.sa_sigaction = on_exit_sig;
	int sigs[] = {SIGTRAP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGALRM};
	for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaction(sigs[i], &sa, 0);

	static uint8_t d1[DATA_SIZE], d2[DATA_SIZE];
	int bad = 0;
	for (int t = 0; t < trials; t++) {
		rng = 0x9e3779b97f4a7c15ULL * (t + 1);
		for (int i = 0; i < NREG; i++) {
			switch (next() % 4) {
			case 0: in_st.r[i] = data_addr + DATA_SIZE / 2 + (uint64_t)i * 64; break;
			case 1: in_st.r[i] = 0; break;
			case 2: in_st.r[i] = next() % 64; break;
			default: in_st.r[i] = next() & CANONICAL; break;
			}
		}
		for (int i = 0; i < NXMM; i++)
			for (int k = 0; k < 4; k++)
				in_st.xmm[i][k] = (uint32_t)next();
		in_st.sp = data_addr + DATA_SIZE * 3 / 4;
		in_st.flags = next() & FLAGS_MASK;
		state_t a, b;
		run(orig, &a, d1);
		run(reloc, &b, d2);
		uint64_t sp_off = in_st.sp - data_addr;
		memset(d1 + sp_off - skip_from - below_sp, 0, below_sp);
		memset(d2 + sp_off - skip_from - below_sp, 0, below_sp);
		/* Below the original's final stack pointer, when it lies in the region. */
		if (below_end && a.sp >= data_addr + below_end && a.sp <= data_addr + DATA_SIZE) {
			memset(d1 + (a.sp - data_addr) - below_end, 0, below_end);
			memset(d2 + (a.sp - data_addr) - below_end, 0, below_end);
		}
		int diff = 0;
		char why[768] = "";
		size_t wl = 0;
#define WHY(...) (wl += (size_t)snprintf(why + wl, wl < sizeof why ? sizeof why - wl : 0, __VA_ARGS__))
		for (int i = 0; i < NREG; i++)
			if (!skip[i] && a.r[i] != b.r[i]) {
				diff = 1;
				WHY(" %s:%#lx/%#lx", regname[i], (unsigned long)a.r[i], (unsigned long)b.r[i]);
			}
		if (!skip[NREG] && a.sp != b.sp) {
			diff = 1;
			WHY(" rsp:%#lx/%#lx", (unsigned long)a.sp, (unsigned long)b.sp);
		}
		if (!skip[NREG + 1] && (a.flags & compare_flags) != (b.flags & compare_flags)) {
			diff = 1;
			WHY(" eflags:%#lx/%#lx", (unsigned long)a.flags, (unsigned long)b.flags);
		}
		if (!skip[NREG + 2] && memcmp(a.xmm, b.xmm, sizeof a.xmm)) {
			diff = 1;
			WHY(" xmm");
		}
		if (a.sig != b.sig || a.end != b.end) {
			diff = 1;
			WHY(" end:sig%d@%#lx/sig%d@%#lx", a.sig, (unsigned long)a.end, b.sig, (unsigned long)b.end);
		}
		if (memcmp(d1, d2, DATA_SIZE)) {
			diff = 1;
			size_t k = 0;
			while (d1[k] == d2[k])
				k++;
			WHY(" data@%#lx", (unsigned long)(data_addr + k));
		}
		if (verbose || (diff && bad < 5))
			printf("trial %2d: %s end=sig%d@%#lx%s\n", t, diff ? "MISMATCH" : "ok", a.sig, (unsigned long)a.end,
			       why);
		bad += diff;
	}
	printf("reloc_harness: %d/%d trials matched\n", trials - bad, trials);
	return bad ? 1 : 0;
}
