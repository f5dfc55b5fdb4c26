//! tp's cache on disk of what is slow to derive from a file and the same
//! every time: a module's symbols, the entries into its code and its DWARF
//! (`symbols::saved` says what and under which key). [`store`] owns the
//! directory (the running user's own, checked on every path component) and
//! its entries (whole or absent, bounded, evicted oldest first); [`codec`]
//! the byte format, read as untrusted input. Imports nothing of tp's.

pub mod codec;
pub mod store;

pub use codec::{Bad, Reader, Writer, hash64};
pub use store::{Store, name_for};
