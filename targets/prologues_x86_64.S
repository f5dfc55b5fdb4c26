/* Hand-written x86-64 prologues: one function per rewrite the relocator
 * does (pr_*) and one per refusal the planner makes (r_*).
 *
 * Every pr_* function takes x in rdi and returns a value in rax; its body
 * is assembled twice, as pr_NAME (probed by the tests) and pr_NAME_ref (never
 * probed), so the driver (prologues.c) checks every result of the probed
 * copy against the reference. The r_* functions are never called: tests
 * only check that tp refuses them, with the reason named.
 */
	.intel_syntax noprefix
	.text

	.macro FUNC name
	.globl \name
	.type \name, @function
	.p2align 4
\name:
	.endm

	.macro ENDF name
	.size \name, . - \name
	.endm

	/* pr_NAME and pr_NAME_ref from the macro body_NAME. */
	.macro PAIR name
	FUNC pr_\name
	body_\name
	ENDF pr_\name
	FUNC pr_\name\()_ref
	body_\name
	ENDF pr_\name\()_ref
	.endm

/* Helpers that the rewritten windows call or jump to. */
	.type helper_add1, @function
	.p2align 4
helper_add1:
	lea rax, [rdi + 1]
	ret
	.size helper_add1, . - helper_add1

/* One instruction of 10 bytes: the whole window. */
	.macro body_movabs
	movabs rax, 0x9e3779b97f4a7c15
	imul rax, rdi
	ret
	.endm
	PAIR movabs

/* Several plain instructions. */
	.macro body_push
	push rbp
	mov rbp, rsp
	push rbx
	lea rax, [rdi + 3]
	pop rbx
	pop rbp
	ret
	.endm
	PAIR push

/* endbr64 stays; the window starts after it. */
	.macro body_endbr
	endbr64
	push rbx
	mov rbx, rdi
	lea rax, [rbx + rbx*2]
	pop rbx
	ret
	.endm
	PAIR endbr

/* RIP-relative load, store, compare with an immediate, lea, SSE load. */
	.macro body_rip_load
	mov rax, qword ptr [rip + g_value]
	add rax, rdi
	ret
	.endm
	PAIR rip_load

	.macro body_rip_store
	mov qword ptr [rip + g_scratch], rdi
	mov rax, qword ptr [rip + g_scratch]
	add rax, 1
	ret
	.endm
	PAIR rip_store

	.macro body_rip_imm
	cmp qword ptr [rip + g_value], 0x1234
	jne 1f
	lea rax, [rdi + 2]
	ret
1:	xor eax, eax
	ret
	.endm
	PAIR rip_imm

	.macro body_rip_lea
	lea rax, [rip + g_value]
	mov rax, qword ptr [rax]
	add rax, rdi
	ret
	.endm
	PAIR rip_lea

	.macro body_rip_sse
	movsd xmm0, qword ptr [rip + g_three]
	cvttsd2si rax, xmm0
	add rax, rdi
	ret
	.endm
	PAIR rip_sse

/* A segment prefix: the stack protector's canary. */
	.macro body_fs
	mov rax, qword ptr fs:[0x28]
	xor rax, qword ptr fs:[0x28]
	add rax, rdi
	ret
	.endm
	PAIR fs

/* A long nop with prefixes. */
	.macro body_nopw
	nop word ptr cs:[rax + rax]
	lea rax, [rdi + 4]
	ret
	.endm
	PAIR nopw

/* jcc rel8 inside the window (widened). */
	.macro body_jcc8
	test dil, 1
	jnz 1f
	mov rax, rdi
	shr rax, 1
	ret
1:	lea rax, [rdi + rdi*2]
	ret
	.endm
	PAIR jcc8

/* jcc rel32 inside the window. */
	.macro body_jcc32
	cmp rdi, 100
	{disp32} jae 1f
	lea rax, [rdi + 100]
	ret
1:	lea rax, [rdi - 100]
	ret
	.endm
	PAIR jcc32

/* jmp rel8 ends the window; the byte after it never runs. */
	.macro body_jmp8
	mov eax, edi
	jmp 1f
	int3
1:	add rax, 5
	ret
	.endm
	PAIR jmp8

/* A tail call: jmp rel32, one instruction. */
	.macro body_tail
	{disp32} jmp helper_add1
	.endm
	PAIR tail

/* A tail call through a pointer: jmp [rip + x]. */
	.macro body_jmp_rip
	jmp qword ptr [rip + g_helper]
	.endm
	PAIR jmp_rip

/* ret inside the window, after what runs. */
	.macro body_ret
	lea rax, [rdi + 1]
	ret
	int3
	int3
	.endm
	PAIR ret

/* A return that is a branch target with reachable code right after it: no
 * window of its own (a return probe sees this function's calls end through
 * the return address). */
	.macro body_shared_ret
	test rdi, rdi
	jne 2f
	xor eax, eax
1:	ret
2:	lea rax, [rdi + 1]
	cmp rax, 5
	jb 1b
	ret
	.endm
	PAIR shared_ret

/* Shorter than the jump: the window takes the alignment padding after it,
 * which nothing reaches. */
	.macro body_short
	lea eax, [rdi + 2]
	ret
	.endm
	PAIR short

/* A call as the window's last instruction: the callee returns to the
 * original code. */
	.macro body_call
	push rbx
	call helper_add1
	pop rbx
	ret
	.endm
	PAIR call

/* The call pushes its own address: the return address must be the original. */
	.macro body_call_next
	call 1f
1:	pop rax
	lea rdx, [rip + 1b]
	sub rax, rdx
	add rax, rdi
	ret
	.endm
	PAIR call_next

/* An indirect call through memory, last. */
	.macro body_call_mem
	push rbx
	call qword ptr [rip + g_helper]
	pop rbx
	ret
	.endm
	PAIR call_mem

/* loop and jrcxz (rel8 only: rewritten). */
	.macro body_loop
	mov rcx, rdi
	loop 1f
	mov eax, 99
	ret
1:	lea rax, [rcx + 10]
	ret
	.endm
	PAIR loop

	.macro body_jrcxz
	mov rcx, rdi
	jrcxz 1f
	lea rax, [rdi + rdi]
	ret
1:	mov eax, 77
	ret
	.endm
	PAIR jrcxz

/* A syscall as the window's last instruction (getpid). */
	.macro body_syscall
	push 39
	pop rax
	syscall
	add rax, rdi
	ret
	.endm
	PAIR syscall

/* The function's own address as data, taken by the window's first
 * instruction: passed as a callback to self_check (prologues.c), which
 * knows both copies' addresses and calls back only a real one. The copy in
 * tp's detour must compute the original's address, not its own. */
	.macro body_self
0:	lea rax, [rip + 0b]
	mov rsi, rdi
	mov rdi, rax
	jmp self_check
	.endm
	PAIR self

/* ... and compared, by the window's second instruction: an address taken
 * of the window's first byte. Returns x + 17 only if it is one of the two
 * copies' entries (listed in data). */
	.macro body_self_cmp
0:	push rbx
	lea rbx, [rip + 0b]
	lea rax, [rdi + 17]
	cmp rbx, qword ptr [rip + g_self_cmp]
	je 1f
	cmp rbx, qword ptr [rip + g_self_cmp + 8]
	je 1f
	mov rax, rdi
1:	pop rbx
	ret
	.endm
	PAIR self_cmp

/* ---- refusals ---- */

/* Too short for a 5-byte jump, and another function right after it: no
 * padding to take. */
FUNC r_too_short
	xor eax, eax
	ret
ENDF r_too_short
	.globl r_after_short
	.type r_after_short, @function
r_after_short:
	ret
	.size r_after_short, . - r_after_short

/* Traps and interrupts cannot run out of place. */
FUNC r_int3
	int3
	nop
	nop
	nop
	nop
	ret
ENDF r_int3

FUNC r_ud2
	ud2
	nop
	nop
	nop
	ret
ENDF r_ud2

FUNC r_int80
	int 0x80
	nop
	nop
	nop
	ret
ENDF r_int80

/* A call before the window's end: a thread inside the callee would return
 * into the patched bytes. */
FUNC r_call_first
	call qword ptr [rdi]
	nop
	nop
	nop
	ret
ENDF r_call_first

/* Likewise a syscall (a thread blocked in it resumes after it). */
FUNC r_syscall_first
	syscall
	nop
	nop
	nop
	ret
ENDF r_syscall_first

/* A branch later in the function targets the window's interior. */
FUNC r_branch_into
	push rbp
1:	mov rbp, rsp
	push rbx
	dec rdi
	jnz 1b
	pop rbx
	pop rbp
	ret
ENDF r_branch_into

/* A switch whose table sends one case into the window's interior. */
FUNC r_indirect
	push rbp
1:	mov rbp, rsp
	push rbx
	lea rdx, [rip + .Lswitch]
	movsxd rax, dword ptr [rdx + rdi*4]
	add rax, rdx
	jmp rax
2:	pop rbx
	pop rbp
	ret
ENDF r_indirect
	.section .rodata
	.p2align 2
.Lswitch:
	.long 2b - .Lswitch
	.long 1b - .Lswitch
	.text

/* Bytes the decoder does not know, after the window. */
FUNC r_undecodable
	push rbp
	mov rbp, rsp
	push rbx
	ret
	.byte 0x06
ENDF r_undecodable

/* The symbol's size ends inside the window's second instruction. */
FUNC r_past_end
	push rbx
	movabs rax, 0x1122334455667788
	.size r_past_end, 5
	ret

/* Another function starts inside the window. */
FUNC r_outer
	xor eax, eax
	.globl r_inner
	.type r_inner, @function
r_inner:
	mov ecx, 1
	ret
	.size r_inner, . - r_inner
ENDF r_outer

/* Its split-off part jumps into the window. */
FUNC r_cold
	xor eax, eax
2:	mov ecx, 1
	ret
ENDF r_cold
	.type r_cold.cold, @function
r_cold.cold:
	jmp 2b
	.size r_cold.cold, . - r_cold.cold

/* An exception landing pad inside the window (its LSDA is below). */
	.type r_personality, @function
r_personality:
	ud2
	.size r_personality, . - r_personality

FUNC r_landing_pad
	.cfi_startproc
	.cfi_personality 0x1b, r_personality
	.cfi_lsda 0x1b, .Llsda_landing_pad
	xor eax, eax
.Lpad:
	mov ecx, 1
.Lcall_start:
	call helper_add1
.Lcall_end:
	ret
	.cfi_endproc
ENDF r_landing_pad

	.section .gcc_except_table, "a", @progbits
.Llsda_landing_pad:
	.byte 0xff			/* LPStart: the function's start */
	.byte 0xff			/* no type table */
	.byte 0x01			/* call sites: uleb128 */
	.uleb128 .Lcs_end - .Lcs_begin
.Lcs_begin:
	.uleb128 .Lcall_start - r_landing_pad
	.uleb128 .Lcall_end - .Lcall_start
	.uleb128 .Lpad - r_landing_pad
	.uleb128 0
.Lcs_end:

	.data
	.p2align 3
g_value:
	.quad 0x1234
g_scratch:
	.quad 0
g_three:
	.double 3.0
g_helper:
	.quad helper_add1
g_self_cmp:
	.quad pr_self_cmp, pr_self_cmp_ref

	.section .note.GNU-stack, "", @progbits
