//! Reading and writing another process's memory through `/proc/PID/mem`.
//!
//! Writes through this file use FOLL_FORCE, so they reach read-only and
//! executable pages without changing their protection (process_vm_writev
//! cannot). The caller must have ptrace access to the process.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;

use anyhow::{Context, Result};

/// An open `/proc/PID/mem`.
#[derive(Debug)]
pub struct Memory {
    file: File,
    pid: i32,
}

impl Memory {
    /// Opens the memory of `pid` for reading and writing.
    pub fn open(pid: i32) -> Result<Memory> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot open the memory of process {pid}"))?;
        Ok(Memory { file, pid })
    }

    /// The process this memory belongs to.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads exactly `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, addr)
    }

    /// Reads `len` bytes at `addr` into a new vector.
    pub fn read_vec(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    /// Reads up to `len` bytes at `addr`, stopping early at unreadable memory.
    pub fn read_partial(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        let mut done = 0;
        while done < len {
            match self.file.read_at(&mut v[done..], addr + done as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        v.truncate(done);
        v
    }

    /// Reads a little-endian u64 at `addr`.
    pub fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes all of `bytes` at `addr` in one `pwrite`.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        let n = self.file.write_at(bytes, addr)?;
        if n != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, format!("short write at {addr:#x}")));
        }
        Ok(())
    }
}
