/* prologues: calls the hand-written functions of prologues_x86_64.S on
 * command and checks each result against the function's unprobed twin.
 *
 * Commands (one per line on stdin; each answer is one line on stdout):
 *   call NAME N   calls pr_NAME(x) for x = 1..N
 *                 -> "done NAME calls=N checksum=ok|BAD"
 *   list          -> "functions NAME NAME ..."
 *   quit          -> exit status 0, or 1 if any checksum failed
 */
#include "common.h"

typedef uint64_t (*fn_t)(uint64_t);

#define PAIR(n) uint64_t pr_##n(uint64_t), pr_##n##_ref(uint64_t);
#define FUNCS(X) X(movabs) X(push) X(endbr) X(rip_load) X(rip_store) X(rip_imm) X(rip_lea) X(rip_sse) \
	X(fs) X(nopw) X(jcc8) X(jcc32) X(jmp8) X(tail) X(jmp_rip) X(ret) X(call) X(call_next) X(call_mem) \
	X(loop) X(jrcxz) X(syscall) X(self) X(self_cmp) X(short) X(shared_ret)
FUNCS(PAIR)

/* pr_self's callback: called with the function's own address, as the
 * function computed it. Anything but one of the two copies' entries is a
 * wrong answer (and never called). */
TP_PROBED uint64_t self_check(uint64_t (*fn)(uint64_t), uint64_t x)
{
	if (fn != pr_self && fn != pr_self_ref)
		return 0;
	if (x % 2 == 0)
		return x * 5 + 1;
	return fn(x + 1) + 3; /* the callback: x + 1 is even, one level deep */
}

/* Compiled prologues with indirect jumps: a switch through a jump table
 * and a computed goto, each keeping a frame pointer so the window holds
 * several instructions. tp accepts them only after following the table and
 * the stored label addresses. */
TP_PROBED uint64_t c_helper(uint64_t x)
{
	return x * 7;
}

#define SWITCH_BODY(x)                                                                                      \
	switch (((x) >> 3) & 15) {                                                                               \
	case 0: return (x) * 3;                                                                             \
	case 1: return (x) ^ 0x5555;                                                                        \
	case 2: return (x) >> 2;                                                                            \
	case 3: return (x) + 7;                                                                             \
	case 4: return ~(x);                                                                                \
	case 5: return (x) * (x);                                                                           \
	case 6: return (x) << 3;                                                                            \
	case 7: return (x) - 99;                                                                            \
	case 8: return (x) / 3;                                                                             \
	case 9: return (x) % 1000;                                                                          \
	default: return c_helper(x) | 0xf0;                                                                 \
	}

#define GOTO_BODY(x)                                                                                        \
	static void *const labels[] = {&&l0, &&l1, &&l2, &&l3};                                             \
	uint64_t acc = (x);                                                                                 \
	goto *labels[acc & 3];                                                                              \
	l0: return acc * 5;                                                                                 \
	l1: return acc + 11;                                                                                \
	l2: return acc ^ 0xff;                                                                              \
	l3: return acc >> 1;

#define FRAME __attribute__((noinline, noclone, noipa, used, optimize("no-omit-frame-pointer")))
FRAME uint64_t pr_switch(uint64_t x) { SWITCH_BODY(x) }
FRAME uint64_t pr_switch_ref(uint64_t x) { SWITCH_BODY(x) }
FRAME uint64_t pr_goto(uint64_t x) { GOTO_BODY(x) }
FRAME uint64_t pr_goto_ref(uint64_t x) { GOTO_BODY(x) }

static const struct {
	const char *name;
	fn_t probed, ref;
} funcs[] = {
#define ENTRY(n) {#n, pr_##n, pr_##n##_ref},
	FUNCS(ENTRY) ENTRY(switch) ENTRY(goto)
};

#define NFUNCS (sizeof funcs / sizeof *funcs)

int main(void)
{
	char line[256];
	int failed = 0;
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		char name[64] = "";
		unsigned long long n = 0;
		if (sscanf(line, "call %63s %llu", name, &n) == 2) {
			size_t k = 0;
			while (k < NFUNCS && strcmp(funcs[k].name, name) != 0)
				k++;
			if (k == NFUNCS) {
				printf("error unknown function: %s\n", name);
				continue;
			}
			int ok = 1;
			for (uint64_t x = 1; x <= n; x++)
				ok &= funcs[k].probed(x) == funcs[k].ref(x);
			failed |= !ok;
			printf("done %s calls=%llu checksum=%s\n", name, n, ok ? "ok" : "BAD");
		} else if (strcmp(line, "list") == 0) {
			printf("functions");
			for (size_t k = 0; k < NFUNCS; k++)
				printf(" %s", funcs[k].name);
			printf("\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return failed;
}
