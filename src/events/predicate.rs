//! `--if 'EXPR'`: predicates on a call's integer arguments and return
//! value, parsed here and compiled, per probed function, into the programs
//! the in-target runtime runs ([`crate::probe::filter`]), so that a call the
//! predicate rejects costs no event and no ring traffic.
//!
//! ```text
//! expr    := and ( "||" and )*
//! and     := unary ( "&&" unary )*
//! unary   := "!" unary | value ( cmp value )? | "(" expr ")"
//! cmp     := "==" | "!=" | "<" | "<=" | ">" | ">="
//! value   := xor ( "|" xor )*
//! xor     := bits ( "^" bits )*
//! bits    := operand ( "&" operand )*
//! operand := NAME | argN | ret | INTEGER (decimal, 0x hex, a leading -) | "(" value ")"
//!          | "str(" value ( "," INTEGER )? ")"
//! ```
//!
//! A C string is compared with a literal (`"..."`, with `\"`, `\\`, `\n`,
//! `\t`, `\0` and `\xHH`) by `==` or `!=`: `str(arg0) == "GET"` reads the
//! string at that address (a `char *` parameter may be named alone: `path
//! == "/index.html"`), and `str(x, N)` at most its first N bytes, so that
//! `str(path, 5) == "/api/"` tests a prefix (bpftrace's forms). The runtime
//! reads the bytes with process_vm_readv, which fails instead of faulting:
//! a bad pointer is a string equal to nothing.
//!
//! The bitwise operators bind tighter than the comparisons (as in Rust and
//! Python, not C): `flags & 0x4 == 0x4` tests a bit.
//!
//! A name is a parameter from DWARF; `argN` is the Nth integer argument
//! register (typed from DWARF when a parameter arrives there); `ret` the
//! return value. A value is read at its type's width and signedness (a C
//! `int` leaves the register's high half undefined), and compared signed
//! when both sides are. An operand alone means "is not zero".
//!
//! The top-level `&&` terms that name `ret` run at the function's exit
//! and may name nothing else (the arguments are gone by then); the others
//! run at entry, where a false one also skips the return probe's work.

use crate::arch::{Arch, Host, ParamClass};
use crate::probe::filter;
use crate::probe::layout::{FILTER_RET, FILTER_STR_MAX, FILTER_WORDS, filter_ext, filter_op};
use crate::symbols::dwarf::Type;

use super::format::ProbeInfo;

/// A parsed predicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `a OP b`.
    Cmp(Operand, Cmp, Operand),
    /// An operand alone: true when not zero.
    Truth(Operand),
    /// `!e`.
    Not(Box<Expr>),
    /// `a && b`.
    And(Box<Expr>, Box<Expr>),
    /// `a || b`.
    Or(Box<Expr>, Box<Expr>),
    /// The C string at `a` `==` (`true`) or `!=` (`false`) a literal.
    Str(Operand, bool, Vec<u8>),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// A parameter by name.
    Name(String),
    /// `argN`.
    Position(u8),
    /// `ret`.
    Ret,
    /// A constant.
    Int(i128),
    /// `a & b`, `a | b` or `a ^ b`.
    Bits(Box<Operand>, BitOp, Box<Operand>),
    /// `str(a)` or `str(a, N)`: the C string at address `a`, of at most N bytes.
    Text(Box<Operand>, Option<u64>),
}

/// A bitwise operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitOp {
    /// `&`
    And,
    /// `|`
    Or,
    /// `^`
    Xor,
}

impl BitOp {
    fn op(self) -> u64 {
        match self {
            BitOp::And => filter_op::BIT_AND,
            BitOp::Or => filter_op::BIT_OR,
            BitOp::Xor => filter_op::BIT_XOR,
        }
    }
}

/// The bitwise operators, loosest first.
const BIT_LEVELS: [(&str, BitOp); 3] = [("|", BitOp::Or), ("^", BitOp::Xor), ("&", BitOp::And)];

/// The longest expression tp parses.
const MAX_LEN: usize = 1024;
/// The deepest nesting tp parses.
const MAX_NESTING: usize = 32;

/// Parses `text`, or says in one line what is wrong with it.
pub fn parse(text: &str) -> Result<Expr, String> {
    if text.len() > MAX_LEN {
        return Err(format!("the expression is longer than {MAX_LEN} bytes"));
    }
    let tokens = lex(text)?;
    let mut p = Parser { tokens, at: 0, nesting: 0 };
    let e = p.or()?;
    match p.tokens.get(p.at) {
        None => Ok(e),
        Some(t) => Err(format!("unexpected `{}`", t.text())),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Int(i128),
    Op(&'static str),
    Str(Vec<u8>),
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Word(w) => w.clone(),
            Token::Int(i) => i.to_string(),
            Token::Op(o) => o.to_string(),
            Token::Str(b) => format!("\"{}\"", crate::escape::text(&String::from_utf8_lossy(b))),
        }
    }
}

/// Longer operators first: `&&` before `&`.
const OPS: [&str; 16] = ["==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "(", ")", "-", "&", "|", "^", ","];

fn lex(text: &str) -> Result<Vec<Token>, String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let s = text[start..i].replace('_', "");
            let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).map(|v| v as i128),
                None => s.parse::<u64>().map(|v| v as i128),
            };
            out.push(Token::Int(v.map_err(|_| format!("`{}` is not a 64-bit integer", &text[start..i]))?));
        } else if c == b'"' {
            let (lit, len) = string_literal(&b[i..])?;
            out.push(Token::Str(lit));
            i += len;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token::Word(text[start..i].to_string()));
        } else if let Some(op) = OPS.iter().find(|op| text[i..].starts_with(**op)) {
            if *op == "!" && text[i..].starts_with("!=") {
                unreachable!("`!=` is listed first");
            }
            out.push(Token::Op(op));
            i += op.len();
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(format!("unexpected `{}`", crate::escape::text(&ch.to_string())));
        }
    }
    Ok(out)
}

/// The literal at the start of `b` (its opening quote first): its bytes,
/// and how many bytes of `b` it took.
fn string_literal(b: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let mut out = Vec::new();
    let mut i = 1;
    loop {
        match b.get(i) {
            None => return Err("a string is not closed (`\"`)".into()),
            Some(b'"') => return Ok((out, i + 1)),
            Some(b'\\') => {
                let c = *b.get(i + 1).ok_or("a string ends in `\\`")?;
                i += 2;
                out.push(match c {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'0' => 0,
                    b'\\' | b'"' => c,
                    b'x' => {
                        let hex = b.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                        let v = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or("`\\x` takes two hex digits")?;
                        i += 2;
                        v
                    }
                    c => {
                        return Err(format!(
                            "unknown escape `\\{}` in a string",
                            crate::escape::text(&(c as char).to_string())
                        ));
                    }
                });
            }
            Some(&c) => {
                out.push(c);
                i += 1;
            }
        }
    }
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    nesting: usize,
}

impl Parser {
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token::Op(o)) if *o == op)
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while self.peek_op("||") {
            self.at += 1;
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.unary()?;
        while self.peek_op("&&") {
            self.at += 1;
            e = Expr::And(Box::new(e), Box::new(self.unary()?));
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        self.nesting += 1;
        if self.nesting > MAX_NESTING {
            return Err(format!("nested more than {MAX_NESTING} deep"));
        }
        let e = if self.peek_op("!") {
            self.at += 1;
            Expr::Not(Box::new(self.unary()?))
        } else if self.peek_op("(") {
            // `(flags & 3) == 1` is a value in parentheses, `(a == 1 || b)`
            // an expression: the value is tried first.
            let (at, nesting) = (self.at, self.nesting);
            match self.comparison() {
                Ok(e) => e,
                Err(_) => {
                    (self.at, self.nesting) = (at + 1, nesting);
                    let e = self.or()?;
                    if !self.peek_op(")") {
                        return Err("a `(` is not closed".into());
                    }
                    self.at += 1;
                    e
                }
            }
        } else {
            self.comparison()?
        };
        self.nesting -= 1;
        Ok(e)
    }

    /// `value ( cmp value )?`
    fn comparison(&mut self) -> Result<Expr, String> {
        let a = self.value()?;
        let cmp = match self.tokens.get(self.at) {
            Some(Token::Op("==")) => Some(Cmp::Eq),
            Some(Token::Op("!=")) => Some(Cmp::Ne),
            Some(Token::Op("<")) => Some(Cmp::Lt),
            Some(Token::Op("<=")) => Some(Cmp::Le),
            Some(Token::Op(">")) => Some(Cmp::Gt),
            Some(Token::Op(">=")) => Some(Cmp::Ge),
            _ => None,
        };
        Ok(match cmp {
            Some(c) => {
                self.at += 1;
                match (c, self.tokens.get(self.at).cloned()) {
                    (Cmp::Eq | Cmp::Ne, Some(Token::Str(lit))) => {
                        self.at += 1;
                        Expr::Str(a, c == Cmp::Eq, lit)
                    }
                    (_, Some(Token::Str(_))) => return Err("a string is compared with == or != only".into()),
                    _ => Expr::Cmp(a, c, self.value()?),
                }
            }
            None => Expr::Truth(a),
        })
    }

    /// Operands joined by bitwise operators.
    fn value(&mut self) -> Result<Operand, String> {
        self.bits(0)
    }

    /// The operands joined by [`BIT_LEVELS`]`[level]` and those binding tighter.
    fn bits(&mut self, level: usize) -> Result<Operand, String> {
        let Some(&(text, op)) = BIT_LEVELS.get(level) else { return self.operand() };
        let mut a = self.bits(level + 1)?;
        while self.peek_op(text) {
            self.at += 1;
            a = Operand::Bits(Box::new(a), op, Box::new(self.bits(level + 1)?));
        }
        Ok(a)
    }

    fn operand(&mut self) -> Result<Operand, String> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        match t {
            Some(Token::Op("(")) => {
                self.nesting += 1;
                if self.nesting > MAX_NESTING {
                    return Err(format!("nested more than {MAX_NESTING} deep"));
                }
                let v = self.value()?;
                if !self.peek_op(")") {
                    return Err("a `(` is not closed".into());
                }
                self.at += 1;
                self.nesting -= 1;
                Ok(v)
            }
            Some(Token::Int(v)) => Ok(Operand::Int(v)),
            Some(Token::Op("-")) => match self.tokens.get(self.at) {
                Some(Token::Int(v)) => {
                    self.at += 1;
                    Ok(Operand::Int(-v))
                }
                _ => Err("`-` must be followed by a number".into()),
            },
            Some(Token::Word(w)) if w == "str" && self.peek_op("(") => {
                self.at += 1;
                let v = self.value()?;
                let limit = match self.peek_op(",") {
                    true => match self.tokens.get(self.at + 1) {
                        Some(Token::Int(n)) if *n > 0 => {
                            self.at += 2;
                            Some(*n as u64)
                        }
                        _ => return Err("`str(x, N)` takes a number of bytes above 0".into()),
                    },
                    false => None,
                };
                if !self.peek_op(")") {
                    return Err("`str(` is not closed".into());
                }
                self.at += 1;
                Ok(Operand::Text(Box::new(v), limit))
            }
            Some(Token::Word(w)) if w == "ret" || w == "retval" => Ok(Operand::Ret),
            Some(Token::Word(w)) => match w.strip_prefix("arg").and_then(|n| n.parse::<u8>().ok()) {
                Some(n) if n < 6 && w.len() == 4 => Ok(Operand::Position(n)),
                Some(_) => Err(format!("`{w}`: tp records the first six integer arguments, arg0 to arg5")),
                None => Ok(Operand::Name(w)),
            },
            Some(t) => Err(format!("expected an argument or a number, found `{}`", t.text())),
            None => Err("the expression ends early".into()),
        }
    }
}

/// The programs a predicate compiles to for one function: the part that
/// runs at entry and the part that runs at exit (either may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// Run at entry, on the arguments.
    pub entry: Vec<u64>,
    /// Run at exit, on the return value.
    pub exit: Vec<u64>,
}

/// A value's type as a predicate reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    reg: u64,
    ext: u64,
    signed: bool,
}

impl Slot {
    fn of(reg: u64, ty: &Type, size: Option<u64>) -> Result<Slot, &'static str> {
        let (bytes, signed) = match ty {
            Type::Signed(n) | Type::Enum(n, _) => (*n as u64, true),
            Type::Unsigned(n) => (*n as u64, false),
            Type::Bool => (1, false),
            Type::Char => (1, true),
            Type::CString | Type::Pointer => (8, false),
            Type::Float => return Err("a floating-point value"),
            Type::Other => return Err("not an integer"),
        };
        let bytes = if matches!(ty, Type::Signed(_) | Type::Unsigned(_) | Type::Enum(..)) {
            bytes
        } else {
            size.unwrap_or(bytes)
        };
        let ext = match (bytes, signed) {
            (1, true) => filter_ext::I8,
            (1, false) => filter_ext::U8,
            (2, true) => filter_ext::I16,
            (2, false) => filter_ext::U16,
            (4, true) => filter_ext::I32,
            (4, false) => filter_ext::U32,
            _ => filter_ext::U64,
        };
        Ok(Slot { reg, ext, signed })
    }

    /// A raw register: a 64-bit signed integer.
    fn raw(reg: u64) -> Slot {
        Slot { reg, ext: filter_ext::U64, signed: true }
    }
}

/// Compiles `e` for the function `info` describes (`records_ret`: its
/// exits are recorded), or says in one line why it cannot.
pub fn compile(e: &Expr, info: &ProbeInfo, records_ret: bool) -> Result<Compiled, String> {
    let slots = arg_slots(info);
    let e = &with_enumerators(e, info);
    let mut terms = Vec::new();
    conjuncts(e, &mut terms);
    let (exit_terms, entry_terms): (Vec<&Expr>, Vec<&Expr>) = terms.into_iter().partition(|t| names_ret(t));
    if !exit_terms.is_empty() && !records_ret {
        return Err("`ret` is the return value: it needs --ret".into());
    }
    let mut out = Compiled::default();
    for (terms, at_exit) in [(entry_terms, false), (exit_terms, true)] {
        let prog = if at_exit { &mut out.exit } else { &mut out.entry };
        for (i, t) in terms.iter().enumerate() {
            emit(t, &slots, info, at_exit, prog)?;
            if i > 0 {
                prog.push(filter_op::AND);
            }
        }
        if !prog.is_empty() {
            prog.push(filter_op::END);
            if prog.len() > FILTER_WORDS {
                return Err(format!(
                    "the expression is too long for the runtime ({} words, at most {FILTER_WORDS}; a number \
                     takes two)",
                    prog.len()
                ));
            }
            let max = if at_exit { FILTER_RET } else { 5 };
            filter::validate(prog, max).map_err(|why| format!("cannot be compiled: {why}"))?;
        }
    }
    Ok(out)
}

/// `e` with each name that is not a parameter of `info`'s function but an
/// enumerator of one of its enum types (a parameter's or the return
/// value's, one value for the name) replaced by its value: `c == GREEN`.
fn with_enumerators(e: &Expr, info: &ProbeInfo) -> Expr {
    let Some(f) = &info.dwarf else { return e.clone() };
    let types = f.params.iter().map(|p| &p.ty).chain(f.return_type.iter().map(|(_, t)| t));
    let mut known: Vec<(&str, i64)> = Vec::new();
    for ty in types {
        if let Type::Enum(_, names) = ty {
            known.extend(names.iter().map(|(v, n)| (n.as_str(), *v)));
        }
    }
    let value_of = |name: &str| -> Option<i64> {
        if f.params.iter().any(|p| p.name == name) {
            return None;
        }
        let mut values = known.iter().filter(|(n, _)| *n == name).map(|(_, v)| *v);
        let v = values.next()?;
        values.all(|w| w == v).then_some(v)
    };
    fn operand(o: &Operand, value_of: &dyn Fn(&str) -> Option<i64>) -> Operand {
        match o {
            Operand::Name(n) => value_of(n).map_or_else(|| o.clone(), |v| Operand::Int(v as i128)),
            Operand::Bits(a, op, b) => {
                Operand::Bits(Box::new(operand(a, value_of)), *op, Box::new(operand(b, value_of)))
            }
            Operand::Text(a, n) => Operand::Text(Box::new(operand(a, value_of)), *n),
            _ => o.clone(),
        }
    }
    fn expr(e: &Expr, value_of: &dyn Fn(&str) -> Option<i64>) -> Expr {
        match e {
            Expr::Cmp(a, c, b) => Expr::Cmp(operand(a, value_of), *c, operand(b, value_of)),
            Expr::Truth(a) => Expr::Truth(operand(a, value_of)),
            Expr::Str(a, eq, lit) => Expr::Str(operand(a, value_of), *eq, lit.clone()),
            Expr::Not(a) => Expr::Not(Box::new(expr(a, value_of))),
            Expr::And(a, b) => Expr::And(Box::new(expr(a, value_of)), Box::new(expr(b, value_of))),
            Expr::Or(a, b) => Expr::Or(Box::new(expr(a, value_of)), Box::new(expr(b, value_of))),
        }
    }
    expr(e, &value_of)
}

/// The top-level `&&` terms of `e`.
fn conjuncts<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::And(a, b) => {
            conjuncts(a, out);
            conjuncts(b, out);
        }
        e => out.push(e),
    }
}

fn names_ret(e: &Expr) -> bool {
    fn has_ret(o: &Operand) -> bool {
        match o {
            Operand::Ret => true,
            Operand::Bits(a, _, b) => has_ret(a) || has_ret(b),
            Operand::Text(a, _) => has_ret(a),
            _ => false,
        }
    }
    match e {
        Expr::Cmp(a, _, b) => has_ret(a) || has_ret(b),
        Expr::Truth(a) | Expr::Str(a, _, _) => has_ret(a),
        Expr::Not(e) => names_ret(e),
        Expr::And(a, b) | Expr::Or(a, b) => names_ret(a) || names_ret(b),
    }
}

/// Each parameter's name and where it arrives, from DWARF.
fn arg_slots(info: &ProbeInfo) -> Vec<(String, Result<Slot, &'static str>)> {
    let Some(f) = &info.dwarf else { return Vec::new() };
    let classes: Vec<ParamClass> = f
        .params
        .iter()
        .map(|p| match p.ty {
            Type::Float => ParamClass::Float,
            Type::Other => ParamClass::Aggregate(p.size),
            _ => ParamClass::Scalar,
        })
        .collect();
    f.params
        .iter()
        .zip(Host::arg_registers(f.abi, &classes))
        .map(|(p, reg)| {
            let slot = match reg {
                Some(r) => Slot::of(r as u64, &p.ty, p.size),
                None if p.ty == Type::Float => Err("a floating-point value"),
                None => Err("not in the first six integer registers"),
            };
            (p.name.clone(), slot)
        })
        .collect()
}

fn operand_slot(
    o: &Operand,
    slots: &[(String, Result<Slot, &'static str>)],
    info: &ProbeInfo,
    at_exit: bool,
) -> Result<Option<Slot>, String> {
    match o {
        Operand::Int(_) => Ok(None),
        Operand::Text(..) => Err("`str(…)` is a string: compare it with a literal in quotes, by == or !=".into()),
        // A 64-bit value, signed when both sides are.
        Operand::Bits(a, _, b) => {
            let (sa, sb) = (operand_slot(a, slots, info, at_exit)?, operand_slot(b, slots, info, at_exit)?);
            if sa.is_none() && sb.is_none() {
                return Ok(None);
            }
            let signed = sa.is_none_or(|s| s.signed) && sb.is_none_or(|s| s.signed);
            Ok(Some(Slot { reg: FILTER_RET, ext: filter_ext::U64, signed }))
        }
        Operand::Ret => match &info.dwarf {
            None => Ok(Some(Slot::raw(FILTER_RET))),
            Some(f) => match &f.return_type {
                None => Err(format!("`{}` returns nothing: `ret` has no value", info.name)),
                Some((_, ty)) => {
                    Slot::of(FILTER_RET, ty, None).map(Some).map_err(|why| format!("`ret` of `{}` is {why}", info.name))
                }
            },
        },
        _ if at_exit => {
            Err("a term that names `ret` runs at the exit and can name only `ret`: join it with && to terms on the \
                 arguments"
                .into())
        }
        Operand::Position(n) => Ok(Some(
            slots.iter().find_map(|(_, s)| s.ok().filter(|s| s.reg == *n as u64)).unwrap_or(Slot::raw(*n as u64)),
        )),
        Operand::Name(name) => match slots.iter().find(|(n, _)| n == name) {
            Some((_, Ok(s))) => Ok(Some(*s)),
            Some((_, Err(why))) => Err(format!("`{name}` is {why}: --if compares integer arguments")),
            None if info.dwarf.is_none() => Err(format!(
                "`{name}`: `{}` has no debugging information naming its parameters; use arg0..arg5",
                info.name
            )),
            None => {
                let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
                Err(format!("`{}` has no parameter `{name}` (it has: {})", info.name, names.join(", ")))
            }
        },
    }
}

fn emit(
    e: &Expr,
    slots: &[(String, Result<Slot, &'static str>)],
    info: &ProbeInfo,
    at_exit: bool,
    out: &mut Vec<u64>,
) -> Result<(), String> {
    match e {
        Expr::And(a, b) | Expr::Or(a, b) => {
            emit(a, slots, info, at_exit, out)?;
            emit(b, slots, info, at_exit, out)?;
            out.push(if matches!(e, Expr::And(..)) { filter_op::AND } else { filter_op::OR });
        }
        Expr::Not(a) => {
            emit(a, slots, info, at_exit, out)?;
            out.push(filter_op::NOT);
        }
        Expr::Str(a, equal, lit) => {
            let (pointer, limit) = match a {
                Operand::Text(p, limit) => (&**p, *limit),
                a if is_c_string(a, info) => (a, None),
                _ => {
                    return Err(format!(
                        "`{}` is not a C string (`char *`): use str(…) to read one at that address",
                        operand_text(a)
                    ));
                }
            };
            if lit.len() > FILTER_STR_MAX {
                return Err(format!("strings are compared up to {FILTER_STR_MAX} bytes; this one has {}", lit.len()));
            }
            let prefix = match limit {
                Some(n) if (lit.len() as u64) > n => {
                    return Err(format!("str(…, {n}) has at most {n} bytes: it never equals {} bytes", lit.len()));
                }
                Some(n) => n == lit.len() as u64,
                None => false,
            };
            push(pointer, None, slots, info, at_exit, out)?;
            out.extend(filter::str_words(lit, prefix));
            if !*equal {
                out.push(filter_op::NOT);
            }
        }
        Expr::Truth(a) => {
            let s = operand_slot(a, slots, info, at_exit)?;
            push(a, s, slots, info, at_exit, out)?;
            out.extend([filter_op::IMM, 0, filter_op::NE]);
        }
        Expr::Cmp(a, cmp, b) => {
            let (sa, sb) = (operand_slot(a, slots, info, at_exit)?, operand_slot(b, slots, info, at_exit)?);
            let signed = sa.is_none_or(|s| s.signed) && sb.is_none_or(|s| s.signed);
            // > and >= swap their operands into < and <=.
            let (first, second, (fs, ss)) = match cmp {
                Cmp::Gt | Cmp::Ge => (b, a, (sb, sa)),
                _ => (a, b, (sa, sb)),
            };
            push(first, ss, slots, info, at_exit, out)?;
            push(second, fs, slots, info, at_exit, out)?;
            out.push(match (cmp, signed) {
                (Cmp::Eq, _) => filter_op::EQ,
                (Cmp::Ne, _) => filter_op::NE,
                (Cmp::Lt | Cmp::Gt, true) => filter_op::LT_S,
                (Cmp::Le | Cmp::Ge, true) => filter_op::LE_S,
                (Cmp::Lt | Cmp::Gt, false) => filter_op::LT_U,
                (Cmp::Le | Cmp::Ge, false) => filter_op::LE_U,
            });
        }
    }
    Ok(())
}

/// True if `o` names a value DWARF types as a C string.
fn is_c_string(o: &Operand, info: &ProbeInfo) -> bool {
    let Some(f) = &info.dwarf else { return false };
    match o {
        Operand::Name(n) => f.params.iter().any(|p| &p.name == n && p.ty == Type::CString),
        Operand::Ret => f.return_type.as_ref().is_some_and(|(_, t)| *t == Type::CString),
        _ => false,
    }
}

/// `o` as the user wrote it, about.
fn operand_text(o: &Operand) -> String {
    match o {
        Operand::Name(n) => n.clone(),
        Operand::Position(n) => format!("arg{n}"),
        Operand::Ret => "ret".into(),
        Operand::Int(v) => v.to_string(),
        Operand::Bits(a, op, b) => {
            let op = BIT_LEVELS.iter().find(|(_, o)| o == op).map_or("?", |(t, _)| t);
            format!("{} {op} {}", operand_text(a), operand_text(b))
        }
        Operand::Text(a, _) => format!("str({})", operand_text(a)),
    }
}

/// Pushes operand `o`; a constant is checked against the type of the value
/// it is compared with (`other`), but inside a bitwise operation (a mask).
fn push(
    o: &Operand,
    other: Option<Slot>,
    slots: &[(String, Result<Slot, &'static str>)],
    info: &ProbeInfo,
    at_exit: bool,
    out: &mut Vec<u64>,
) -> Result<(), String> {
    if let Operand::Bits(a, op, b) = o {
        push(a, None, slots, info, at_exit, out)?;
        push(b, None, slots, info, at_exit, out)?;
        out.push(op.op());
        return Ok(());
    }
    match (o, operand_slot(o, slots, info, at_exit)?) {
        (Operand::Int(v), _) => {
            let v = *v;
            if let Some(s) = other {
                let (lo, hi): (i128, i128) = match s.ext {
                    filter_ext::I8 => (i8::MIN as i128, i8::MAX as i128),
                    filter_ext::U8 => (0, u8::MAX as i128),
                    filter_ext::I16 => (i16::MIN as i128, i16::MAX as i128),
                    filter_ext::U16 => (0, u16::MAX as i128),
                    filter_ext::I32 => (i32::MIN as i128, i32::MAX as i128),
                    filter_ext::U32 => (0, u32::MAX as i128),
                    _ if s.signed => (i64::MIN as i128, u64::MAX as i128),
                    _ => (i64::MIN as i128, u64::MAX as i128),
                };
                if v < lo || v > hi {
                    return Err(format!("{v} is out of the range of the value it is compared with ({lo} to {hi})"));
                }
            }
            if v < i64::MIN as i128 {
                return Err(format!("{v} does not fit 64 bits"));
            }
            out.extend([filter_op::IMM, v as i64 as u64]);
        }
        (_, Some(s)) => out.push(filter::arg_word(s.reg, s.ext)),
        (_, None) => unreachable!("only constants have no slot"),
    }
    Ok(())
}

/// The word of [`crate::probe::layout::ProbeConfig::by`] for `--by ARG`
/// in the function `info` describes: the argument's register and how its
/// value is read.
pub fn by_word(arg: &str, info: &ProbeInfo) -> Result<u32, String> {
    let operand = match parse(arg)? {
        Expr::Truth(o @ (Operand::Name(_) | Operand::Position(_))) => o,
        _ => return Err("name one argument: a parameter's name or arg0..arg5".into()),
    };
    let slots = arg_slots(info);
    let s = operand_slot(&operand, &slots, info, false)?.ok_or("name one argument")?;
    Ok((s.reg | (s.ext << 8)) as u32)
}

/// How [`by_word`] reads a value: as signed, and how wide.
pub fn by_value(word: u32, value: u64) -> i128 {
    let ext = (word >> 8) as u64 & 0xff;
    match ext {
        filter_ext::I8 => value as i8 as i128,
        filter_ext::I16 => value as i16 as i128,
        filter_ext::I32 => value as i32 as i128,
        filter_ext::U8 => value as u8 as i128,
        filter_ext::U16 => value as u16 as i128,
        filter_ext::U32 => value as u32 as i128,
        _ => value as i64 as i128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Abi;
    use crate::symbols::dwarf::{DwFunction, Param};

    fn info(params: &[(&str, Type)], ret: Option<Type>) -> ProbeInfo {
        ProbeInfo {
            name: "f".into(),
            module: "m".into(),
            operands: None,
            dwarf: Some(DwFunction {
                name: "f".into(),
                linkage_name: None,
                entry: crate::addr::FileAddr(0),
                params: params
                    .iter()
                    .map(|(n, t)| Param {
                        name: n.to_string(),
                        type_name: String::new(),
                        ty: t.clone(),
                        size: match t {
                            Type::Signed(n) | Type::Unsigned(n) => Some(*n as u64),
                            _ => Some(8),
                        },
                    })
                    .collect(),
                return_type: ret.map(|t| ("t".into(), t)),
                abi: Abi::C,
            }),
        }
    }

    fn run(expr: &str, i: &ProbeInfo, args: [u64; 6], ret: u64) -> (bool, bool) {
        let c = compile(&parse(expr).unwrap(), i, true).unwrap();
        let mut v = [0u64; 7];
        v[..6].copy_from_slice(&args);
        v[6] = ret;
        let pass = |p: &[u64]| p.is_empty() || filter::eval(p, &v, &|_, _| 0);
        (pass(&c.entry), pass(&c.exit))
    }

    #[test]
    fn parses_precedence_and_forms() {
        let e = parse("a == 1 || b < -2 && !(arg3)").unwrap();
        let want = Expr::Or(
            Box::new(Expr::Cmp(Operand::Name("a".into()), Cmp::Eq, Operand::Int(1))),
            Box::new(Expr::And(
                Box::new(Expr::Cmp(Operand::Name("b".into()), Cmp::Lt, Operand::Int(-2))),
                Box::new(Expr::Not(Box::new(Expr::Truth(Operand::Position(3))))),
            )),
        );
        assert_eq!(e, want);
        assert_eq!(parse("ret>=0x10").unwrap(), Expr::Cmp(Operand::Ret, Cmp::Ge, Operand::Int(16)));
    }

    #[test]
    fn bitwise_operators_bind_tighter_than_comparisons() {
        let n = |s: &str| Box::new(Operand::Name(s.into()));
        let int = |v| Box::new(Operand::Int(v));
        // & before ^ before |, all before ==.
        let e = parse("a | b ^ c & 4 == 0x10").unwrap();
        let want = Operand::Bits(
            n("a"),
            BitOp::Or,
            Box::new(Operand::Bits(n("b"), BitOp::Xor, Box::new(Operand::Bits(n("c"), BitOp::And, int(4))))),
        );
        assert_eq!(e, Expr::Cmp(want, Cmp::Eq, Operand::Int(16)));
        // A value in parentheses, and an expression in them.
        let masked = Expr::Cmp(Operand::Bits(n("a"), BitOp::And, int(3)), Cmp::Eq, Operand::Int(1));
        assert_eq!(parse("(a & 3) == 1").unwrap(), masked);
        assert_eq!(parse("((a & 3) == 1)").unwrap(), masked);
        let either = parse("(a == 1 || b & 2) && c").unwrap();
        assert!(matches!(either, Expr::And(ref l, _) if matches!(**l, Expr::Or(..))), "{either:?}");
        assert_eq!(
            parse("!(a & 8)").unwrap(),
            Expr::Not(Box::new(Expr::Truth(Operand::Bits(n("a"), BitOp::And, int(8)))))
        );
        assert_eq!(parse("a && b").unwrap(), Expr::And(Box::new(Expr::Truth(*n("a"))), Box::new(Expr::Truth(*n("b")))));
        for (text, why) in [("a & ", "ends early"), ("(a & 1", "not closed"), ("a & & 1", "found `&`")] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn bitwise_operators_run_on_typed_values() {
        let i = info(&[("flags", Type::Unsigned(4)), ("n", Type::Signed(4))], Some(Type::Signed(4)));
        // flags is an unsigned int: the register's high half does not count.
        assert_eq!(run("flags & 0x4", &i, [0xffff_0000_0000_0004, 0, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("flags & 0x4", &i, [0xffff_0000_0000_0003, 0, 0, 0, 0, 0], 0), (false, true));
        assert_eq!(run("flags & 0x6 == 0x2", &i, [0x3, 0, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("(flags | 1) ^ 0x10 == 0x11", &i, [0, 0, 0, 0, 0, 0], 0), (true, true));
        // A mask wider than the value is a mask, not out of range.
        assert_eq!(run("flags & 0xffff0000ffffffff == 5", &i, [5, 0, 0, 0, 0, 0], 0), (true, true));
        // Signed when both sides are: n & -8 < 0 for a negative n.
        assert_eq!(run("n & -8 < 0", &i, [0, (-9i64) as u64, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("n & -8 < 0", &i, [0, 9, 0, 0, 0, 0], 0), (false, true));
        // A mask of the return value runs at exit.
        assert_eq!(run("ret & 1", &i, [0; 6], 3), (true, true));
        assert_eq!(run("ret & 1", &i, [0; 6], 2), (true, false));
        let j = info(&[("n", Type::Signed(8))], Some(Type::Signed(8)));
        let e = compile(&parse("n & ret").unwrap(), &j, true).unwrap_err();
        assert!(e.contains("can name only `ret`"), "{e}");
    }

    #[test]
    fn enumerators_are_named_in_predicates() {
        let color = Type::Enum(4, vec![(-2, "BLUE".into()), (0, "RED".into()), (5, "GREEN".into())]);
        let i = info(&[("c", color), ("n", Type::Signed(4))], None);
        assert_eq!(run("c == GREEN", &i, [5, 0, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("c == BLUE", &i, [0xffff_fffe, 0, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("c != RED && n > 1", &i, [0, 7, 0, 0, 0, 0], 0), (false, true));
        let e = compile(&parse("c == PURPLE").unwrap(), &i, false).unwrap_err();
        assert!(e.contains("no parameter `PURPLE`"), "{e}");
    }

    #[test]
    fn bad_expressions_say_why_in_one_line() {
        for (text, why) in [
            ("", "ends early"),
            ("a ==", "ends early"),
            ("(a == 1", "not closed"),
            ("a = 1", "unexpected `=`"),
            ("a == 1 b", "unexpected `b`"),
            ("arg6 == 1", "arg0 to arg5"),
            ("a == 99999999999999999999", "not a 64-bit integer"),
            ("a @ 1", "unexpected `@`"),
            ("- a", "followed by a number"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why) && !e.contains('\n'), "{text}: {e}");
        }
        let deep = "(".repeat(100) + "a" + &")".repeat(100);
        assert!(parse(&deep).unwrap_err().contains("nested"));
        assert!(parse(&"a && ".repeat(300)).unwrap_err().contains("longer than"));
    }

    #[test]
    fn compiles_by_name_type_and_position() {
        let i = info(&[("n", Type::Signed(4)), ("x", Type::Float), ("u", Type::Unsigned(1))], Some(Type::Signed(4)));
        // n is an int in the first argument register: garbage above it does not count.
        assert_eq!(run("n == -1", &i, [0xaaaa_aaaa_ffff_ffff, 0, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("n < 0", &i, [0x0000_0001_0000_0005, 0, 0, 0, 0, 0], 0), (false, true));
        // u arrives in the second integer register (x is in a vector register).
        assert_eq!(run("u > 200 && arg0 >= 3", &i, [3, 0x1ff, 0, 0, 0, 0], 0), (true, true));
        assert_eq!(run("u > 200 && arg0 >= 3", &i, [3, 0x100, 0, 0, 0, 0], 0), (false, true));
        // A term on ret runs at exit.
        assert_eq!(run("n == 1 && ret < 0", &i, [1, 0, 0, 0, 0, 0], u32::MAX as u64), (true, true));
        assert_eq!(run("n == 1 && ret < 0", &i, [1, 0, 0, 0, 0, 0], 5), (true, false));
        assert_eq!(run("n == 1 && !ret", &i, [1, 0, 0, 0, 0, 0], 7), (true, false));
    }

    #[test]
    fn what_cannot_be_compiled_is_one_line() {
        let i = info(&[("n", Type::Signed(4)), ("x", Type::Float), ("c", Type::Unsigned(1))], None);
        let err = |text: &str, ret: bool| compile(&parse(text).unwrap(), &i, ret).unwrap_err();
        assert!(err("m == 1", false).contains("has no parameter `m` (it has: n, x, c)"));
        assert!(err("x == 1", false).contains("floating-point"));
        assert!(err("c == 300", false).contains("out of the range"));
        assert!(err("c == -1", false).contains("out of the range"));
        assert!(err("ret == 1", false).contains("needs --ret"));
        assert!(err("ret == 1", true).contains("returns nothing"));
        let j = info(&[("n", Type::Signed(8))], Some(Type::Signed(8)));
        let e = compile(&parse("n == 1 || ret == 2").unwrap(), &j, true).unwrap_err();
        assert!(e.contains("can name only `ret`"), "{e}");
        let long = (0..6).map(|k| format!("n != {k}")).collect::<Vec<_>>().join(" && ");
        assert!(compile(&parse(&long).unwrap(), &j, false).unwrap_err().contains("too long"));
        let none = ProbeInfo { name: "g".into(), module: "m".into(), dwarf: None, operands: None };
        assert!(compile(&parse("n == 1").unwrap(), &none, false).unwrap_err().contains("use arg0..arg5"));
        assert!(compile(&parse("arg2 == -1").unwrap(), &none, false).is_ok());
    }
}
