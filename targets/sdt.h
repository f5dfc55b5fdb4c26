/* sdt.h: SystemTap static probes (USDT) for tp's targets, written as
 * <sys/sdt.h> writes them (note type 3, "stapsdt"), so the targets need no
 * package and do not depend on a distribution's build flags.
 *
 *   TP_SDT_SEMAPHORE(provider, name)       defines provider_name_semaphore
 *   TP_SDT_ENABLED(provider, name)         true while a tracer holds it
 *   TP_SDT_PROBE(provider, name, "args", operands...)
 *   TP_SDT_PROBE_SEM(provider, name, "args", operands...)
 *
 * A probe is a `nop` where it is written, and a note in `.note.stapsdt`:
 * the nop's address, the address of `.stapsdt.base` (to detect prelinking),
 * the semaphore's address (or 0), then the provider, the name and the
 * argument string. Each argument is `SIZE@OPERAND`, a negative size for a
 * signed value, the operand printed by the compiler from an "nor"
 * constraint: a register (`%eax`, `x0`), memory (`-20(%rbp)`,
 * `counter(%rip)`, `[sp, 8]`) or a constant (`$5`, `5`):
 *
 *   TP_SDT_PROBE(tpsdt, tick, "-4@%[i] 8@%[v]", [i] "nor"(i), [v] "nor"(v));
 */
#ifndef TP_SDT_H
#define TP_SDT_H

#define TP_SDT_STR(x) #x
#define TP_SDT_XSTR(x) TP_SDT_STR(x)

/* The semaphore: a counter in `.probes` that tracers increment. */
#define TP_SDT_SEMAPHORE(provider, name) \
	__extension__ unsigned short provider##_##name##_semaphore __attribute__((used, section(".probes")))

#define TP_SDT_ENABLED(provider, name) __builtin_expect(provider##_##name##_semaphore != 0, 0)

#define TP_SDT_NOTE(provider, name, semaphore, args) \
	"990:	nop\n" \
	".pushsection .note.stapsdt,\"?\",\"note\"\n" \
	".balign 4\n" \
	".4byte 992f-991f, 994f-993f, 3\n" \
	"991:	.asciz \"stapsdt\"\n" \
	"992:	.balign 4\n" \
	"993:	.8byte 990b\n" \
	".8byte _.stapsdt.base\n" \
	".8byte " semaphore "\n" \
	".asciz \"" TP_SDT_STR(provider) "\"\n" \
	".asciz \"" TP_SDT_STR(name) "\"\n" \
	".asciz \"" args "\"\n" \
	"994:	.balign 4\n" \
	".popsection\n" \
	".ifndef _.stapsdt.base\n" \
	".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n" \
	".weak _.stapsdt.base\n" \
	".hidden _.stapsdt.base\n" \
	"_.stapsdt.base: .space 1\n" \
	".size _.stapsdt.base, 1\n" \
	".popsection\n" \
	".endif\n"

/* A probe without a semaphore. */
#define TP_SDT_PROBE(provider, name, args, ...) \
	__asm__ __volatile__(TP_SDT_NOTE(provider, name, "0", args) ::__VA_ARGS__)

/* A probe whose note names its semaphore (TP_SDT_SEMAPHORE). */
#define TP_SDT_PROBE_SEM(provider, name, args, ...) \
	__asm__ __volatile__(TP_SDT_NOTE(provider, name, TP_SDT_STR(provider##_##name##_semaphore), args) ::__VA_ARGS__)

#endif
