//! A module's DWARF index as the cache keeps it ([`super::saved`]): the
//! strings once each, then every function's record, which a lookup reads
//! alone (a module with thousands of functions needs only those it probes).
//! The bytes are checked whole, as untrusted input, the first time one is
//! read; damaged, the index says nothing.

use std::sync::OnceLock;

use super::dwarf::{DwFunction, DwarfIndex, Param, Type};
use crate::addr::FileAddr;
use crate::arch::Abi;
use crate::cache::{Bad, Reader, Writer};

/// A DWARF index as saved: its bytes, from which one function is read at
/// a time (a module with thousands of functions needs only the few it
/// probes).
///
/// The bytes: the strings (each once); the functions' entries (sorted) with
/// where each one's record is; the records (name, linkage name, calling
/// convention, return type, parameters, strings by number); the names of
/// the functions inlined everywhere.
#[derive(Debug, Clone)]
pub struct StoredDwarf {
    bytes: Vec<u8>,
    /// Where things are in `bytes`, found and checked on first use (None
    /// if the bytes are damaged).
    layout: OnceLock<Option<Layout>>,
}

/// Where the parts of a [`StoredDwarf`] are.
#[derive(Debug, Clone)]
struct Layout {
    /// Each string's place in the bytes.
    strings: Vec<(usize, usize)>,
    /// Each function's entry and its record's place in the bytes, by entry.
    table: Vec<(u64, usize)>,
    /// Where the names inlined everywhere start in the bytes.
    inlined_at: usize,
}

impl PartialEq for StoredDwarf {
    fn eq(&self, other: &StoredDwarf) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for StoredDwarf {}

impl StoredDwarf {
    /// `index` as saved.
    pub fn of(index: &DwarfIndex) -> StoredDwarf {
        let mut table: Vec<String> = Vec::new();
        let mut index_of: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        let mut str_id = |s: &str| -> u64 {
            if let Some(&i) = index_of.get(s) {
                return i;
            }
            let i = table.len() as u64;
            table.push(s.to_string());
            index_of.insert(s.to_string(), i);
            i
        };
        let mut records = Writer::new();
        let mut offsets = Vec::with_capacity(index.functions.len());
        for f in &index.functions {
            offsets.push(records.len());
            records.var(str_id(&f.name));
            match &f.linkage_name {
                Some(l) => records.var(str_id(l) + 1),
                None => records.var(0),
            };
            records.u8(abi_code(f.abi));
            match &f.return_type {
                Some((name, ty)) => {
                    records.u8(1).var(str_id(name));
                    ty_code(&mut records, ty);
                }
                None => {
                    records.u8(0);
                }
            }
            records.var(f.params.len() as u64);
            for p in &f.params {
                records.var(str_id(&p.name)).var(str_id(&p.type_name));
                ty_code(&mut records, &p.ty);
                match p.size {
                    Some(s) => records.u8(1).var(s),
                    None => records.u8(0),
                };
            }
        }
        let inlined: Vec<u64> = index.inlined_only.iter().map(|n| str_id(n)).collect();
        let mut w = Writer::new();
        w.var(table.len() as u64);
        for s in &table {
            w.str(s);
        }
        w.var(index.functions.len() as u64);
        let mut last = 0;
        for (f, off) in index.functions.iter().zip(offsets) {
            w.var(f.entry.0.wrapping_sub(last)).var(off as u64);
            last = f.entry.0;
        }
        w.blob(records.bytes());
        w.list(&inlined);
        StoredDwarf::from_bytes(w.into_bytes())
    }

    /// Its bytes, as saved.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Saved bytes, read (and checked) on first use.
    pub fn from_bytes(bytes: Vec<u8>) -> StoredDwarf {
        StoredDwarf { bytes, layout: OnceLock::new() }
    }

    fn layout(&self) -> Option<&Layout> {
        self.layout.get_or_init(|| Layout::parse(&self.bytes).ok()).as_ref()
    }

    fn string(&self, i: u64) -> String {
        let Some((off, len)) = self.layout().and_then(|l| l.strings.get(i as usize).copied()) else {
            return String::new();
        };
        // Checked UTF-8 when parsed.
        String::from_utf8_lossy(&self.bytes[off..off + len]).into_owned()
    }
}

impl Layout {
    /// The layout of saved bytes, checked whole: every string, entry and record.
    fn parse(bytes: &[u8]) -> Result<Layout, Bad> {
        let mut r = Reader::new(bytes);
        let n = r.count(1)?;
        let mut strings = Vec::with_capacity(n);
        for _ in 0..n {
            let s = r.str()?;
            strings.push((s.as_ptr() as usize - bytes.as_ptr() as usize, s.len()));
        }
        let n = r.count(2)?;
        let mut entries = Vec::with_capacity(n);
        let mut last = 0u64;
        for i in 0..n {
            let d = r.var()?;
            if i > 0 && d == 0 {
                return Err(Bad("functions out of order"));
            }
            last = last.checked_add(d).ok_or(Bad("an address out of range"))?;
            entries.push((last, r.var()?));
        }
        let records = r.blob()?;
        let base = records.as_ptr() as usize - bytes.as_ptr() as usize;
        let mut table = Vec::with_capacity(entries.len());
        for (entry, off) in entries {
            let off = usize::try_from(off).ok().filter(|&o| o < records.len()).ok_or(Bad("a record out of range"))?;
            check_record(&mut Reader::new(&records[off..]), strings.len())?;
            table.push((entry, base + off));
        }
        let inlined_at = bytes.len() - r.left();
        for i in r.list()? {
            if i >= strings.len() as u64 {
                return Err(Bad("a string out of range"));
            }
        }
        r.finish()?;
        Ok(Layout { strings, table, inlined_at })
    }
}

impl StoredDwarf {
    /// The function entered at `entry`.
    pub fn at(&self, entry: FileAddr) -> Option<DwFunction> {
        let table = &self.layout()?.table;
        let k = table.binary_search_by_key(&entry.0, |&(e, _)| e).ok()?;
        let (entry, off) = table[k];
        self.read(entry, off)
    }

    /// The record at `off` in `bytes` (checked when parsed).
    fn read(&self, entry: u64, off: usize) -> Option<DwFunction> {
        let r = &mut Reader::new(self.bytes.get(off..)?);
        let s = |r: &mut Reader| r.var().ok().map(|i| self.string(i));
        let name = s(r)?;
        let linkage_name = match r.var().ok()? {
            0 => None,
            k => Some(self.string(k - 1)),
        };
        let abi = abi_of(r.u8().ok()?).ok()?;
        let return_type = match r.u8().ok()? {
            0 => None,
            _ => Some((s(r)?, ty_of(r).ok()?)),
        };
        let n = r.var().ok()?;
        let mut params = Vec::new();
        for _ in 0..n {
            let (name, type_name, ty) = (s(r)?, s(r)?, ty_of(r).ok()?);
            let size = match r.u8().ok()? {
                0 => None,
                _ => Some(r.var().ok()?),
            };
            params.push(Param { name, type_name, ty, size });
        }
        Some(DwFunction { name, linkage_name, entry: FileAddr(entry), params, return_type, abi })
    }

    /// The whole index; None if the bytes are damaged.
    pub fn index(&self) -> Option<DwarfIndex> {
        let layout = self.layout()?;
        let functions = layout.table.iter().filter_map(|&(entry, off)| self.read(entry, off)).collect();
        let mut r = Reader::new(&self.bytes[layout.inlined_at..]);
        let inlined_only = r.list().unwrap_or_default().into_iter().map(|i| self.string(i)).collect();
        Some(DwarfIndex { functions, inlined_only })
    }
}

/// Checks one record of a [`StoredDwarf`] with `strings` strings, reading
/// no more than it.
fn check_record(r: &mut Reader, strings: usize) -> Result<(), Bad> {
    let string = |r: &mut Reader| match r.var()? {
        i if i < strings as u64 => Ok(()),
        _ => Err(Bad("a string out of range")),
    };
    string(r)?;
    if let k @ 1.. = r.var()?
        && k > strings as u64
    {
        return Err(Bad("a string out of range"));
    }
    abi_of(r.u8()?)?;
    match r.u8()? {
        0 => {}
        1 => {
            string(r)?;
            ty_of(r)?;
        }
        _ => return Err(Bad("an unknown return type tag")),
    }
    let n = r.count(4)?;
    for _ in 0..n {
        string(r)?;
        string(r)?;
        ty_of(r)?;
        match r.u8()? {
            0 => {}
            1 => {
                r.var()?;
            }
            _ => return Err(Bad("an unknown size tag")),
        }
    }
    Ok(())
}

fn abi_code(a: Abi) -> u8 {
    match a {
        Abi::C => 0,
        Abi::Go => 1,
        Abi::GoStack => 2,
    }
}

fn abi_of(code: u8) -> Result<Abi, Bad> {
    Ok(match code {
        0 => Abi::C,
        1 => Abi::Go,
        2 => Abi::GoStack,
        _ => return Err(Bad("an unknown calling convention")),
    })
}

fn ty_code(w: &mut Writer, t: &Type) {
    match t {
        Type::Signed(n) => w.u8(0).u8(*n),
        Type::Unsigned(n) => w.u8(1).u8(*n),
        Type::Bool => w.u8(2),
        Type::Char => w.u8(3),
        Type::CString => w.u8(4),
        Type::Pointer => w.u8(5),
        Type::Float => w.u8(6),
        Type::Other => w.u8(7),
        Type::Enum(n, names) => {
            w.u8(8).u8(*n).var(names.len() as u64);
            for (v, name) in names {
                w.u64(*v as u64).str(name);
            }
            w
        }
    };
}

fn ty_of(r: &mut Reader) -> Result<Type, Bad> {
    Ok(match r.u8()? {
        0 => Type::Signed(r.u8()?),
        1 => Type::Unsigned(r.u8()?),
        2 => Type::Bool,
        3 => Type::Char,
        4 => Type::CString,
        5 => Type::Pointer,
        6 => Type::Float,
        7 => Type::Other,
        8 => {
            let size = r.u8()?;
            // A value and a string's length at least.
            let n = r.count(9)?;
            let mut names = Vec::with_capacity(n);
            for _ in 0..n {
                names.push((r.u64()? as i64, r.string()?));
            }
            Type::Enum(size, names)
        }
        _ => return Err(Bad("an unknown type")),
    })
}
