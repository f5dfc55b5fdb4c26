//! One module (a mapped ELF file) of a process: its symbols with their
//! demangled names, its load bias, its separate debug information and DWARF,
//! all parsed on first use.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::demangle::Names;
use super::dwarf::{self, DwarfIndex};
use super::elf::{ElfFile, FuncSym};
use super::pattern::glob;
use super::verdict::Planner;
use super::{Function, cold_targets, debuginfo, suggestions};
use crate::addr::{Bias, RuntimeAddr};
use crate::arch::{Arch, Host, Isa};
use crate::process::Mapping;
use crate::process::maps::Span;

/// A file mapped into a process, with where it was loaded.
#[derive(Debug)]
pub struct Module {
    /// The file's path as the process sees it.
    pub path: PathBuf,
    /// Its file name, e.g. `libc.so.6`.
    pub name: String,
    /// Where its file addresses are at run time.
    pub bias: Bias,
    /// The addresses its mappings cover.
    pub span: Span,
    /// The parsed file (with symbols from its debug file if it is stripped).
    pub elf: ElfFile,
    /// Its separate debug file, if one was found.
    pub debug: Option<ElfFile>,
    names: OnceCell<Vec<Names>>,
    dwarf: OnceCell<Option<DwarfIndex>>,
    planner: OnceCell<Planner>,
}

impl Module {
    /// A module from the mappings of one file, read through `read_path`;
    /// `path` is the file as the process sees it, and `root` the directory
    /// its paths are relative to (`/proc/PID/root`, or `/`).
    pub fn load(read_path: &Path, path: &Path, root: &Path, mappings: &[&Mapping]) -> Result<Module> {
        let elf = ElfFile::open(read_path, path)?;
        if elf.machine != Host::ELF_MACHINE {
            bail!(
                "`{}` is {}; this tp traces {} processes",
                path.display(),
                crate::arch::machine_name(elf.machine),
                Host::NAME
            );
        }
        let first = mappings.iter().min_by_key(|m| m.offset).context("the module is not mapped")?;
        let bias = elf.bias_from(RuntimeAddr(first.start), first.offset).context("cannot compute the load bias")?;
        let span = Span {
            lo: mappings.iter().map(|m| m.start).min().unwrap_or(0),
            hi: mappings.iter().map(|m| m.end).max().unwrap_or(0),
        };
        Ok(Module::with(elf, path, root, bias, span))
    }

    /// A module for a file on disk that is not loaded anywhere (bias 0).
    pub fn from_file(path: &Path) -> Result<Module> {
        let elf = ElfFile::open(path, path)?;
        Ok(Module::with(elf, path, Path::new("/"), Bias::ZERO, Span { lo: 0, hi: 0 }))
    }

    /// The module of `elf` (the file `path`, under `root`), with the
    /// symbols of its separate debug file when it lacks its own.
    fn with(mut elf: ElfFile, path: &Path, root: &Path, bias: Bias, span: Span) -> Module {
        let debug = if elf.has_symtab && elf.has_dwarf() { None } else { debuginfo::find(&elf, path, root) };
        if let Some(d) = &debug {
            elf.adopt_symbols(d);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Module {
            path: path.to_path_buf(),
            name,
            bias,
            span,
            elf,
            debug,
            names: OnceCell::new(),
            dwarf: OnceCell::new(),
            planner: OnceCell::new(),
        }
    }

    /// The names of each symbol of `elf.functions`, demangled on first use.
    fn names(&self) -> &[Names] {
        self.names.get_or_init(|| self.elf.functions.iter().map(|f| Names::of(&f.name)).collect())
    }

    /// What planning a probe needs of this module beyond a function's bytes
    /// (entries, code facts), read on first use.
    pub fn planner(&self) -> &Planner {
        self.planner.get_or_init(|| Planner::of(self))
    }

    /// The module's DWARF index (from the file or its debug file), built on first use.
    pub fn dwarf(&self) -> Option<&DwarfIndex> {
        self.dwarf
            .get_or_init(|| {
                let src = [Some(&self.elf), self.debug.as_ref()].into_iter().flatten().find(|e| e.has_dwarf())?;
                dwarf::index(src).ok()
            })
            .as_ref()
    }

    fn function_of(&self, i: usize) -> Function {
        let sym = &self.elf.functions[i];
        Function {
            name: self.names()[i].display().to_string(),
            symbol: sym.name.clone(),
            module: self.name.clone(),
            addr: self.bias.runtime(sym.addr),
            size: sym.size,
            ifunc: sym.ifunc,
        }
    }

    /// Resolves the function called exactly `name` (mangled or demangled, with
    /// or without parameters), or explains what exists instead.
    pub fn function(&self, name: &str) -> Result<Function> {
        let names = self.names();
        if let Some(i) = (0..names.len()).find(|&i| names[i].all().any(|n| n == name)) {
            return Ok(self.function_of(i));
        }
        let hint = suggestions(name, names.iter().map(|n| n.display()));
        let stripped = if self.elf.has_symtab {
            ""
        } else {
            " (the file is stripped: only exported functions are known; install its debug symbols \
             or point TP_DEBUG_DIRS at them)"
        };
        bail!("function `{name}` not found in `{}`{stripped}{hint}", self.path.display())
    }

    /// True if a function is called exactly `name`.
    pub fn has_function(&self, name: &str) -> bool {
        self.names().iter().any(|n| n.all().any(|x| x == name))
    }

    /// Every function matching the glob `pattern`, one per address.
    pub fn matching(&self, pattern: &str) -> Vec<Function> {
        let mut out: Vec<Function> = Vec::new();
        for (i, names) in self.names().iter().enumerate() {
            let addr = self.bias.runtime(self.elf.functions[i].addr);
            if names.all().any(|n| glob(pattern, n)) && out.last().is_none_or(|f: &Function| f.addr != addr) {
                out.push(self.function_of(i));
            }
        }
        out
    }

    /// Every function whose symbol as stored (mangled) matches the glob
    /// `pattern`, without demangling anything.
    pub fn matching_symbols(&self, pattern: &str) -> Vec<Function> {
        let syms = &self.elf.functions;
        let mut out: Vec<Function> = Vec::new();
        for s in syms.iter() {
            let addr = self.bias.runtime(s.addr);
            if glob(pattern, &s.name) && out.last().is_none_or(|f: &Function| f.addr != addr) {
                let names = super::demangle::Names::of(&s.name);
                out.push(Function {
                    name: names.display().to_string(),
                    symbol: s.name.clone(),
                    module: self.name.clone(),
                    addr,
                    size: s.size,
                    ifunc: s.ifunc,
                });
            }
        }
        out
    }

    /// Every function, one per address (aliases dropped, globals preferred).
    pub fn functions(&self) -> Vec<Function> {
        let syms = &self.elf.functions;
        (0..syms.len()).filter(|&i| i == 0 || syms[i - 1].addr != syms[i].addr).map(|i| self.function_of(i)).collect()
    }

    /// The function symbol containing runtime address `addr`.
    pub fn function_containing(&self, addr: RuntimeAddr) -> Option<Function> {
        let link = self.bias.file(addr).0;
        let syms: &[FuncSym] = &self.elf.functions;
        let i = syms.iter().rposition(|f| f.addr.0 <= link && link < f.addr.0 + f.size.max(1))?;
        Some(self.function_of(i))
    }

    /// The file bytes of `f` (its code as built, before any patch).
    pub fn code_of(&self, f: &Function) -> Result<&[u8]> {
        self.elf
            .bytes_at(self.bias.file(f.addr), f.size)
            .with_context(|| format!("the code of `{}` is not in `{}`", f.name, self.path.display()))
    }

    /// Branch targets from split-off parts of `f` (`f.cold`), which jump back into it.
    pub fn extra_targets(&self, f: &Function) -> Vec<u64> {
        cold_targets(&self.elf, self.bias, &f.symbol, f.addr, f.size, Isa::host())
    }
}
