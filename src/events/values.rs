//! Giving events names and typed values. With DWARF, parameters get their
//! names and are shown by type (signed and unsigned integers, bool, char,
//! enums by their enumerators' names, pointers in hex, `char *` as a string
//! read from the target); without it,
//! the argument registers are shown as `arg0`... in hex (as many as the ABI passes in registers).
//!
//! A static probe's event records its note's arguments instead, each
//! shown by the size and sign its note gives (an unsigned 8-byte value,
//! most often a pointer, in hex).
//!
//! Which register holds which parameter is the ABI's business
//! ([`Arch::arg_registers`], for the function's ABI as DWARF tells it: C or
//! Go): this module only classifies each parameter by its DWARF type.
//! Values are shown as text here; `output::json` writes them as JSON.

use crate::arch::{Abi, Arch, Host, OperandLoc, Operands, ParamClass};
use crate::escape::text;
use crate::symbols::dwarf::{DwFunction, Type};
/// The longest string tp reads for a `char *` argument.
pub const MAX_STRING: usize = 64;

/// What tp knows about a probed function for showing its events.
#[derive(Debug, Clone, Default)]
pub struct ProbeInfo {
    /// Function name.
    pub name: String,
    /// Module file name.
    pub module: String,
    /// Its DWARF description, if the module has one.
    pub dwarf: Option<DwFunction>,
    /// A static probe's arguments, which its events record instead of the
    /// argument registers.
    pub operands: Option<Operands>,
    /// `--args 'EXPR, …'`: the values shown, in order, instead of every
    /// parameter (empty: every parameter).
    pub picks: Vec<Pick>,
    /// The fields `--args` and `--if` name (`req->uri.len`), by their
    /// text ([`super::predicate::Operand::field_key`]): where each is, or
    /// why it cannot be read.
    pub fields: Vec<(String, Result<crate::symbols::fields::FieldPath, String>)>,
}

/// One value `--args 'EXPR, …'` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// As the user wrote it, which names it in the output.
    pub text: String,
    /// Where its value comes from.
    pub from: PickFrom,
}

/// Where a picked value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickFrom {
    /// A parameter by name, from its register as `--args` shows it.
    Param(String),
    /// `argN`, in hex.
    Position(u8),
    /// The next value the runtime copied at entry
    /// ([`crate::probe::layout::stack_word::MODE_FIELDS`]), shown as `ty`;
    /// a `char *` ([`Type::CString`]) with the bytes of its string.
    Fetched(Type),
}

/// A value as it will be shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A signed integer.
    Int(i64),
    /// An enum's value, and its enumerator's name if it has one.
    Enum(i64, Option<String>),
    /// An unsigned integer.
    Uint(u64),
    /// A bool.
    Bool(bool),
    /// A character.
    Char(u8),
    /// A pointer, or a raw register without DWARF.
    Hex(u64),
    /// A `char *`: the string read from the target, or None if unreadable.
    Str(u64, Option<String>),
    /// Not in an integer register (floating point, stack, aggregate).
    Unknown,
    /// A value in memory that could not be read at the call: the address
    /// the read failed at (a bad pointer on the way).
    Unreadable(u64),
}

impl Value {
    /// The value's register, read as `ty`.
    fn of(ty: &Type, size: Option<u64>, reg: u64, read_str: &dyn Fn(u64) -> Option<String>) -> Value {
        let bits = size.unwrap_or(8).clamp(1, 8) * 8;
        let truncate = |v: u64| if bits == 64 { v } else { v & ((1u64 << bits) - 1) };
        let signed = ((reg << (64 - bits)) as i64) >> (64 - bits);
        match ty {
            Type::Signed(_) => Value::Int(signed),
            Type::Enum(_, names) => {
                // Enumerators compare by the enum's bytes: DWARF may give an
                // unsigned enum's values either way.
                let name = names.iter().find(|(e, _)| truncate(*e as u64) == truncate(reg));
                Value::Enum(signed, name.map(|(_, n)| n.clone()))
            }
            Type::Unsigned(_) => Value::Uint(truncate(reg)),
            Type::Bool => Value::Bool(reg & 0xff != 0),
            Type::Char => Value::Char(reg as u8),
            Type::CString => Value::Str(reg, if reg == 0 { None } else { read_str(reg) }),
            Type::Pointer => Value::Hex(reg),
            Type::Float | Type::Other => Value::Unknown,
        }
    }

    /// For live output lines.
    pub fn text(&self) -> String {
        match self {
            Value::Int(v) | Value::Enum(v, None) => v.to_string(),
            Value::Enum(_, Some(name)) => text(name).into_owned(),
            Value::Uint(v) => v.to_string(),
            Value::Bool(v) => v.to_string(),
            Value::Char(c) if c.is_ascii_graphic() || *c == b' ' => format!("'{}'", *c as char),
            Value::Char(c) => format!("'\\x{c:02x}'"),
            Value::Hex(v) => format!("{v:#x}"),
            Value::Str(0, _) => "NULL".into(),
            Value::Str(_, Some(s)) => format!("\"{}\"", text(s).replace('"', "\\\"")),
            Value::Str(p, None) => format!("{p:#x}"),
            Value::Unknown => "?".into(),
            Value::Unreadable(_) => "<unreadable>".into(),
        }
    }
}

/// Which recorded integer argument register holds each parameter of `f`
/// ([`Arch::arg_registers`] for its ABI), from its DWARF types.
fn registers_of(f: &crate::symbols::dwarf::DwFunction) -> Vec<Option<usize>> {
    // Go's strings and slices (DWARF structs named `string`, `[]T`) are
    // words in a row, passed as such.
    let go_words = |p: &crate::symbols::dwarf::Param| {
        let name = p.type_name.strip_prefix("struct ").unwrap_or(&p.type_name);
        match name {
            "string" => Some(ParamClass::Words(2)),
            _ if name.starts_with("[]") => Some(ParamClass::Words(3)),
            _ => None,
        }
    };
    let classes: Vec<ParamClass> = f
        .params
        .iter()
        .map(|p| match p.ty {
            Type::Float => ParamClass::Float,
            Type::Other => go_words(p).filter(|_| f.abi == Abi::Go).unwrap_or(ParamClass::Aggregate(p.size)),
            _ => ParamClass::Scalar,
        })
        .collect();
    Host::arg_registers(f.abi, &classes)
}

/// How many integer argument registers an entry of the function `info`
/// describes must record to show its arguments: up to the last one a
/// parameter is in, or all [`Arch::ARG_REGS`] without DWARF (then they are
/// shown as `arg0`...).
pub fn registers_needed(info: &ProbeInfo) -> usize {
    if let Some(ops) = &info.operands {
        return ops.as_slice().len();
    }
    match &info.dwarf {
        None => Host::ARG_REGS,
        Some(f) => registers_of(f).into_iter().flatten().map(|r| r + 1).max().unwrap_or(0),
    }
}

/// The named arguments of an entry event, from its argument registers
/// ([`Arch::ARG_REGS`] of them recorded), or the values `--args` picked
/// ([`ProbeInfo::picks`]), the copied ones from `fetched` (the words
/// recorded after the entry).
pub fn args(
    info: &ProbeInfo,
    regs: &[u64; super::ARG_WORDS],
    fetched: &[u64],
    read_str: &dyn Fn(u64) -> Option<String>,
) -> Vec<(String, Value)> {
    if !info.picks.is_empty() {
        return picked(info, regs, fetched, read_str);
    }
    if let Some(ops) = &info.operands {
        return static_args(ops, regs);
    }
    let Some(f) = &info.dwarf else {
        let recorded = &regs[..Host::ARG_REGS.min(regs.len())];
        return recorded.iter().enumerate().map(|(i, &r)| (format!("arg{i}"), Value::Hex(r))).collect();
    };
    f.params
        .iter()
        .zip(registers_of(f))
        .map(|(p, reg)| {
            let value = match reg.and_then(|i| regs.get(i)) {
                Some(&r) => Value::of(&p.ty, p.size, r, read_str),
                None => Value::Unknown,
            };
            (p.name.clone(), value)
        })
        .collect()
}

/// The values `--args` picked: parameters from their registers, the
/// copied values in order from `fetched` (a header, the word of which
/// values were read whole, then each value's words); a value the words do
/// not hold (the target wrote them) is unknown.
fn picked(
    info: &ProbeInfo,
    regs: &[u64; super::ARG_WORDS],
    fetched: &[u64],
    read_str: &dyn Fn(u64) -> Option<String>,
) -> Vec<(String, Value)> {
    use crate::probe::layout::{FETCH_STR_MAX, stack_word};
    let all = || args(&ProbeInfo { picks: Vec::new(), ..info.clone() }, regs, &[], read_str);
    let mut params: Option<Vec<(String, Value)>> = None;
    let head = fetched.first().copied().unwrap_or(0);
    let count = (head >> stack_word::COUNT_SHIFT) as usize;
    let words = match head & stack_word::MODE_MASK == stack_word::MODE_FIELDS {
        true => fetched.get(1..1 + count.min(fetched.len().saturating_sub(1))).unwrap_or(&[]),
        false => &[],
    };
    let ok = words.first().copied().unwrap_or(0);
    let mut at = 1usize;
    let mut k = 0u32;
    let mut out = Vec::with_capacity(info.picks.len());
    for p in &info.picks {
        let value = match &p.from {
            PickFrom::Position(n) => regs.get(*n as usize).map_or(Value::Unknown, |&r| Value::Hex(r)),
            PickFrom::Param(name) => params
                .get_or_insert_with(all)
                .iter()
                .find(|(n, _)| n == name)
                .map_or(Value::Unknown, |(_, v)| v.clone()),
            PickFrom::Fetched(ty) => {
                let read_whole = k < 64 && ok & (1 << k) != 0;
                k += 1;
                let Some(&v) = words.get(at) else {
                    out.push((p.text.clone(), Value::Unknown));
                    continue;
                };
                at += 1;
                if *ty == Type::CString {
                    let n = words.get(at).copied().unwrap_or(0).min(FETCH_STR_MAX as u64) as usize;
                    let bytes: Vec<u8> =
                        words.iter().skip(at + 1).take(FETCH_STR_MAX / 8).flat_map(|w| w.to_le_bytes()).collect();
                    at += 1 + FETCH_STR_MAX / 8;
                    match (read_whole, v) {
                        (false, _) => Value::Unreadable(v),
                        (true, 0) => Value::Str(0, None),
                        (true, _) if n == 0 => Value::Unreadable(v),
                        (true, _) => {
                            let got = &bytes[..n.min(bytes.len())];
                            let end = got.iter().position(|&b| b == 0);
                            let mut s = String::from_utf8_lossy(&got[..end.unwrap_or(got.len())]).into_owned();
                            if end.is_none() {
                                s.push('…');
                            }
                            Value::Str(v, Some(s))
                        }
                    }
                } else if !read_whole {
                    Value::Unreadable(v)
                } else {
                    let size = match ty {
                        Type::Signed(n) | Type::Unsigned(n) | Type::Enum(n, _) => Some(*n as u64),
                        Type::Bool | Type::Char => Some(1),
                        _ => Some(8),
                    };
                    Value::of(ty, size, v, read_str)
                }
            }
        };
        out.push((p.text.clone(), value));
    }
    out
}

/// A static probe's arguments `arg0`… from its recorded words, each kept to
/// its size and sign-extended when signed.
fn static_args(ops: &Operands, regs: &[u64]) -> Vec<(String, Value)> {
    ops.as_slice()
        .iter()
        .zip(regs)
        .enumerate()
        .map(|(k, (op, &r))| {
            let value = match (op.loc, op.size, op.signed) {
                (OperandLoc::Unreadable, _, _) => Value::Unknown,
                (_, 8, false) => Value::Hex(r),
                (_, n, true) => Value::of(&Type::Signed(n), Some(n as u64), r, &|_| None),
                (_, n, false) => Value::of(&Type::Unsigned(n), Some(n as u64), r, &|_| None),
            };
            (format!("arg{k}"), value)
        })
        .collect()
}

/// The return value of an exit event, None for `void` (or unknown without DWARF: hex).
pub fn ret(info: &ProbeInfo, value: u64, read_str: &dyn Fn(u64) -> Option<String>) -> Option<Value> {
    match &info.dwarf {
        None => Some(Value::Hex(value)),
        Some(f) => {
            let (_, ty) = f.return_type.as_ref()?;
            let size = match ty {
                Type::Signed(n) | Type::Unsigned(n) | Type::Enum(n, _) => Some(*n as u64),
                _ => Some(8),
            };
            Some(Value::of(ty, size, value, read_str))
        }
    }
}

/// `name(a=1, b="x")` for live lines (names escaped for the terminal).
pub fn call_text(name: &str, args: &[(String, Value)]) -> String {
    let inner: Vec<String> = args.iter().map(|(n, v)| format!("{}={}", text(n), v.text())).collect();
    format!("{}({})", text(name), inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::dwarf::Param;

    fn param(name: &str, ty: Type, size: u64) -> Param {
        Param { name: name.into(), type_name: String::new(), ty, size: Some(size) }
    }

    fn info(params: Vec<Param>, ret: Option<Type>) -> ProbeInfo {
        info_abi(params, ret, Abi::C)
    }

    fn info_abi(params: Vec<Param>, ret: Option<Type>, abi: Abi) -> ProbeInfo {
        ProbeInfo {
            name: "f".into(),
            module: "m".into(),
            operands: None,
            dwarf: Some(DwFunction {
                name: "f".into(),
                linkage_name: None,
                entry: crate::addr::FileAddr(0),
                params,
                return_type: ret.map(|t| ("t".to_string(), t)),
                abi,
            }),
            ..Default::default()
        }
    }

    fn no_strings(_: u64) -> Option<String> {
        None
    }

    #[test]
    fn scalars_take_integer_registers_in_order() {
        let i = info(
            vec![
                param("n", Type::Signed(4), 4),
                param("x", Type::Float, 8),
                param("ok", Type::Bool, 1),
                param("c", Type::Char, 1),
                param("s", Type::CString, 8),
                param("p", Type::Pointer, 8),
                param("u", Type::Unsigned(2), 2),
            ],
            Some(Type::Signed(8)),
        );
        let regs = [0xffff_ffff_ffff_fffb, 1, b'x' as u64, 0x1000, 0x2000, 0x1_ffff, 0, 0, 0];
        let read = |p: u64| (p == 0x1000).then(|| "hello".to_string());
        let a = args(&i, &regs, &[], &read);
        let text: Vec<String> = a.iter().map(|(n, v)| format!("{n}={}", v.text())).collect();
        assert_eq!(text, ["n=-5", "x=?", "ok=true", "c='x'", "s=\"hello\"", "p=0x2000", "u=65535"]);
        assert_eq!(ret(&i, (-7i64) as u64, &no_strings), Some(Value::Int(-7)));
    }

    #[test]
    fn aggregates_stop_the_register_mapping() {
        let i = info(
            vec![
                param("big", Type::Other, 32),
                param("a", Type::Signed(8), 8),
                param("pair", Type::Other, 16),
                param("b", Type::Signed(8), 8),
            ],
            None,
        );
        let a = args(&i, &[7, 8, 9, 0, 0, 0, 0, 0, 0], &[], &no_strings);
        let vals: Vec<&Value> = a.iter().map(|(_, v)| v).collect();
        // `big` is in memory (System V) or passed by reference, taking the
        // first register (AAPCS64): `a` is in the next one.
        let at = Host::arg_registers(Abi::C, &[ParamClass::Aggregate(Some(32)), ParamClass::Scalar])[1].unwrap();
        assert_eq!(vals, [&Value::Unknown, &Value::Int(7 + at as i64), &Value::Unknown, &Value::Unknown]);
        assert_eq!(ret(&i, 5, &no_strings), None, "void");
    }

    #[test]
    fn go_functions_take_go_registers_word_by_word() {
        // func(s string, n int, f float64, b []byte, k int8, p *T): the
        // recorded registers are Go's first nine integer ones.
        let mut s = param("s", Type::Other, 16);
        s.type_name = "struct string".into();
        let mut b = param("b", Type::Other, 24);
        b.type_name = "[]uint8".into();
        let i = info_abi(
            vec![
                s,
                param("n", Type::Signed(8), 8),
                param("f", Type::Float, 8),
                b,
                param("k", Type::Signed(1), 1),
                param("p", Type::Pointer, 8),
            ],
            None,
            Abi::Go,
        );
        // s: words 0, 1; n: 2; b: 3, 4, 5; k: 6 and p: 7.
        let a = args(&i, &[0x1000, 5, 42, 0x2000, 3, 3, 7, 0x3000, 0], &[], &no_strings);
        let text: Vec<String> = a.iter().map(|(n, v)| format!("{n}={}", v.text())).collect();
        assert_eq!(text, ["s=?", "n=42", "f=?", "b=?", "k=7", "p=0x3000"]);
        // A struct of unknown makeup ends what can be told.
        let i = info_abi(
            vec![param("a", Type::Signed(8), 8), param("st", Type::Other, 16), param("c", Type::Signed(8), 8)],
            None,
            Abi::Go,
        );
        let vals: Vec<Value> =
            args(&i, &[1, 2, 3, 4, 5, 6, 7, 8, 0], &[], &no_strings).into_iter().map(|(_, v)| v).collect();
        assert_eq!(vals, [Value::Int(1), Value::Unknown, Value::Unknown]);
    }

    #[test]
    fn static_probes_show_their_operands_by_size_and_sign() {
        use crate::arch::Operand;
        let op = |size, signed| Operand { size, signed, loc: OperandLoc::Register(0) };
        let ops = [
            op(4, true),
            op(8, false),
            op(2, false),
            op(1, true),
            Operand { loc: OperandLoc::Unreadable, ..op(8, true) },
        ];
        let i = ProbeInfo {
            name: "usdt:p:n".into(),
            module: "m".into(),
            dwarf: None,
            operands: Some(Operands::new(&ops)),
            ..Default::default()
        };
        let a = args(&i, &[0xdead_ffff_fffb, 0x7f00_1234, 0x1_0005, 0xff, 9, 0, 0, 0, 0], &[], &no_strings);
        assert_eq!(call_text("usdt:p:n", &a), "usdt:p:n(arg0=-5, arg1=0x7f001234, arg2=5, arg3=-1, arg4=?)");
    }

    #[test]
    fn without_dwarf_registers_are_hex() {
        let i = ProbeInfo { name: "g".into(), module: "m".into(), dwarf: None, operands: None, ..Default::default() };
        let a = args(&i, &[1, 2, 3, 4, 5, 255, 7, 8, 0], &[], &no_strings);
        let all = ["arg0=0x1", "arg1=0x2", "arg2=0x3", "arg3=0x4", "arg4=0x5", "arg5=0xff", "arg6=0x7", "arg7=0x8"];
        assert_eq!(call_text("g", &a), format!("g({})", all[..Host::ARG_REGS].join(", ")));
        assert_eq!(registers_needed(&i), Host::ARG_REGS);
        assert_eq!(ret(&i, 42, &no_strings), Some(Value::Hex(42)));
    }

    #[test]
    fn picked_values_come_from_the_copied_words() {
        use crate::probe::layout::{FETCH_STR_MAX, stack_word};
        let mut i = info(vec![param("n", Type::Signed(4), 4)], None);
        let pick = |text: &str, from| Pick { text: text.into(), from };
        i.picks = vec![
            pick("n", PickFrom::Param("n".into())),
            pick("r->len", PickFrom::Fetched(Type::Unsigned(4))),
            pick("r->name", PickFrom::Fetched(Type::CString)),
            pick("r->bad", PickFrom::Fetched(Type::Signed(8))),
            pick("r->long", PickFrom::Fetched(Type::CString)),
            pick("arg1", PickFrom::Position(1)),
        ];
        let string = |b: &[u8]| {
            let mut w = vec![0u64; FETCH_STR_MAX / 8];
            for (k, &c) in b.iter().enumerate() {
                w[k / 8] |= (c as u64) << (8 * (k % 8));
            }
            w
        };
        let mut words = vec![0, 0b1011, 7, 0x2000, 4];
        words.extend(string(b"GET\0"));
        words.extend([0x18, 0x3000, FETCH_STR_MAX as u64]);
        words.extend(string(&[b'x'; FETCH_STR_MAX]));
        words[0] = stack_word::MODE_FIELDS | (((words.len() - 1) as u64) << stack_word::COUNT_SHIFT);
        let a = args(&i, &[0xffff_ffff, 0x1000, 0, 0, 0, 0, 0, 0, 0], &words, &no_strings);
        let values: Vec<Value> = a.into_iter().map(|(_, v)| v).collect();
        assert_eq!(
            values,
            [
                Value::Int(-1),
                Value::Uint(7),
                Value::Str(0x2000, Some("GET".into())),
                Value::Unreadable(0x18),
                Value::Str(0x3000, Some("x".repeat(FETCH_STR_MAX) + "…")),
                Value::Hex(0x1000),
            ]
        );
        assert_eq!(Value::Unreadable(0x18).text(), "<unreadable>");
        // Words the target cut short: the values they lack are unknown.
        let a = args(&i, &[0; 9], &words[..3], &no_strings);
        assert_eq!(a[2].1, Value::Unknown);
    }
}
