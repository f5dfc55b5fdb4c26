//! Reading and writing a stopped thread's register sets (PTRACE_GETREGSET,
//! PTRACE_SETREGSET), for the architectures' `regs` modules: as bytes (a
//! set of variable size), or as a `#[repr(C)]` struct of the set's layout.

use std::io;

use nix::unistd::Pid;

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

/// PTRACE_GETREGSET into `T` (a `#[repr(C)]` register struct matching regset `nt`).
pub fn get_regset<T: Copy>(tid: Pid, nt: u32, out: &mut T) -> io::Result<usize> {
    // SAFETY: `out` is valid for writes of size_of::<T>() bytes, and a
    // register struct of plain integers takes any bytes the kernel writes.
    let bytes = unsafe { std::slice::from_raw_parts_mut((out as *mut T).cast::<u8>(), std::mem::size_of::<T>()) };
    get_regset_bytes(tid, nt, bytes)
}

/// PTRACE_SETREGSET from `T`.
pub fn set_regset<T: Copy>(tid: Pid, nt: u32, regs: &T) -> io::Result<()> {
    // SAFETY: `regs` is valid for reads of size_of::<T>() bytes.
    let bytes = unsafe { std::slice::from_raw_parts((regs as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
    set_regset_bytes(tid, nt, bytes)
}

/// PTRACE_GETREGSET into `out`, a buffer of any length (a regset of
/// variable size); returns how many bytes the kernel wrote.
pub fn get_regset_bytes(tid: Pid, nt: u32, out: &mut [u8]) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    // SAFETY: iov describes `out`, valid for writes of out.len() bytes; the
    // kernel writes at most iov_len bytes and updates iov_len.
    check(unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid.as_raw(), nt as usize, &mut iov as *mut libc::iovec) })?;
    Ok(iov.iov_len)
}

/// PTRACE_SETREGSET from the bytes of `data`.
pub fn set_regset_bytes(tid: Pid, nt: u32, data: &[u8]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: the kernel only reads iov_len bytes from `data`.
    check(unsafe { libc::ptrace(libc::PTRACE_SETREGSET, tid.as_raw(), nt as usize, &mut iov as *mut libc::iovec) })
        .map(drop)
}
