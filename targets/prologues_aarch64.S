/* prologues_aarch64.S: functions whose first instruction (after a landing
 * pad, for p_bti and p_pac) is each class tp must relocate on AArch64, and
 * a few it must refuse. prologues_aarch64.c calls them and checks every result
 * against a C reference.
 *
 * Everything sits in one page-aligned, page-padded section, so the BTI
 * build of prologues_aarch64.c can mprotect exactly these pages with PROT_BTI:
 * Debian's crt and libc carry no BTI note, so the kernel would not guard
 * them itself, and guarding libc's pages would fault on its own calls.
 * In a guarded page an indirect call (blr) must land on `bti c` or
 * `paciasp`; direct calls (bl) and branches (b) are not checked.
 *
 * A function whose first instruction is `bl`, `blr` or a conditional branch
 * on the flags is entered through a small wrapper (call_*) that sets up
 * what it needs: the caller's return address in x9, the flags from x0.
 */
	.section .text.tp_guarded, "ax", %progbits
	.balign 4096
	.globl tp_guarded_start
tp_guarded_start:

	.macro FUNC name
	.globl \name
	.type \name, %function
	.balign 16
\name:
	.endm

	.macro END name
	.size \name, . - \name
	.endm

/* adr x1, K1 */
FUNC p_adr
	adr	x1, k1
	ldr	x1, [x1]
	add	x0, x0, x1
	ret
END p_adr

/* adrp x1, K2 (in .rodata, another page) */
FUNC p_adrp
	adrp	x1, k2
	add	x1, x1, :lo12:k2
	ldr	x1, [x1]
	eor	x0, x0, x1
	ret
END p_adrp

/* ldr x1, literal */
FUNC p_ldr_x
	ldr	x1, k1
	add	x0, x0, x1
	ret
END p_ldr_x

/* ldr w1, literal (zero-extends) */
FUNC p_ldr_w
	ldr	w1, k3
	add	x0, x0, x1
	ret
END p_ldr_w

/* ldrsw x1, literal (sign-extends) */
FUNC p_ldrsw
	ldrsw	x1, k3
	add	x0, x0, x1
	ret
END p_ldrsw

/* prfm pldl1keep, literal */
FUNC p_prfm
	prfm	pldl1keep, k1
	add	x0, x0, #7
	ret
END p_prfm

/* ldr d0, literal */
FUNC p_ldr_d
	ldr	d0, k1
	fmov	x1, d0
	eor	x0, x0, x1
	ret
END p_ldr_d

/* ldr q0, literal */
FUNC p_ldr_q
	ldr	q0, k4
	umov	x1, v0.d[1]
	add	x0, x0, x1
	ret
END p_ldr_q

/* b forward */
FUNC p_b
	b	1f
	brk	#1
1:	add	x0, x0, #3
	ret
END p_b

/* bl: entered with the caller's return address in x9 */
FUNC p_bl
	bl	p_helper
	mov	x30, x9
	ret
END p_bl

/* b.ne on the flags the wrapper set from x0's bit 0 */
FUNC p_bcond
	b.ne	1f
	add	x0, x0, #100
	ret
1:	sub	x0, x0, #100
	ret
END p_bcond

/* cbz x1 */
FUNC p_cbz
	cbz	x1, 1f
	add	x0, x0, #1
	ret
1:	add	x0, x0, #2
	ret
END p_cbz

/* cbnz w1 */
FUNC p_cbnz
	cbnz	w1, 1f
	eor	x0, x0, #0xff
	ret
1:	eor	x0, x0, #0xf0
	ret
END p_cbnz

/* tbz x0, #1 */
FUNC p_tbz
	tbz	x0, #1, 1f
	add	x0, x0, #5
	ret
1:	sub	x0, x0, #5
	ret
END p_tbz

/* tbnz x0, #2 */
FUNC p_tbnz
	tbnz	x0, #2, 1f
	lsl	x0, x0, #1
	ret
1:	lsr	x0, x0, #1
	ret
END p_tbnz

/* blr x1: entered with the callee in x1 and the caller's return address in x9 */
FUNC p_blr
	blr	x1
	mov	x30, x9
	ret
END p_blr

/* a lone ret */
FUNC p_ret
	ret
END p_ret

/* bti c, then adrp: called through a pointer */
FUNC p_bti
	bti	c
	adrp	x1, k2
	add	x1, x1, :lo12:k2
	ldr	x1, [x1]
	add	x0, x0, x1
	ret
END p_bti

/* paciasp, then a frame, a call, and autiasp: called through a pointer */
FUNC p_pac
	paciasp
	stp	x29, x30, [sp, #-16]!
	mov	x29, sp
	bl	p_helper
	ldp	x29, x30, [sp], #16
	autiasp
	ret
END p_pac

/* adr x1, . : the function's own address, as data (a callback, a
 * comparison): x0 + 17 only if it is the address stored in .data */
FUNC p_self
	adr	x1, p_self
	adrp	x2, self_addr
	ldr	x2, [x2, :lo12:self_addr]
	mov	x3, #17
	cmp	x1, x2
	csel	x3, x3, xzr, eq
	add	x0, x0, x3
	ret
END p_self

/* Refused by tp: an exclusive load, a system register read, a syscall. */
FUNC p_ldxr
	ldxr	x1, [x0]
	stxr	w2, x1, [x0]
	mov	x0, x1
	ret
END p_ldxr

FUNC p_mrs
	mrs	x0, tpidr_el0
	ret
END p_mrs

FUNC p_svc
	svc	#0
	ret
END p_svc

/* x0 + 11; a landing pad because p_blr reaches it with blr */
FUNC p_helper
	bti	c
	add	x0, x0, #11
	ret
END p_helper

/* No landing pad: calling it through a pointer in a guarded page must fault. */
FUNC tp_bti_canary
	mov	x0, #1
	ret
END tp_bti_canary

/* Wrappers, called directly from C. */
FUNC call_p_bl
	mov	x9, x30
	b	p_bl
END call_p_bl

FUNC call_p_blr
	mov	x9, x30
	adr	x1, p_helper
	b	p_blr
END call_p_blr

FUNC call_p_bcond
	tst	x0, #1
	b	p_bcond
END call_p_bcond

	.balign 16
k1:	.quad	0x0123456789abcdef
k3:	.word	0x89abcdef
	.balign 16
k4:	.quad	0x1111111111111111, 0x7766554433221100

	.balign 4096
	.globl tp_guarded_end
tp_guarded_end:

	.section .rodata
	.balign 8
k2:	.quad	0x5a5a5a5a00c0ffee

	.data
	.balign 8
self_addr:
	.quad	p_self

	.section .note.GNU-stack, "", %progbits
