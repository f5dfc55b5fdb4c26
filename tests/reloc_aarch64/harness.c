/*
 * harness.c - differential tester for relocated AArch64 instructions
 * (runs under qemu-aarch64 user mode, or on any arm64 Linux).
 *
 *   harness [-n TRIALS] [-c REG,REG..] [-b BYTES] [-t MS] [-v] ORIG_ADDR ORIG_HEX TRAMP_ADDR TRAMP_HEX
 *
 * Maps ORIG_HEX (the original instruction) at ORIG_ADDR and TRAMP_HEX (its
 * relocated copy with its literal pool, ending in a branch back) at
 * TRAMP_ADDR. Both live inside 1 MiB regions filled with `brk #imm16`
 * whose immediate derives from the address, so wherever control goes next
 * (the fall-through at ORIG_ADDR+4, a branch target) it traps at a recorded
 * address, and a load that reads the region sees address-dependent values.
 * For each trial both snippets run from the same state: x0-x30, SP, NZCV
 * (all 16 combinations over the trials) and v0-v31; registers point into a
 * 1 MiB data region now and then. The final states must be identical:
 * x0-x30, SP, NZCV, v0-v31, where control ended (trap address, or fault
 * signal and address) and the data region. Registers listed with -c (the
 * relocation's scratch registers, e.g. x16,x17) are not compared, nor
 * (-b) the BYTES below the initial SP, where a detour may save registers
 * (AAPCS64 lets a function use the stack below its SP). A run that
 * never traps is stopped after -t MS (default 500) and reported as sig14@0.
 *
 * Entry: a signal handler rewrites the interrupted context (registers, pc,
 * SIMD registers) and returns into the snippet. Exit: the trap (or fault)
 * handler saves the context and rewrites it back to the harness's own.
 * Exit status 0 when every trial matches. Under qemu-aarch64, run with
 * `-cpu max,sve=off`: with SVE, signal frames carry the SIMD registers in
 * an SVE record that overrides the one this harness edits.
 *
 * Adapted from the reloc_harness.c of tp's AArch64 research notes.
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

#if !defined(__aarch64__)
#error "AArch64 only"
#endif

#define DATA_ADDR 0x10000000UL
#define DATA_SIZE (1UL << 20)
#define REGION (1UL << 20)
#define NREG 31
#define FLAGS_MASK 0xf0000000ULL
#define FPSIMD_MAGIC 0x46508001
#define SVE_MAGIC 0x53564501

static const char *regname[NREG + 2] = {
    "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10",
    "x11", "x12", "x13", "x14", "x15", "x16", "x17", "x18", "x19", "x20", "x21",
    "x22", "x23", "x24", "x25", "x26", "x27", "x28", "x29", "x30", "sp", "nzcv"};

/* The kernel's struct fpsimd_context, a record in uc_mcontext.__reserved. */
struct fpsimd {
    uint32_t magic, size, fpsr, fpcr;
    __uint128_t v[32];
};

typedef struct {
    uint64_t r[NREG], sp, flags; /* flags: only FLAGS_MASK bits */
    __uint128_t v[32];
    uint64_t end; /* trap address, or fault address */
    int sig;      /* SIGTRAP = normal end; else the fault */
} state_t;

static state_t in_st, out_st;
static uint64_t entry_pc;
static struct {
    uint64_t r[NREG], sp, pc, flags;
    __uint128_t v[32];
} home; /* harness context to return to */

static void fatal(const char *m) {
    write(2, m, strlen(m));
    _exit(2);
}

/* The FP/SIMD record of a signal frame. An SVE record that carries
 * registers would override it on sigreturn, so that is refused: run qemu
 * with sve=off (a process that never used SVE has none on real kernels). */
static struct fpsimd *fpsimd_of(ucontext_t *uc) {
    unsigned char *p = uc->uc_mcontext.__reserved;
    struct fpsimd *found = NULL;
    for (;;) {
        struct fpsimd *h = (struct fpsimd *)p;
        if (h->magic == 0 || h->size == 0) break;
        if (h->magic == FPSIMD_MAGIC) found = h;
        if (h->magic == SVE_MAGIC && h->size > 16) fatal("harness: SVE registers in the signal frame; use -cpu max,sve=off\n");
        p += h->size;
    }
    if (!found) fatal("harness: no FP/SIMD record in the signal frame\n");
    return found;
}

static void get_ctx(ucontext_t *uc, uint64_t *r, uint64_t *sp, uint64_t *pc, uint64_t *fl, __uint128_t *v) {
    memcpy(r, uc->uc_mcontext.regs, NREG * 8);
    *sp = uc->uc_mcontext.sp;
    *pc = uc->uc_mcontext.pc;
    *fl = uc->uc_mcontext.pstate;
    memcpy(v, fpsimd_of(uc)->v, sizeof home.v);
}

static void set_ctx(ucontext_t *uc, const uint64_t *r, uint64_t sp, uint64_t pc, uint64_t fl, const __uint128_t *v) {
    memcpy(uc->uc_mcontext.regs, r, NREG * 8);
    uc->uc_mcontext.sp = sp;
    uc->uc_mcontext.pc = pc;
    uc->uc_mcontext.pstate = fl;
    memcpy(fpsimd_of(uc)->v, v, sizeof home.v);
}

static void on_enter(int sig, siginfo_t *si, void *p) {
    (void)sig; (void)si;
    ucontext_t *uc = p;
    get_ctx(uc, home.r, &home.sp, &home.pc, &home.flags, home.v);
    uint64_t fl = (home.flags & ~FLAGS_MASK) | (in_st.flags & FLAGS_MASK);
    set_ctx(uc, in_st.r, in_st.sp, entry_pc, fl, in_st.v);
}

static void on_exit_sig(int sig, siginfo_t *si, void *p) {
    ucontext_t *uc = p;
    uint64_t pc, fl;
    get_ctx(uc, out_st.r, &out_st.sp, &pc, &fl, out_st.v);
    out_st.flags = fl & FLAGS_MASK;
    out_st.sig = sig;
    if (sig == SIGTRAP)
        out_st.end = pc;
    else if (sig == SIGALRM)
        out_st.end = 0;
    else
        out_st.end = (uint64_t)(uintptr_t)si->si_addr;
    set_ctx(uc, home.r, home.sp, home.pc, home.flags, home.v);
}

static void die(const char *m) {
    fprintf(stderr, "harness: %s: %s\n", m, strerror(errno));
    exit(2);
}

static void map_trap_region(uint64_t addr) {
    uint64_t base = (addr & ~(uint64_t)0xfff) - REGION / 2;
    void *p = mmap((void *)base, REGION, PROT_READ | PROT_WRITE | PROT_EXEC,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != (void *)base) die("mmap code region (MAP_FIXED_NOREPLACE)");
    uint32_t *w = p;
    for (size_t i = 0; i < REGION / 4; i++) {
        uint64_t h = (base + 4 * i) * 0x9e3779b97f4a7c15ULL;
        w[i] = 0xd4200000 | (uint32_t)((h >> 48) << 5); /* brk #imm16 */
    }
}

static size_t unhex(const char *s, uint8_t *out, size_t max) {
    size_t n = 0;
    while (*s) {
        if (*s == ' ' || *s == ':' || *s == '_') { s++; continue; }
        unsigned v;
        if (n >= max || sscanf(s, "%2x", &v) != 1) { fprintf(stderr, "bad hex\n"); exit(2); }
        out[n++] = (uint8_t)v;
        s += 2;
    }
    return n;
}

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static void fill_data(void) {
    uint64_t *d = (uint64_t *)DATA_ADDR;
    for (size_t i = 0; i < DATA_SIZE / 8; i++) d[i] = 0x5a5a000000000000ULL | (i * 8);
}

static int timeout_ms = 500;

static void run(uint64_t pc, state_t *out, uint8_t *data_copy) {
    fill_data();
    entry_pc = pc;
    memset(&out_st, 0, sizeof out_st);
    struct itimerval it = {.it_value = {.tv_sec = timeout_ms / 1000,
                                        .tv_usec = (timeout_ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, 0);
    syscall(SYS_tgkill, getpid(), gettid(), SIGUSR1);
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, 0);
    *out = out_st;
    memcpy(data_copy, (void *)DATA_ADDR, DATA_SIZE);
}

int main(int argc, char **argv) {
    int trials = 64, verbose = 0;
    size_t below_sp = 0;
    int skip[NREG + 2] = {0};
    int opt;
    while ((opt = getopt(argc, argv, "n:c:b:t:v")) != -1) {
        if (opt == 'n') trials = atoi(optarg);
        else if (opt == 'b') below_sp = strtoul(optarg, 0, 0);
        else if (opt == 't') timeout_ms = atoi(optarg);
        else if (opt == 'v') verbose = 1;
        else if (opt == 'c') {
            char *s = strdup(optarg), *tok;
            for (tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
                for (int i = 0; i < NREG + 2; i++)
                    if (!strcmp(tok, regname[i])) skip[i] = 1;
        } else {
            fprintf(stderr, "usage: %s [-n N] [-c regs] [-t ms] [-v] ORIG_ADDR ORIG_HEX TRAMP_ADDR TRAMP_HEX\n", argv[0]);
            return 2;
        }
    }
    if (argc - optind != 4) { fprintf(stderr, "need 4 args\n"); return 2; }
    uint64_t orig = strtoull(argv[optind], 0, 0), tramp = strtoull(argv[optind + 2], 0, 0);
    static uint8_t code[4096];
    map_trap_region(orig);
    map_trap_region(tramp);
    size_t n = unhex(argv[optind + 1], code, sizeof code);
    memcpy((void *)orig, code, n);
    size_t m = unhex(argv[optind + 3], code, sizeof code);
    memcpy((void *)tramp, code, m);
    __builtin___clear_cache((char *)orig, (char *)orig + n);
    __builtin___clear_cache((char *)tramp, (char *)tramp + m);
    if (mmap((void *)DATA_ADDR, DATA_SIZE, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != (void *)DATA_ADDR)
        die("mmap data");

    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
    if (sigaltstack(&ss, 0)) die("sigaltstack");
    struct sigaction sa = {0};
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sa.sa_sigaction = on_enter;
    sigaction(SIGUSR1, &sa, 0);
    sa.sa_sigaction = on_exit_sig;
    int sigs[] = {SIGTRAP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGALRM};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, 0);

    static uint8_t d1[DATA_SIZE], d2[DATA_SIZE];
    int bad = 0;
    for (int t = 0; t < trials; t++) {
        rng = 0x9e3779b97f4a7c15ULL * (t + 1);
        for (int i = 0; i < NREG; i++) {
            switch (next() % 4) {
            case 0: in_st.r[i] = DATA_ADDR + DATA_SIZE / 2 + (uint64_t)i * 64; break;
            case 1: in_st.r[i] = 0; break;
            case 2: in_st.r[i] = next() % 64; break;
            default: in_st.r[i] = next(); break;
            }
        }
        for (int i = 0; i < 32; i++) in_st.v[i] = ((__uint128_t)next() << 64) | next();
        in_st.sp = DATA_ADDR + DATA_SIZE * 3 / 4;
        in_st.flags = ((uint64_t)(t % 16)) << 28;
        state_t a, b;
        run(orig, &a, d1);
        run(tramp, &b, d2);
        int diff = 0;
        char why[512] = "";
        size_t wl = 0;
        for (int i = 0; i < NREG; i++)
            if (!skip[i] && a.r[i] != b.r[i]) {
                diff = 1;
                wl += snprintf(why + wl, sizeof why - wl, " %s:%#lx/%#lx", regname[i],
                               (unsigned long)a.r[i], (unsigned long)b.r[i]);
            }
        for (int i = 0; i < 32 && wl < sizeof why; i++)
            if (a.v[i] != b.v[i]) {
                diff = 1;
                wl += snprintf(why + wl, sizeof why - wl, " v%d", i);
            }
        if (wl < sizeof why && !skip[NREG] && a.sp != b.sp) { diff = 1; wl += snprintf(why + wl, sizeof why - wl, " sp"); }
        if (wl < sizeof why && !skip[NREG + 1] && a.flags != b.flags) { diff = 1; wl += snprintf(why + wl, sizeof why - wl, " flags:%#lx/%#lx", (unsigned long)a.flags, (unsigned long)b.flags); }
        if (a.sig != b.sig || a.end != b.end) {
            diff = 1;
            if (wl < sizeof why)
                wl += snprintf(why + wl, sizeof why - wl, " end:sig%d@%#lx/sig%d@%#lx", a.sig,
                               (unsigned long)a.end, b.sig, (unsigned long)b.end);
        }
        if (below_sp && below_sp <= DATA_SIZE * 3 / 4) {
            size_t at = in_st.sp - DATA_ADDR - below_sp;
            memset(d1 + at, 0, below_sp);
            memset(d2 + at, 0, below_sp);
        }
        if (memcmp(d1, d2, DATA_SIZE)) {
            diff = 1;
            size_t k = 0;
            while (d1[k] == d2[k]) k++;
            if (wl < sizeof why) snprintf(why + wl, sizeof why - wl, " data@%#lx", (unsigned long)(DATA_ADDR + k));
        }
        if (verbose || (diff && bad < 5))
            printf("trial %2d: %s end=sig%d@%#lx%s\n", t, diff ? "MISMATCH" : "ok", a.sig,
                   (unsigned long)a.end, why);
        bad += diff;
    }
    printf("harness: %d/%d trials matched\n", trials - bad, trials);
    return bad ? 1 : 0;
}
