//! The fields `--args 'req->uri.len'` and `--if 'req->len > 100'` name:
//! from a parameter, through pointers (`->`), struct and union members
//! (`.`) and array elements (`[N]`, where DWARF gives the array's length),
//! by the parameter's DWARF types, to what the runtime reads at the call's
//! entry: the offset of each load (a pointer read on the way, then the
//! value), the value's width and how it is shown.
//!
//! The DWARF is the target's: a chain is at most [`MAX_STEPS`] steps and
//! as many loads as the caller's runtime takes, a type is followed through
//! at most 16 typedefs and qualifiers, and every offset is checked for
//! overflow. Whatever cannot be followed is one line naming the problem:
//! an unknown member (with the members there are), `->` on what is not a
//! pointer, an index past the array's length. Names in it are the
//! target's: the caller escapes the line before showing it.

use std::borrow::Cow;

use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};

use super::dwarf::{self, R, SECTIONS, Type};
use super::elf::ElfFile;
use crate::addr::FileAddr;

/// The most steps (`->x`, `.y`, `[N]`) of one chain.
pub const MAX_STEPS: usize = 8;
/// The most typedefs and qualifiers followed to a type.
const MAX_QUALIFIERS: usize = 16;
/// The most members listed in an error.
const MAX_LISTED: usize = 12;

/// One step of a chain from a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `->name`: the member of the struct the value points at.
    Arrow(String),
    /// `.name`: the member of the struct the value is.
    Dot(String),
    /// `[n]`: the element of the array the value is.
    Index(u64),
}

/// `steps` as written after the parameter's name.
pub fn steps_text(steps: &[Step]) -> String {
    steps
        .iter()
        .map(|s| match s {
            Step::Arrow(n) => format!("->{n}"),
            Step::Dot(n) => format!(".{n}"),
            Step::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// Where a field is and how it is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    /// The offset of each load from the address before it: all but the
    /// last read a pointer, the last the value.
    pub loads: Vec<i64>,
    /// Bytes the last load reads: 1, 2, 4 or 8.
    pub width: u8,
    /// How the value is shown.
    pub ty: Type,
    /// Its type's name as written (`unsigned int`).
    pub type_name: String,
}

/// The chain `steps` from parameter `param` of the function entered at
/// `entry`, by `elf`'s DWARF, in at most `max_loads` loads; or why it
/// cannot be followed, in one line.
pub fn resolve(
    elf: &ElfFile,
    entry: FileAddr,
    param: &str,
    steps: &[Step],
    max_loads: usize,
) -> Result<FieldPath, String> {
    if steps.is_empty() {
        return Err(format!("`{param}` names no field"));
    }
    if steps.len() > MAX_STEPS {
        return Err(format!("a chain has at most {MAX_STEPS} steps"));
    }
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<[u8]>, String> {
        if !SECTIONS.contains(&id) {
            return Ok(Cow::Borrowed(&[][..]));
        }
        Ok(elf.section_data(id.name()).map_err(|e| e.to_string())?.unwrap_or(Cow::Borrowed(&[][..])))
    })?;
    let d = sections.borrow(|s| EndianSlice::new(s, RunTimeEndian::Little));
    let bad = |e: gimli::Error| format!("the debugging information cannot be read ({e})");
    let mut headers = d.units();
    while let Some(header) = headers.next().map_err(bad)? {
        let unit = dwarf::unit_of(&d, header).map_err(|e| e.to_string())?;
        if let Some(t) = param_type(&d, &unit, entry, param).map_err(|e| e.to_string())? {
            return Walk { d: &d, unit: &unit, max_loads }.follow(t?, param, steps);
        }
    }
    Err(format!("no debugging information names the parameter `{param}`"))
}

/// The type of parameter `param` of the function entered at `entry`, if
/// `unit` has that function: Ok(None) if it does not.
fn param_type(
    d: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    entry: FileAddr,
    param: &str,
) -> anyhow::Result<Option<Result<UnitOffset, String>>> {
    let mut entries = unit.entries();
    let mut inside: Option<isize> = None;
    while let Some(e) = entries.next_dfs()? {
        let depth = e.depth();
        if let Some(d0) = inside {
            if depth <= d0 {
                return Ok(Some(Err(format!("the function has no parameter `{param}`"))));
            }
            if depth == d0 + 1 && e.tag() == gimli::DW_TAG_formal_parameter && dwarf::name_of(d, unit, e)? == param {
                let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
                    Some(AttributeValue::UnitRef(o)) => Some(o),
                    _ => None,
                };
                return Ok(Some(
                    dwarf::type_ref(unit, e, origin)?
                        .ok_or_else(|| format!("`{param}`'s type is in another unit, which tp does not follow")),
                ));
            }
            continue;
        }
        if e.tag() != gimli::DW_TAG_subprogram || e.attr_value(gimli::DW_AT_declaration).is_some() {
            continue;
        }
        let low = match e.attr_value(gimli::DW_AT_low_pc) {
            Some(AttributeValue::Addr(a)) => Some(a),
            Some(AttributeValue::DebugAddrIndex(i)) => d.address(unit, i).ok(),
            _ => match e.attr_value(gimli::DW_AT_entry_pc) {
                Some(AttributeValue::Addr(a)) => Some(a),
                _ => None,
            },
        };
        if low == Some(entry.0) {
            inside = Some(depth);
        }
    }
    Ok(inside.map(|_| Err(format!("the function has no parameter `{param}`"))))
}

struct Walk<'a, 'b> {
    d: &'b gimli::Dwarf<R<'a>>,
    unit: &'b gimli::Unit<R<'a>>,
    max_loads: usize,
}

impl Walk<'_, '_> {
    /// `t` without its typedefs and qualifiers.
    fn strip(&self, t: UnitOffset) -> Result<UnitOffset, String> {
        let mut t = t;
        for _ in 0..MAX_QUALIFIERS {
            let e = self.unit.entry(t).map_err(|e| e.to_string())?;
            match e.tag() {
                gimli::DW_TAG_typedef
                | gimli::DW_TAG_const_type
                | gimli::DW_TAG_volatile_type
                | gimli::DW_TAG_restrict_type
                | gimli::DW_TAG_atomic_type => match e.attr_value(gimli::DW_AT_type) {
                    Some(AttributeValue::UnitRef(o)) => t = o,
                    _ => return Ok(t),
                },
                _ => return Ok(t),
            }
        }
        Err("a type is a chain of more typedefs than tp follows".into())
    }

    fn tag(&self, t: UnitOffset) -> Result<gimli::DwTag, String> {
        Ok(self.unit.entry(t).map_err(|e| e.to_string())?.tag())
    }

    /// The type `t` refers to (DW_AT_type): a pointer's target, an
    /// array's element, a member's type.
    fn inner(&self, t: UnitOffset) -> Result<Option<UnitOffset>, String> {
        Ok(match self.unit.entry(t).map_err(|e| e.to_string())?.attr_value(gimli::DW_AT_type) {
            Some(AttributeValue::UnitRef(o)) => Some(o),
            _ => None,
        })
    }

    fn size(&self, t: UnitOffset) -> Result<Option<u64>, String> {
        let t = self.strip(t)?;
        let e = self.unit.entry(t).map_err(|e| e.to_string())?;
        if let Some(s) = e.attr_value(gimli::DW_AT_byte_size).and_then(|v| v.udata_value()) {
            return Ok(Some(s));
        }
        match e.tag() {
            gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type => Ok(Some(8)),
            gimli::DW_TAG_array_type => {
                let (Some(elem), Some(n)) = (self.inner(t)?, self.array_len(t)?) else { return Ok(None) };
                Ok(self.size(elem)?.and_then(|s| s.checked_mul(n)))
            }
            _ => Ok(None),
        }
    }

    /// The name the type `t` is written by.
    fn type_name(&self, t: UnitOffset) -> String {
        dwarf::describe(self.d, self.unit, t).map(|(n, _)| n).unwrap_or_else(|_| "?".into())
    }

    /// The length of the array `t` (its first dimension), if DWARF gives it.
    fn array_len(&self, t: UnitOffset) -> Result<Option<u64>, String> {
        let mut tree = self.unit.entries_tree(Some(t)).map_err(|e| e.to_string())?;
        let root = tree.root().map_err(|e| e.to_string())?;
        let mut children = root.children();
        while let Some(child) = children.next().map_err(|e| e.to_string())? {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_subrange_type {
                continue;
            }
            if let Some(n) = e.attr_value(gimli::DW_AT_count).and_then(|v| v.udata_value()) {
                return Ok(Some(n));
            }
            let lower = e.attr_value(gimli::DW_AT_lower_bound).and_then(|v| v.udata_value()).unwrap_or(0);
            return Ok(e
                .attr_value(gimli::DW_AT_upper_bound)
                .and_then(|v| v.udata_value())
                .and_then(|u| u.checked_sub(lower))
                .and_then(|n| n.checked_add(1)));
        }
        Ok(None)
    }

    /// The member `name` of the struct or union `t` (stripped): its offset
    /// and type. A member of an anonymous struct or union in it counts.
    fn member(&self, t: UnitOffset, name: &str, depth: usize) -> Result<Option<(u64, UnitOffset)>, String> {
        let mut tree = self.unit.entries_tree(Some(t)).map_err(|e| e.to_string())?;
        let root = tree.root().map_err(|e| e.to_string())?;
        let mut children = root.children();
        while let Some(child) = children.next().map_err(|e| e.to_string())? {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_member {
                continue;
            }
            let Some(AttributeValue::UnitRef(mt)) = e.attr_value(gimli::DW_AT_type) else { continue };
            let offset = match e.attr_value(gimli::DW_AT_data_member_location) {
                None => 0,
                Some(v) => v.udata_value().ok_or("a member's place is an expression tp does not evaluate")?,
            };
            let named = e.attr_value(gimli::DW_AT_name).is_some();
            if named && dwarf::name_of(self.d, self.unit, e).map_err(|e| e.to_string())? == name {
                if e.attr_value(gimli::DW_AT_bit_size).is_some() {
                    return Err(format!("`{name}` is a bit field, which tp does not read"));
                }
                return Ok(Some((offset, mt)));
            }
            if !named && depth < MAX_QUALIFIERS {
                let inner = self.strip(mt)?;
                if matches!(self.tag(inner)?, gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type)
                    && let Some((o, ty)) = self.member(inner, name, depth + 1)?
                {
                    return Ok(Some((offset.checked_add(o).ok_or("a member's offset overflows")?, ty)));
                }
            }
        }
        Ok(None)
    }

    /// The names of the members of `t` (stripped), for an error.
    fn members(&self, t: UnitOffset) -> String {
        let mut out = Vec::new();
        let Ok(mut tree) = self.unit.entries_tree(Some(t)) else { return String::new() };
        let Ok(root) = tree.root() else { return String::new() };
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() == gimli::DW_TAG_member
                && e.attr_value(gimli::DW_AT_name).is_some()
                && let Ok(n) = dwarf::name_of(self.d, self.unit, e)
            {
                out.push(n);
            }
            if out.len() >= MAX_LISTED {
                out.push("…".into());
                break;
            }
        }
        out.join(", ")
    }

    /// Follows `steps` from a parameter of type `t`.
    fn follow(&self, t: UnitOffset, param: &str, steps: &[Step]) -> Result<FieldPath, String> {
        let mut ty = t;
        let mut loads: Vec<i64> = Vec::new();
        // The value is in memory at the last load's address plus `pending`
        // (false: it is the register itself).
        let mut in_memory = false;
        let mut pending: u64 = 0;
        let mut written = param.to_string();
        let overflow = || "an offset overflows".to_string();
        for step in steps {
            let stripped = self.strip(ty)?;
            let tag = self.tag(stripped)?;
            let shown = written.clone();
            match step {
                Step::Arrow(name) | Step::Dot(name) => {
                    let record = if matches!(step, Step::Arrow(_)) {
                        if tag != gimli::DW_TAG_pointer_type {
                            return Err(format!(
                                "`{shown}` is not a pointer (it is `{}`): use `.` for a struct's member",
                                self.type_name(ty)
                            ));
                        }
                        let Some(p) = self.inner(stripped)? else {
                            return Err(format!("`{shown}` is a `void *`: it has no members"));
                        };
                        if in_memory {
                            loads.push(pending as i64);
                            pending = 0;
                        }
                        in_memory = true;
                        self.strip(p)?
                    } else {
                        if tag == gimli::DW_TAG_pointer_type {
                            return Err(format!("`{shown}` is a pointer: use `->` for the member it points at"));
                        }
                        if !in_memory {
                            return Err(format!(
                                "`{shown}` is a struct passed by value, which tp does not read: name a pointer's \
                                 member with `->`"
                            ));
                        }
                        stripped
                    };
                    if !matches!(
                        self.tag(record)?,
                        gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type
                    ) {
                        return Err(format!("`{shown}` is not a struct (it is `{}`)", self.type_name(ty)));
                    }
                    if self
                        .unit
                        .entry(record)
                        .map_err(|e| e.to_string())?
                        .attr_value(gimli::DW_AT_declaration)
                        .is_some()
                    {
                        return Err(format!(
                            "`{}` is declared but not defined in this unit: tp does not know its members",
                            self.type_name(record)
                        ));
                    }
                    let Some((off, mt)) = self.member(record, name, 0)? else {
                        return Err(format!(
                            "`{}` has no member `{}` (it has: {})",
                            self.type_name(record),
                            name,
                            self.members(record)
                        ));
                    };
                    pending = pending.checked_add(off).ok_or_else(overflow)?;
                    ty = mt;
                }
                Step::Index(i) => {
                    if tag == gimli::DW_TAG_pointer_type {
                        return Err(format!(
                            "`{shown}` is a pointer, not an array of known length: tp indexes arrays only"
                        ));
                    }
                    if tag != gimli::DW_TAG_array_type {
                        return Err(format!("`{shown}` is not an array (it is `{}`)", self.type_name(ty)));
                    }
                    if !in_memory {
                        return Err(format!("`{shown}` is not in memory"));
                    }
                    let Some(n) = self.array_len(stripped)? else {
                        return Err(format!("`{shown}` is an array whose length DWARF does not give"));
                    };
                    if *i >= n {
                        return Err(format!("`{shown}` has {n} elements: [{i}] is past its end"));
                    }
                    let elem = self.inner(stripped)?.ok_or("an array without an element type")?;
                    let size = self.size(elem)?.ok_or("an array element of unknown size")?;
                    pending = i.checked_mul(size).and_then(|o| pending.checked_add(o)).ok_or_else(overflow)?;
                    ty = elem;
                }
            }
            written += &steps_text(std::slice::from_ref(step));
            if loads.len() >= self.max_loads {
                return Err(format!(
                    "a chain reads memory at most {} times (each pointer after the first, then the value)",
                    self.max_loads
                ));
            }
        }
        let shown = written.clone();
        if pending > i64::MAX as u64 {
            return Err(overflow());
        }
        loads.push(pending as i64);
        let stripped = self.strip(ty)?;
        let (type_name, shown_as) = dwarf::describe(self.d, self.unit, ty).map_err(|e| e.to_string())?;
        match self.tag(stripped)? {
            gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type => {
                return Err(format!(
                    "`{shown}` is a `{type_name}`: name one of its members (it has: {})",
                    self.members(stripped)
                ));
            }
            gimli::DW_TAG_array_type => {
                return Err(format!("`{shown}` is an array: name one element, `{shown}[0]`"));
            }
            _ => {}
        }
        if shown_as == Type::Float {
            return Err(format!("`{shown}` is a floating-point value, which tp does not show"));
        }
        let width = match self.size(ty)? {
            Some(w @ (1 | 2 | 4 | 8)) => w as u8,
            _ => return Err(format!("`{shown}` (`{type_name}`) is not an integer, enum, bool or pointer")),
        };
        let shown_as = match shown_as {
            Type::Other => Type::Unsigned(width),
            t => t,
        };
        Ok(FieldPath { loads, width, ty: shown_as, type_name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The server target and the entry of its `handle`.
    fn server() -> (ElfFile, FileAddr) {
        let path = Path::new(env!("TP_TARGETS_DIR")).join("server");
        let elf = ElfFile::open(&path, &path).unwrap();
        let entry = dwarf::index(&elf).unwrap().functions.iter().find(|f| f.name == "handle").unwrap().entry;
        (elf, entry)
    }

    fn arrow(n: &str) -> Step {
        Step::Arrow(n.into())
    }

    fn dot(n: &str) -> Step {
        Step::Dot(n.into())
    }

    #[test]
    fn members_nested_structs_and_array_elements_have_their_offsets_and_types() {
        let (elf, entry) = server();
        let f = |param: &str, steps: &[Step]| resolve(&elf, entry, param, steps, 4);
        let method = f("req", &[arrow("method")]).unwrap();
        assert_eq!((method.loads, method.width, method.ty), (vec![0], 8, Type::CString));
        let len = f("req", &[arrow("uri"), dot("len")]).unwrap();
        assert_eq!((len.loads, len.width, len.ty), (vec![16], 4, Type::Unsigned(4)));
        let id = f("req", &[arrow("ids"), Step::Index(2)]).unwrap();
        // method 8, uri 16, len 8, kind 4, keep_alive 1, then shorts from 37 aligned to 38.
        assert_eq!((id.loads, id.width, id.ty), (vec![38 + 4], 2, Type::Signed(2)));
        let kind = f("req", &[arrow("kind")]).unwrap();
        assert!(matches!(kind.ty, Type::Enum(4, ref names) if names.len() == 3), "{kind:?}");
        assert_eq!(f("req", &[arrow("keep_alive")]).unwrap().ty, Type::Bool);
    }

    #[test]
    fn what_cannot_be_followed_says_why_in_one_line() {
        let (elf, entry) = server();
        let f = |param: &str, steps: &[Step]| resolve(&elf, entry, param, steps, 4).unwrap_err();
        for (param, steps, why) in [
            ("req", vec![arrow("nope")], "has no member `nope` (it has: method, uri, len, kind, keep_alive, ids)"),
            ("req", vec![dot("len")], "is a pointer: use `->`"),
            ("req", vec![arrow("uri"), arrow("len")], "`req->uri` is not a pointer"),
            ("req", vec![arrow("ids"), Step::Index(4)], "has 4 elements"),
            ("req", vec![arrow("uri")], "name one of its members (it has: text, len)"),
            ("req", vec![arrow("ids")], "is an array"),
            ("path", vec![arrow("x")], "is not a struct"),
            ("nobody", vec![arrow("x")], "no parameter `nobody`"),
        ] {
            let e = f(param, &steps);
            assert!(e.contains(why) && !e.contains('\n'), "{param}{}: {e}", steps_text(&steps));
        }
        let long = vec![arrow("uri"); MAX_STEPS + 1];
        assert!(f("req", &long).contains("at most"));
    }
}
