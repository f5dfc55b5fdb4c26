//! How a stopped thread's registers are reached, as far as an instruction
//! set decides it: through the kernel's register sets (by their `NT_*`
//! type) and the words of the thread's `struct user`. `process` issues the
//! ptrace calls behind [`RegisterSets`]; the architectures say which sets
//! make up their registers ([`crate::arch::Arch::read_regs`]) and what the
//! sets' bytes mean.

use std::io;

/// A stopped thread's register sets, read and written by their `NT_*` type
/// (PTRACE_GETREGSET, PTRACE_SETREGSET), and its `struct user`'s words
/// (PTRACE_POKEUSER).
pub trait RegisterSets {
    /// Reads set `nt` into `out`, a buffer of any length (a set of
    /// variable size); returns how many bytes the kernel wrote.
    fn read(&self, nt: u32, out: &mut [u8]) -> io::Result<usize>;
    /// Writes set `nt` from the bytes of `data`.
    fn write(&self, nt: u32, data: &[u8]) -> io::Result<()>;
    /// Writes the word of the thread's `struct user` at byte `offset`.
    fn write_user(&self, offset: usize, value: u64) -> io::Result<()>;
}

/// Reads set `nt` into `T` (a `#[repr(C)]` register struct matching the set).
pub(crate) fn read_into<T: Copy>(sets: &dyn RegisterSets, nt: u32, out: &mut T) -> io::Result<usize> {
    // SAFETY: `out` is valid for writes of size_of::<T>() bytes, and a
    // register struct of plain integers takes any bytes the kernel writes.
    let bytes = unsafe { std::slice::from_raw_parts_mut((out as *mut T).cast::<u8>(), std::mem::size_of::<T>()) };
    sets.read(nt, bytes)
}

/// Writes set `nt` from `T`.
pub(crate) fn write_from<T: Copy>(sets: &dyn RegisterSets, nt: u32, regs: &T) -> io::Result<()> {
    // SAFETY: `regs` is valid for reads of size_of::<T>() bytes.
    let bytes = unsafe { std::slice::from_raw_parts((regs as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
    sets.write(nt, bytes)
}
