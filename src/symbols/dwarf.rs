//! DWARF with gimli: the functions a module's debugging information
//! describes, their entry addresses, parameters (name and type) and return
//! type, and the functions that exist only inlined into others. A function
//! of a Go compilation unit (DW_AT_language Go, or a producer `Go
//! cmd/compile`) takes Go's calling convention, and its results, which Go
//! lists as parameters (`~r0`, DW_AT_variable_parameter), are not
//! arguments.

use std::borrow::Cow;

use anyhow::Result;
use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};

use super::elf::ElfFile;
use crate::addr::FileAddr;
use crate::arch::Abi;

pub(super) type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// How a value is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    /// A signed integer of this many bytes.
    Signed(u8),
    /// An enum of this many bytes, and its enumerators (value, name) sorted
    /// by value: a value is shown by its name where one has it.
    Enum(u8, Vec<(i64, String)>),
    /// An unsigned integer of this many bytes.
    Unsigned(u8),
    /// `bool` / `_Bool`.
    Bool,
    /// `char` (signed or not): shown as a character.
    Char,
    /// A pointer to a (possibly const) `char`: shown as a string, best effort.
    CString,
    /// Any other pointer.
    Pointer,
    /// A floating-point value (passed in vector registers, not recorded).
    Float,
    /// Anything else (structs, unions, arrays): not shown.
    Other,
}

/// A formal parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name (`this` for C++'s artificial parameter).
    pub name: String,
    /// Its type's name as written (`const char *`).
    pub type_name: String,
    /// How to show it.
    pub ty: Type,
    /// Its size in bytes, if known.
    pub size: Option<u64>,
}

/// A function with code of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DwFunction {
    /// DW_AT_name.
    pub name: String,
    /// DW_AT_linkage_name (mangled), if any.
    pub linkage_name: Option<String>,
    /// Entry address.
    pub entry: FileAddr,
    /// Parameters in order.
    pub params: Vec<Param>,
    /// Return type's name, None for `void` (Go: the first result's).
    pub return_type: Option<(String, Type)>,
    /// The calling convention of its compilation unit's language.
    pub abi: Abi,
}

impl DwFunction {
    /// `name(type a, type b) -> ret`, for `list-probes -v`.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|p| format!("{} {}", p.type_name, p.name)).collect();
        match &self.return_type {
            Some((t, _)) => format!("{} {}({})", t, self.name, params.join(", ")),
            None => format!("void {}({})", self.name, params.join(", ")),
        }
    }
}

/// What a module's DWARF says about its functions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DwarfIndex {
    /// Functions with an out-of-line instance, by entry address.
    pub functions: Vec<DwFunction>,
    /// Names of functions that were inlined everywhere (no out-of-line copy).
    pub inlined_only: Vec<String>,
}

impl DwarfIndex {
    /// The function entered at `entry`.
    pub fn at(&self, entry: FileAddr) -> Option<&DwFunction> {
        self.functions.binary_search_by_key(&entry, |f| f.entry).ok().map(|i| &self.functions[i])
    }
}

/// The sections a function's DWARF is read from: none of the line, location
/// or macro tables, which are large and tell nothing tp shows.
pub(super) const SECTIONS: [gimli::SectionId; 8] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
];

/// Builds the index from `elf`'s DWARF sections (decompressed as needed).
pub fn index(elf: &ElfFile) -> Result<DwarfIndex> {
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<[u8]>> {
        if !SECTIONS.contains(&id) {
            return Ok(Cow::Borrowed(&[][..]));
        }
        Ok(elf.section_data(id.name())?.unwrap_or(Cow::Borrowed(&[][..])))
    })?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, RunTimeEndian::Little));
    let mut foreign = Foreign::whole();
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Some(header) = headers.next()? {
        units.push(unit_functions(&dwarf, &unit_of(&dwarf, header)?, &mut foreign)?);
    }
    Ok(combine(units))
}

/// The unit `header` heads, as `gimli::Dwarf::unit` makes it but without
/// its line program, which tp does not read (so `.debug_line` is never
/// inflated for it).
pub(super) fn unit_of<'a>(dwarf: &gimli::Dwarf<R<'a>>, header: gimli::UnitHeader<R<'a>>) -> Result<gimli::Unit<R<'a>>> {
    let encoding = header.encoding();
    let mut unit = gimli::Unit {
        abbreviations: dwarf.abbreviations(&header)?,
        name: None,
        comp_dir: None,
        low_pc: 0,
        str_offsets_base: gimli::DebugStrOffsetsBase::default_for_encoding_and_file(encoding, dwarf.file_type),
        addr_base: gimli::DebugAddrBase(0),
        loclists_base: gimli::DebugLocListsBase::default_for_encoding_and_file(encoding, dwarf.file_type),
        rnglists_base: gimli::DebugRngListsBase::default_for_encoding_and_file(encoding, dwarf.file_type),
        line_program: None,
        dwo_id: match header.type_() {
            gimli::UnitType::Skeleton(id) | gimli::UnitType::SplitCompilation(id) => Some(id),
            _ => None,
        },
        header,
    };
    let mut low_pc = None;
    {
        let mut cursor = unit.header.entries(&unit.abbreviations);
        cursor.next_dfs()?;
        let root = cursor.current().ok_or(gimli::Error::MissingUnitDie)?;
        for attr in root.attrs() {
            match (attr.name(), attr.value()) {
                (gimli::DW_AT_low_pc, v) => low_pc = Some(v),
                (gimli::DW_AT_str_offsets_base, AttributeValue::DebugStrOffsetsBase(b)) => unit.str_offsets_base = b,
                (gimli::DW_AT_addr_base | gimli::DW_AT_GNU_addr_base, AttributeValue::DebugAddrBase(b)) => {
                    unit.addr_base = b
                }
                (gimli::DW_AT_loclists_base, AttributeValue::DebugLocListsBase(b)) => unit.loclists_base = b,
                (gimli::DW_AT_rnglists_base | gimli::DW_AT_GNU_ranges_base, AttributeValue::DebugRngListsBase(b)) => {
                    unit.rnglists_base = b
                }
                (gimli::DW_AT_GNU_dwo_id, AttributeValue::DwoId(id)) if unit.dwo_id.is_none() => unit.dwo_id = Some(id),
                _ => {}
            }
        }
    }
    if let Some(v) = low_pc
        && let Some(a) = dwarf.attr_address(&unit, v)?
    {
        unit.low_pc = a;
    }
    Ok(unit)
}

/// What one compilation unit says: its functions with code, in the order
/// of its entries, and the names of its abstract instances, each with
/// whether the unit has an out-of-line instance of it.
#[derive(Debug, Clone, Default)]
pub(super) struct UnitFunctions {
    pub(super) functions: Vec<DwFunction>,
    pub(super) abstract_names: Vec<(String, bool)>,
}

/// The index of every unit's functions, units in the order of
/// `.debug_info`: one function per entry address, the first unit's and the
/// first entry's where several describe one address.
pub(super) fn combine(units: Vec<UnitFunctions>) -> DwarfIndex {
    let mut out = DwarfIndex::default();
    let mut abstract_names: Vec<(String, bool)> = Vec::new();
    for u in units {
        out.functions.extend(u.functions);
        abstract_names.extend(u.abstract_names);
    }
    out.functions.sort_by_key(|f| f.entry);
    out.functions.dedup_by_key(|f| f.entry);
    let with_code: std::collections::HashSet<&str> = out.functions.iter().map(|f| f.name.as_str()).collect();
    let mut inlined: Vec<String> = abstract_names
        .into_iter()
        .filter(|(n, out_of_line)| !out_of_line && !with_code.contains(n.as_str()) && n != "?")
        .map(|(n, _)| n)
        .collect();
    inlined.sort();
    inlined.dedup();
    out.inlined_only = inlined;
    out
}

/// The functions of one unit ([`UnitFunctions`]).
pub(super) fn unit_functions<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    foreign: &mut Foreign<'a>,
) -> Result<UnitFunctions> {
    let mut out = UnitFunctions::default();
    let mut abstracts: Vec<(UnitOffset, usize)> = Vec::new();
    let mut concrete_origins: Vec<UnitOffset> = Vec::new();
    let mut entries = unit.entries();
    let mut current: Option<(usize, isize)> = None; // (index in out.functions, depth)
    let mut abi = Abi::C;
    while let Some(e) = entries.next_dfs()? {
        let depth = e.depth();
        if let Some((_, d)) = current
            && depth <= d
        {
            current = None;
        }
        match e.tag() {
            gimli::DW_TAG_compile_unit | gimli::DW_TAG_partial_unit if depth == 0 => {
                abi = unit_abi(dwarf, unit, e)?;
            }
            gimli::DW_TAG_subprogram => {
                if e.attr_value(gimli::DW_AT_declaration).is_some() {
                    continue;
                }
                let inline = match e.attr_value(gimli::DW_AT_inline) {
                    Some(AttributeValue::Inline(i)) => i.0 as u64,
                    Some(v) => v.udata_value().unwrap_or(0),
                    None => 0,
                };
                let low = match e.attr_value(gimli::DW_AT_low_pc) {
                    Some(AttributeValue::Addr(a)) => Some(a),
                    Some(AttributeValue::DebugAddrIndex(i)) => dwarf.address(unit, i).ok(),
                    // A function split into hot and cold parts has ranges; its entry
                    // is DW_AT_entry_pc, else the start of the first range.
                    _ if e.attr_value(gimli::DW_AT_ranges).is_some() => match e.attr_value(gimli::DW_AT_entry_pc) {
                        Some(AttributeValue::Addr(a)) => Some(a),
                        _ => dwarf.die_ranges(unit, e)?.next()?.map(|r| r.begin),
                    },
                    _ => None,
                };
                let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
                    Some(AttributeValue::UnitRef(o)) => Some(o),
                    _ => None,
                };
                if (inline == 1 || inline == 3) && low.is_none() {
                    let name = name_of(dwarf, unit, e)?;
                    abstracts.push((e.offset(), out.abstract_names.len()));
                    out.abstract_names.push((name, false));
                    continue;
                }
                let Some(entry) = low else { continue };
                if let Some(o) = origin {
                    concrete_origins.push(o);
                }
                let name = name_of(dwarf, unit, e)?;
                let linkage_name = linkage_name_of(dwarf, unit, e)?;
                let return_type = type_ref(unit, e, origin)?.map(|t| describe(dwarf, unit, t)).transpose()?;
                out.functions.push(DwFunction {
                    name,
                    linkage_name,
                    entry: FileAddr(entry),
                    params: Vec::new(),
                    return_type,
                    abi,
                });
                current = Some((out.functions.len() - 1, depth));
            }
            gimli::DW_TAG_formal_parameter => {
                let Some((i, d)) = current else { continue };
                if depth != d + 1 {
                    continue;
                }
                let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
                    Some(AttributeValue::UnitRef(o)) => Some(o),
                    _ => None,
                };
                let name = name_of(dwarf, unit, e)?;
                let (type_name, ty, size) = match (type_ref(unit, e, origin)?, e.attr_value(gimli::DW_AT_type)) {
                    (Some(t), _) => {
                        let (n, ty) = describe(dwarf, unit, t)?;
                        (n, ty, size_of(unit, t)?)
                    }
                    (None, Some(AttributeValue::DebugInfoRef(at))) => foreign.describe(dwarf, at)?,
                    _ => ("?".into(), Type::Other, None),
                };
                let result = matches!(abi, Abi::Go | Abi::GoStack)
                    && matches!(e.attr_value(gimli::DW_AT_variable_parameter), Some(AttributeValue::Flag(true)));
                let f = &mut out.functions[i];
                if !result {
                    f.params.push(Param { name, type_name, ty, size });
                } else if f.return_type.is_none() {
                    f.return_type = Some((type_name, ty));
                }
            }
            _ => {}
        }
    }
    for (off, k) in abstracts {
        if concrete_origins.contains(&off) {
            out.abstract_names[k].1 = true;
        }
    }
    Ok(out)
}

/// Types in other units, which DW_FORM_ref_addr points at (Go's linker
/// puts every type in a unit of its own). The units' headers are listed on
/// first need, which takes the whole of `.debug_info`.
pub(super) struct Foreign<'a> {
    headers: Option<Vec<gimli::UnitHeader<R<'a>>>>,
    loaded: std::collections::HashMap<usize, gimli::Unit<R<'a>>>,
    whole: bool,
}

/// A type in another unit was needed while only part of `.debug_info` was
/// at hand ([`Foreign::partial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NeedWholeInfo;

impl std::fmt::Display for NeedWholeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a type in another unit needs the whole .debug_info")
    }
}

impl std::error::Error for NeedWholeInfo {}

impl<'a> Foreign<'a> {
    /// For a `Dwarf` that holds the whole of `.debug_info`.
    pub(super) fn whole() -> Foreign<'a> {
        Foreign { headers: None, loaded: std::collections::HashMap::new(), whole: true }
    }

    /// For a `Dwarf` that holds only part of `.debug_info`: a type in
    /// another unit is then the error [`NeedWholeInfo`].
    pub(super) fn partial() -> Foreign<'a> {
        Foreign { whole: false, ..Foreign::whole() }
    }

    /// The type at `at` in .debug_info: as [`describe`] and [`size_of`] tell it.
    fn describe(
        &mut self,
        dwarf: &gimli::Dwarf<R<'a>>,
        at: gimli::DebugInfoOffset,
    ) -> Result<(String, Type, Option<u64>)> {
        let unknown = ("?".to_string(), Type::Other, None);
        if self.headers.is_none() {
            if !self.whole {
                return Err(NeedWholeInfo.into());
            }
            let mut headers = Vec::new();
            let mut units = dwarf.units();
            while let Some(h) = units.next()? {
                headers.push(h);
            }
            self.headers = Some(headers);
        }
        let headers = self.headers.as_deref().unwrap_or_default();
        let Some((h, off)) = headers.iter().find_map(|h| Some((h, at.to_unit_offset(h)?))) else {
            return Ok(unknown);
        };
        let unit = match self.loaded.entry(h.offset().0) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(unit_of(dwarf, *h)?),
        };
        let (name, ty) = describe(dwarf, unit, off)?;
        Ok((name, ty, size_of(unit, off)?))
    }
}

/// The calling convention of the unit `e` heads: Go's when its language or
/// its producer (`Go cmd/compile go1.19; regabi`) says Go, with registers
/// when the producer names the register ABI.
fn unit_abi(dwarf: &gimli::Dwarf<R>, unit: &gimli::Unit<R>, e: &gimli::DebuggingInformationEntry<R>) -> Result<Abi> {
    let producer = match e.attr_value(gimli::DW_AT_producer) {
        Some(v) => dwarf.attr_string(unit, v)?.to_string_lossy().into_owned(),
        None => String::new(),
    };
    let go = match e.attr_value(gimli::DW_AT_language) {
        Some(AttributeValue::Language(lang)) => lang == gimli::DW_LANG_Go,
        _ => producer.starts_with("Go cmd/compile"),
    };
    Ok(match (go, producer.contains("regabi")) {
        (false, _) => Abi::C,
        (true, true) => Abi::Go,
        (true, false) => Abi::GoStack,
    })
}

pub(super) fn name_of(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    e: &gimli::DebuggingInformationEntry<R>,
) -> Result<String> {
    if let Some(v) = e.attr_value(gimli::DW_AT_name) {
        return Ok(dwarf.attr_string(unit, v)?.to_string_lossy().into_owned());
    }
    for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        if let Some(AttributeValue::UnitRef(off)) = e.attr_value(at) {
            return name_of(dwarf, unit, &unit.entry(off)?);
        }
    }
    Ok("?".into())
}

fn linkage_name_of(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    e: &gimli::DebuggingInformationEntry<R>,
) -> Result<Option<String>> {
    for at in [gimli::DW_AT_linkage_name, gimli::DW_AT_MIPS_linkage_name] {
        if let Some(v) = e.attr_value(at) {
            return Ok(Some(dwarf.attr_string(unit, v)?.to_string_lossy().into_owned()));
        }
    }
    for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        if let Some(AttributeValue::UnitRef(off)) = e.attr_value(at) {
            return linkage_name_of(dwarf, unit, &unit.entry(off)?);
        }
    }
    Ok(None)
}

/// DW_AT_type of `e`, or of its abstract origin.
pub(super) fn type_ref(
    unit: &gimli::Unit<R>,
    e: &gimli::DebuggingInformationEntry<R>,
    origin: Option<UnitOffset>,
) -> Result<Option<UnitOffset>> {
    if let Some(AttributeValue::UnitRef(o)) = e.attr_value(gimli::DW_AT_type) {
        return Ok(Some(o));
    }
    if let Some(o) = origin {
        let oe = unit.entry(o)?;
        if let Some(AttributeValue::UnitRef(t)) = oe.attr_value(gimli::DW_AT_type) {
            return Ok(Some(t));
        }
        if let Some(AttributeValue::UnitRef(spec)) = oe.attr_value(gimli::DW_AT_specification)
            && let Some(AttributeValue::UnitRef(t)) = unit.entry(spec)?.attr_value(gimli::DW_AT_type)
        {
            return Ok(Some(t));
        }
    }
    if let Some(AttributeValue::UnitRef(spec)) = e.attr_value(gimli::DW_AT_specification)
        && let Some(AttributeValue::UnitRef(t)) = unit.entry(spec)?.attr_value(gimli::DW_AT_type)
    {
        return Ok(Some(t));
    }
    Ok(None)
}

fn size_of(unit: &gimli::Unit<R>, t: UnitOffset) -> Result<Option<u64>> {
    let e = unit.entry(t)?;
    if let Some(s) = e.attr_value(gimli::DW_AT_byte_size).and_then(|v| v.udata_value()) {
        return Ok(Some(s));
    }
    match (e.tag(), e.attr_value(gimli::DW_AT_type)) {
        (gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type | gimli::DW_TAG_rvalue_reference_type, _) => {
            Ok(Some(8))
        }
        (_, Some(AttributeValue::UnitRef(inner))) => size_of(unit, inner),
        _ => Ok(None),
    }
}

/// The most enumerators tp keeps of one enum.
const MAX_ENUMERATORS: usize = 4096;
/// The longest enumerator name tp keeps.
const MAX_ENUMERATOR_NAME: usize = 256;

/// The enumerators of the enum at `t`: (value, name), sorted by value; at
/// most [`MAX_ENUMERATORS`], and none with a name longer than
/// [`MAX_ENUMERATOR_NAME`] (the DWARF is the target's).
fn enumerators(dwarf: &gimli::Dwarf<R>, unit: &gimli::Unit<R>, t: UnitOffset) -> Result<Vec<(i64, String)>> {
    let mut tree = unit.entries_tree(Some(t))?;
    let root = tree.root()?;
    let mut children = root.children();
    let mut out = Vec::new();
    while let Some(child) = children.next()? {
        let e = child.entry();
        if e.tag() != gimli::DW_TAG_enumerator {
            continue;
        }
        if out.len() >= MAX_ENUMERATORS {
            break;
        }
        let Some(v) = e.attr_value(gimli::DW_AT_const_value) else { continue };
        let Some(value) = v.sdata_value().or_else(|| v.udata_value().map(|u| u as i64)) else { continue };
        let name = name_of(dwarf, unit, e)?;
        if name.len() <= MAX_ENUMERATOR_NAME {
            out.push((value, name));
        }
    }
    out.sort();
    Ok(out)
}

/// The type's name as C would write it, and how to show its values.
pub(super) fn describe(dwarf: &gimli::Dwarf<R>, unit: &gimli::Unit<R>, t: UnitOffset) -> Result<(String, Type)> {
    let e = unit.entry(t)?;
    let inner = match e.attr_value(gimli::DW_AT_type) {
        Some(AttributeValue::UnitRef(o)) => Some(o),
        _ => None,
    };
    let size = e.attr_value(gimli::DW_AT_byte_size).and_then(|v| v.udata_value()).unwrap_or(0) as u8;
    Ok(match e.tag() {
        gimli::DW_TAG_base_type => {
            let name = name_of(dwarf, unit, &e)?;
            let enc = e.attr_value(gimli::DW_AT_encoding);
            let ty = match enc {
                Some(AttributeValue::Encoding(gimli::DW_ATE_boolean)) => Type::Bool,
                // Plain `char` is text; `signed char` and `unsigned char` (int8_t,
                // uint8_t) are small numbers.
                Some(AttributeValue::Encoding(gimli::DW_ATE_signed_char | gimli::DW_ATE_unsigned_char))
                    if size == 1 && name == "char" =>
                {
                    Type::Char
                }
                Some(AttributeValue::Encoding(gimli::DW_ATE_signed | gimli::DW_ATE_signed_char)) => Type::Signed(size),
                Some(AttributeValue::Encoding(gimli::DW_ATE_unsigned | gimli::DW_ATE_unsigned_char)) => {
                    Type::Unsigned(size)
                }
                Some(AttributeValue::Encoding(gimli::DW_ATE_float)) => Type::Float,
                _ => Type::Other,
            };
            (name, ty)
        }
        gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type | gimli::DW_TAG_rvalue_reference_type => {
            let (pointee, pty) = match inner {
                Some(i) => describe(dwarf, unit, i)?,
                None => ("void".into(), Type::Other),
            };
            let sigil = if e.tag() == gimli::DW_TAG_pointer_type { "*" } else { "&" };
            let ty = if pty == Type::Char && sigil == "*" { Type::CString } else { Type::Pointer };
            (format!("{pointee} {sigil}").replace("* *", "**"), ty)
        }
        gimli::DW_TAG_const_type | gimli::DW_TAG_volatile_type => {
            let q = if e.tag() == gimli::DW_TAG_const_type { "const" } else { "volatile" };
            match inner {
                Some(i) => {
                    let (n, ty) = describe(dwarf, unit, i)?;
                    (format!("{q} {n}"), ty)
                }
                None => (format!("{q} void"), Type::Other),
            }
        }
        gimli::DW_TAG_typedef => {
            let name = name_of(dwarf, unit, &e)?;
            let ty = match inner {
                Some(i) => describe(dwarf, unit, i)?.1,
                None => Type::Other,
            };
            (name, ty)
        }
        gimli::DW_TAG_enumeration_type => {
            let size = if size == 0 { 4 } else { size };
            (format!("enum {}", name_of(dwarf, unit, &e)?), Type::Enum(size, enumerators(dwarf, unit, t)?))
        }
        gimli::DW_TAG_structure_type => (format!("struct {}", name_of(dwarf, unit, &e)?), Type::Other),
        gimli::DW_TAG_union_type => (format!("union {}", name_of(dwarf, unit, &e)?), Type::Other),
        gimli::DW_TAG_class_type => (name_of(dwarf, unit, &e)?, Type::Other),
        _ => (name_of(dwarf, unit, &e)?, Type::Other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn counter_index() -> DwarfIndex {
        let path = Path::new(env!("TP_TARGETS_DIR")).join("counter");
        index(&ElfFile::open(&path, &path).unwrap()).unwrap()
    }

    #[test]
    fn functions_with_parameters_and_types() {
        let idx = counter_index();
        let bar = idx.functions.iter().find(|f| f.name == "bar").expect("bar");
        assert_eq!(bar.signature(), "uint64_t bar(uint64_t x, uint64_t y)");
        assert_eq!(bar.params[0].ty, Type::Unsigned(8));
        assert_eq!(idx.at(bar.entry).map(|f| f.name.as_str()), Some("bar"));
    }

    #[test]
    fn functions_inlined_everywhere_are_listed() {
        let idx = counter_index();
        // The reference copies are `static inline` and never emitted out of line.
        assert!(idx.inlined_only.iter().any(|n| n == "foo_ref"), "{:?}", idx.inlined_only);
        assert!(!idx.inlined_only.iter().any(|n| n == "foo"));
    }
}
