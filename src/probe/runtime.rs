//! The in-target runtime's machine code: `runtime/runtime.c`, compiled by
//! build.rs for the architecture tp is built for, one relocation-free blob
//! per function.

use crate::arch::RuntimeBlobs;

/// The runtime's functions for the host architecture.
pub fn blobs() -> RuntimeBlobs {
    RuntimeBlobs {
        entry: include_bytes!(concat!(env!("OUT_DIR"), "/tp_entry.bin")),
        exit: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit.bin")),
        unwind: include_bytes!(concat!(env!("OUT_DIR"), "/tp_unwind.bin")),
        entry_ext: include_bytes!(concat!(env!("OUT_DIR"), "/tp_entry_ext.bin")),
        exit_ext: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit_ext.bin")),
    }
}
