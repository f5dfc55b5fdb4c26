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
//! operand := NAME step* | argN | ret | INTEGER (decimal, 0x hex, a leading -) | "(" value ")"
//!          | "str(" value ( "," INTEGER )? ")"
//! step    := "->" NAME | "." NAME | "[" INTEGER "]"
//! ```
//!
//! A parameter's fields are named as in C: `req->uri.len`, `req->ids[2]`
//! (an array by index where DWARF gives its length), by the parameter's
//! DWARF types ([`crate::symbols::fields`]); the runtime reads each with
//! process_vm_readv, and a call whose field cannot be read (a bad pointer
//! on the way) is not selected. `--args 'EXPR, …'` names values the same
//! way ([`parse_picks`]).
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
use crate::probe::layout::{
    AGG_VALUE_WORDS, FETCH_STR_MAX, FETCH_VALUES, FETCH_WORDS, FILTER_RET, FILTER_STR_MAX, FILTER_WORDS, fetch_word,
    filter_ext, filter_op,
};
use crate::symbols::dwarf::Type;
use crate::symbols::fields::{FieldPath, MAX_STEPS, Step, steps_text};

use super::values::{Pick, PickFrom, ProbeInfo};

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
    /// A field of a parameter: `req->uri.len` (the parameter's name, or
    /// `argN`, which has no type to follow), then the steps.
    Field(String, Vec<Step>),
    /// `latency` in `--agg`: the call's duration in nanoseconds (never
    /// in a predicate).
    Latency,
}

impl Operand {
    /// The key a resolved field is found by in [`ProbeInfo::fields`].
    pub fn field_key(param: &str, steps: &[Step]) -> String {
        format!("{param}{}", steps_text(steps))
    }
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
const OPS: [&str; 20] =
    ["==", "!=", "<=", ">=", "&&", "||", "->", "<", ">", "!", "(", ")", "-", "&", "|", "^", ",", ".", "[", "]"];

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
            Some(Token::Word(w)) => {
                let steps = self.steps()?;
                if !steps.is_empty() {
                    return Ok(Operand::Field(w, steps));
                }
                match w.strip_prefix("arg").and_then(|n| n.parse::<u8>().ok()) {
                    Some(n) if n < 6 && w.len() == 4 => Ok(Operand::Position(n)),
                    Some(_) => Err(format!("`{w}`: tp records the first six integer arguments, arg0 to arg5")),
                    None => Ok(Operand::Name(w)),
                }
            }
            Some(t) => Err(format!("expected an argument or a number, found `{}`", t.text())),
            None => Err("the expression ends early".into()),
        }
    }
}

impl Parser {
    /// The steps after a name: `->x`, `.y`, `[N]`.
    fn steps(&mut self) -> Result<Vec<Step>, String> {
        let mut steps = Vec::new();
        loop {
            let step = if self.peek_op("->") || self.peek_op(".") {
                let arrow = self.peek_op("->");
                self.at += 1;
                let Some(Token::Word(name)) = self.tokens.get(self.at).cloned() else {
                    return Err(format!("`{}` must be followed by a member's name", if arrow { "->" } else { "." }));
                };
                self.at += 1;
                if arrow { Step::Arrow(name) } else { Step::Dot(name) }
            } else if self.peek_op("[") {
                let Some(Token::Int(i)) = self.tokens.get(self.at + 1).cloned() else {
                    return Err("`[` takes an index: a number".into());
                };
                if !matches!(self.tokens.get(self.at + 2), Some(Token::Op("]"))) {
                    return Err("a `[` is not closed".into());
                }
                self.at += 3;
                Step::Index(i as u64)
            } else {
                return Ok(steps);
            };
            steps.push(step);
            if steps.len() > MAX_STEPS {
                return Err(format!("a chain of fields has at most {MAX_STEPS} steps"));
            }
        }
    }
}

/// Parses `--args 'EXPR, …'`: values separated by commas, each a
/// parameter (`path`), `argN`, a field (`req->uri.len`) or a string at an
/// address (`str(arg1)`, `str(req->name)`); each with its text as
/// written, which names it in the output.
pub fn parse_picks(text: &str) -> Result<Vec<(String, Operand)>, String> {
    if text.len() > MAX_LEN {
        return Err(format!("the list is longer than {MAX_LEN} bytes"));
    }
    let mut out = Vec::new();
    for piece in split_top_level(text) {
        let piece = piece.trim();
        if piece.is_empty() {
            return Err("an empty value in the list (two commas, or one at an end)".into());
        }
        let mut p = Parser { tokens: lex(piece)?, at: 0, nesting: 0 };
        let o = p.value()?;
        if let Some(t) = p.tokens.get(p.at) {
            return Err(format!("unexpected `{}` in `{}`", t.text(), crate::escape::text(piece)));
        }
        match &o {
            Operand::Name(_) | Operand::Position(_) | Operand::Field(..) => {}
            Operand::Text(inner, None)
                if matches!(**inner, Operand::Name(_) | Operand::Position(_) | Operand::Field(..)) => {}
            Operand::Text(_, Some(_)) => return Err("--args reads a whole string: str(x), not str(x, N)".into()),
            _ => {
                return Err(format!(
                    "`{}`: --args names parameters, argN, fields (req->len) and str(x)",
                    crate::escape::text(piece)
                ));
            }
        }
        out.push((piece.to_string(), o));
    }
    if out.len() > FETCH_VALUES * 2 {
        return Err(format!("at most {} values", FETCH_VALUES * 2));
    }
    Ok(out)
}

/// `text` split at its commas outside parentheses, brackets and strings.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut escaped, mut start) = (0i32, false, false, 0);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '(' | '[' if !quoted => depth += 1,
            ')' | ']' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// The fields (parameter, steps) `o` names.
fn operand_fields(o: &Operand, out: &mut Vec<(String, Vec<Step>)>) {
    match o {
        Operand::Field(p, steps) if !out.iter().any(|(q, s)| q == p && s == steps) => {
            out.push((p.clone(), steps.clone()));
        }
        Operand::Bits(a, _, b) => {
            operand_fields(a, out);
            operand_fields(b, out);
        }
        Operand::Text(a, _) => operand_fields(a, out),
        _ => {}
    }
}

/// The fields (parameter, steps) `e` names, each once.
pub fn fields_of(e: &Expr, out: &mut Vec<(String, Vec<Step>)>) {
    match e {
        Expr::Cmp(a, _, b) => {
            operand_fields(a, out);
            operand_fields(b, out);
        }
        Expr::Truth(a) | Expr::Str(a, _, _) => operand_fields(a, out),
        Expr::Not(a) => fields_of(a, out),
        Expr::And(a, b) | Expr::Or(a, b) => {
            fields_of(a, out);
            fields_of(b, out);
        }
    }
}

/// The fields (parameter, steps) the picks name, each once.
pub fn fields_of_picks(picks: &[(String, Operand)], out: &mut Vec<(String, Vec<Step>)>) {
    for (_, o) in picks {
        operand_fields(o, out);
    }
}

/// The resolved field `o` names in `info`'s function, with the register of
/// its parameter, or why it cannot be read.
fn field_of<'a>(
    param: &str,
    steps: &[Step],
    slots: &[(String, Result<Slot, &'static str>)],
    info: &'a ProbeInfo,
) -> Result<(u64, &'a FieldPath), String> {
    if param.strip_prefix("arg").is_some_and(|n| n.parse::<u8>().is_ok())
        && info.dwarf.as_ref().is_none_or(|f| !f.params.iter().any(|p| p.name == param))
    {
        return Err(format!("`{param}` has no type to follow: name the parameter (DWARF names it)"));
    }
    if info.dwarf.is_none() {
        return Err(format!(
            "`{}` has no debugging information: tp needs DWARF to follow `{}`",
            info.name,
            crate::escape::text(&Operand::field_key(param, steps))
        ));
    }
    let reg = match slots.iter().find(|(n, _)| n == param) {
        Some((_, Ok(s))) => s.reg,
        Some((_, Err(why))) => {
            return Err(format!("`{param}` is {why}: tp follows fields from a pointer in a register"));
        }
        None => {
            let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!("`{}` has no parameter `{param}` (it has: {})", info.name, names.join(", ")));
        }
    };
    let key = Operand::field_key(param, steps);
    match info.fields.iter().find(|(k, _)| *k == key) {
        Some((_, Ok(path))) => Ok((reg, path)),
        Some((_, Err(why))) => Err(why.clone()),
        None => Err(format!("`{}` was not looked up", crate::escape::text(&key))),
    }
}

/// The fetch program of `picks` for the function `info` describes (with
/// its fields resolved), and what each pick shows; an empty program if
/// none is copied from memory.
pub fn fetch_program(picks: &[(String, Operand)], info: &ProbeInfo) -> Result<(Vec<u64>, Vec<Pick>), String> {
    let slots = arg_slots(info);
    let mut prog = Vec::new();
    let mut shown = Vec::new();
    let mut values = 0;
    for (text, o) in picks {
        let (inner, string) = match o {
            Operand::Text(inner, _) => (&**inner, true),
            o => (o, false),
        };
        // A `char *` parameter's string is copied at the call too.
        let string = string || matches!(inner, Operand::Name(_)) && is_c_string(inner, info);
        let (reg, loads, width, ty): (u64, &[i64], u64, Type) = match inner {
            Operand::Name(n) if !string => {
                if info.dwarf.is_none() {
                    return Err(format!(
                        "`{n}`: `{}` has no debugging information naming its parameters; use arg0..arg5",
                        info.name
                    ));
                }
                if !slots.iter().any(|(s, _)| s == n) {
                    let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
                    return Err(format!("`{}` has no parameter `{n}` (it has: {})", info.name, names.join(", ")));
                }
                shown.push(Pick { text: text.clone(), from: PickFrom::Param(n.clone()) });
                continue;
            }
            Operand::Position(n) if !string => {
                shown.push(Pick { text: text.clone(), from: PickFrom::Position(*n) });
                continue;
            }
            Operand::Name(n) => match slots.iter().find(|(s, _)| s == n) {
                Some((_, Ok(s))) => (s.reg, &[], 8, Type::CString),
                Some((_, Err(why))) => return Err(format!("`{n}` is {why}")),
                None => return Err(format!("`{}` has no parameter `{n}`", info.name)),
            },
            Operand::Position(n) => (*n as u64, &[], 8, Type::CString),
            Operand::Field(p, steps) => {
                let (reg, path) = field_of(p, steps, &slots, info)?;
                let ty = if string { Type::CString } else { path.ty.clone() };
                if string && path.width != 8 {
                    return Err(format!(
                        "`{}` is not a pointer: str(…) reads the string at an address",
                        crate::escape::text(text)
                    ));
                }
                (reg, &path.loads[..], path.width as u64, ty)
            }
            _ => return Err(format!("`{}` cannot be shown", crate::escape::text(text))),
        };
        if reg >= crate::probe::layout::ENTRY_REGS as u64 {
            return Err(format!(
                "`{}` starts from an argument past the sixth register, which the runtime does not copy from",
                crate::escape::text(text)
            ));
        }
        values += 1;
        if values > FETCH_VALUES {
            return Err(format!("--args copies at most {FETCH_VALUES} values from memory"));
        }
        let str_bytes = if ty == Type::CString { FETCH_STR_MAX as u64 } else { 0 };
        prog.push(
            fetch_word::VALID
                | reg
                | ((loads.len() as u64) << fetch_word::LOADS_SHIFT)
                | (width << fetch_word::WIDTH_SHIFT)
                | (str_bytes << fetch_word::STR_SHIFT),
        );
        prog.extend(loads.iter().map(|&o| o as u64));
        if prog.len() > FETCH_WORDS {
            return Err(format!(
                "the fields need more than the runtime's {FETCH_WORDS} words (one per value and one per load)"
            ));
        }
        shown.push(Pick { text: text.clone(), from: PickFrom::Fetched(ty) });
    }
    Ok((prog, shown))
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
    let fields = info.fields.iter().filter_map(|(_, r)| r.as_ref().ok()).map(|f| &f.ty);
    let types = f.params.iter().map(|p| &p.ty).chain(f.return_type.iter().map(|(_, t)| t)).chain(fields);
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
        Operand::Latency => Err("`latency` is a value of --agg only".into()),
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
        Operand::Field(p, steps) => {
            let (_, path) = field_of(p, steps, slots, info)?;
            Slot::of(FILTER_RET, &path.ty, Some(path.width as u64))
                .map(Some)
                .map_err(|why| format!("`{}` is {why}", crate::escape::text(&Operand::field_key(p, steps))))
        }
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
        Operand::Field(p, steps) => {
            let key = Operand::field_key(p, steps);
            info.fields.iter().any(|(k, r)| *k == key && r.as_ref().is_ok_and(|f| f.ty == Type::CString))
        }
        _ => false,
    }
}

/// `o` as the user wrote it, about.
fn operand_text(o: &Operand) -> String {
    match o {
        Operand::Name(n) => n.clone(),
        Operand::Position(n) => format!("arg{n}"),
        Operand::Ret => "ret".into(),
        Operand::Latency => "latency".into(),
        Operand::Int(v) => v.to_string(),
        Operand::Bits(a, op, b) => {
            let op = BIT_LEVELS.iter().find(|(_, o)| o == op).map_or("?", |(t, _)| t);
            format!("{} {op} {}", operand_text(a), operand_text(b))
        }
        Operand::Text(a, _) => format!("str({})", operand_text(a)),
        Operand::Field(p, steps) => Operand::field_key(p, steps),
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
    if let Operand::Field(p, steps) = o {
        // The parameter's register, a pointer read at each offset but
        // the last, and the value at the last.
        let ext = operand_slot(o, slots, info, at_exit)?.map_or(filter_ext::U64, |s| s.ext);
        let (reg, path) = field_of(p, steps, slots, info)?;
        out.push(filter::arg_word(reg, filter_ext::U64));
        for (i, &off) in path.loads.iter().enumerate() {
            out.push(match i + 1 == path.loads.len() {
                true => filter::load_word(path.width as u64, ext),
                false => filter::load_word(8, filter_ext::U64),
            });
            out.push(off as u64);
        }
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

/// A function of `--agg`: what is shown of the value's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFn {
    /// `count()`: the calls.
    Count,
    /// `sum(v)`.
    Sum,
    /// `min(v)`.
    Min,
    /// `max(v)`.
    Max,
    /// `avg(v)`: the sum over the count, rounded toward zero.
    Avg,
    /// `hist(v)`: calls per power of two of the value.
    Hist,
}

impl AggFn {
    /// Every function, in the order they are listed to users.
    const ALL: [AggFn; 6] = [AggFn::Count, AggFn::Sum, AggFn::Min, AggFn::Max, AggFn::Avg, AggFn::Hist];

    /// The function named `name` (`count`, `hist`, …).
    fn named(name: &str) -> Option<AggFn> {
        AggFn::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The name as written.
    pub fn name(self) -> &'static str {
        match self {
            AggFn::Count => "count",
            AggFn::Sum => "sum",
            AggFn::Min => "min",
            AggFn::Max => "max",
            AggFn::Avg => "avg",
            AggFn::Hist => "hist",
        }
    }
}

/// A parsed `--agg`: its functions, in order, of one value (none for
/// `count()` alone), with the value's text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agg {
    /// The functions.
    pub funcs: Vec<AggFn>,
    /// The value they aggregate: its text and operand.
    pub value: Option<(String, Operand)>,
}

/// Parses `--agg 'hist(len), sum(req->len), avg(len), min(len), max(len),
/// count()'` (bpftrace's names): functions of one value, a parameter,
/// `argN`, a field or the return value `ret`, each at most once.
pub fn parse_agg(text: &str) -> Result<Agg, String> {
    if text.len() > MAX_LEN {
        return Err(format!("the list is longer than {MAX_LEN} bytes"));
    }
    if text.trim().is_empty() {
        return Err("name the functions to aggregate with: count(), sum(v), min(v), max(v), avg(v), hist(v)".into());
    }
    let mut out = Agg { funcs: Vec::new(), value: None };
    for piece in split_top_level(text) {
        let piece = piece.trim();
        let shown = crate::escape::text(piece);
        let Some((name, rest)) = piece.split_once('(') else {
            return Err(if piece.is_empty() {
                "an empty function in the list (two commas, or one at an end)".into()
            } else {
                format!("`{shown}` is not a function: name one of count(), sum(v), min(v), max(v), avg(v), hist(v)")
            });
        };
        let Some(inner) = rest.trim_end().strip_suffix(')') else {
            return Err(format!("`{shown}`: a function's value ends with `)`"));
        };
        if let Some(close) = inner.find(')')
            && inner.find('(').is_none_or(|open| close < open)
        {
            return Err(format!("`{shown}`: separate the functions with commas"));
        }
        let Some(f) = AggFn::named(name.trim()) else {
            return Err(format!(
                "`{}` is not a function tp aggregates with: count, sum, min, max, avg, hist",
                crate::escape::text(name.trim())
            ));
        };
        if out.funcs.contains(&f) {
            return Err(format!("{}() is named twice", f.name()));
        }
        out.funcs.push(f);
        let inner = inner.trim();
        if f == AggFn::Count {
            if !inner.is_empty() {
                return Err("count() counts the calls: it takes no value".into());
            }
            continue;
        }
        if inner.is_empty() {
            return Err(format!(
                "{}(…) needs a value: a parameter, argN, a field (req->len), ret or latency",
                f.name()
            ));
        }
        // The call's duration (a parameter named `latency` is argN here).
        let o = if inner == "latency" {
            Operand::Latency
        } else {
            let mut p = Parser { tokens: lex(inner)?, at: 0, nesting: 0 };
            let o = p.value()?;
            if let Some(t) = p.tokens.get(p.at) {
                return Err(format!("unexpected `{}` in `{shown}`", t.text()));
            }
            o
        };
        match &o {
            Operand::Name(_) | Operand::Position(_) | Operand::Field(..) | Operand::Ret | Operand::Latency => {}
            _ => {
                return Err(format!(
                    "`{shown}`: --agg aggregates a parameter, argN, a field (req->len), ret or latency"
                ));
            }
        }
        match &out.value {
            Some((t, v)) if *v != o => {
                return Err(format!(
                    "--agg aggregates one value per function: `{}` and `{}` are two",
                    crate::escape::text(t),
                    crate::escape::text(inner)
                ));
            }
            Some(_) => {}
            None => out.value = Some((inner.to_string(), o)),
        }
    }
    Ok(out)
}

/// What a report names of an `--agg`: its functions, in order, and the
/// text of the value they aggregate. The region keeps it for `tp status`
/// in a short form that names the value once ([`AggNames::stored`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggNames {
    /// The functions.
    pub funcs: Vec<AggFn>,
    /// The value's text as written (none for `count()` alone).
    pub value: Option<String>,
}

impl Agg {
    /// Its functions and its value's text.
    pub fn names(&self) -> AggNames {
        AggNames { funcs: self.funcs.clone(), value: self.value.as_ref().map(|(t, _)| t.clone()) }
    }
}

impl AggNames {
    /// The short form, shorter than `room` bytes: the functions' names
    /// joined by commas, then the value once in parentheses
    /// (`count,hist(req->len)`, or `count`). A value too long for that is
    /// cut at a character and ends with `…`.
    pub fn stored(&self, room: usize) -> String {
        let mut out = self.funcs.iter().map(|f| f.name()).collect::<Vec<_>>().join(",");
        if let Some(v) = &self.value {
            let left = room.saturating_sub(out.len() + 2 + 1);
            out.push('(');
            if v.len() <= left {
                out.push_str(v);
            } else {
                let cut = (0..=left.saturating_sub('…'.len_utf8())).rev().find(|&i| v.is_char_boundary(i)).unwrap_or(0);
                out.push_str(&v[..cut]);
                out.push('…');
            }
            out.push(')');
        }
        out
    }

    /// Reads [`AggNames::stored`]'s form, which the target can write:
    /// none unless every name is a function's, none twice, and a value
    /// is given exactly when a function takes one.
    pub fn from_stored(text: &str) -> Option<AggNames> {
        let (names, value) = match text.split_once('(') {
            Some((names, rest)) => (names, Some(rest.strip_suffix(')')?.to_string())),
            None => (text, None),
        };
        let mut funcs = Vec::new();
        for name in names.split(',') {
            let f = AggFn::named(name)?;
            if funcs.contains(&f) {
                return None;
            }
            funcs.push(f);
        }
        let takes_value = funcs.iter().any(|f| *f != AggFn::Count);
        (takes_value == value.is_some()).then_some(AggNames { funcs, value })
    }
}

/// `--by`'s keys in the words that name them (`stack(2),tid`): what the
/// region keeps for `tp status`, which [`parse_keys`] reads back.
pub fn keys_text(keys: &[Key]) -> String {
    let most = crate::probe::layout::STACK_KEY_DEPTH as u32;
    let words: Vec<String> = keys
        .iter()
        .map(|k| match k {
            Key::Value(v) => v.clone(),
            Key::Tid => "tid".into(),
            Key::Pid => "pid".into(),
            Key::Caller => "caller".into(),
            Key::Stack(n) if *n == most => "stack".into(),
            Key::Stack(n) => format!("stack({n})"),
        })
        .collect();
    words.join(",")
}

/// One key of `--by`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// An argument's value (its text as written).
    Value(String),
    /// The thread.
    Tid,
    /// The process.
    Pid,
    /// The call site: the call's return address (`caller`).
    Caller,
    /// The call's stack: its return address and its callers', at most
    /// this many frames (`stack`, `stack(N)`, bpftrace's `ustack`).
    Stack(u32),
}

impl Key {
    /// True for the keys the runtime reads at the call (an argument, the
    /// caller, the stack), of which a probe has one; `tid` and `pid` come
    /// with the thread's table.
    pub fn in_call(&self) -> bool {
        matches!(self, Key::Value(_) | Key::Caller | Key::Stack(_))
    }

    /// True for a key read where the call enters its function (the caller,
    /// the stack): a probe inside a function has neither.
    pub fn at_entry_only(&self) -> bool {
        matches!(self, Key::Caller | Key::Stack(_))
    }
}

/// Parses `stack`, `stack(N)` (or `ustack`, `ustack(N)`): the frames a
/// stack key takes, [`crate::probe::layout::STACK_KEY_DEPTH`] unless N says fewer.
fn stack_key(piece: &str) -> Option<Result<Key, String>> {
    let rest = piece.strip_prefix("ustack").or_else(|| piece.strip_prefix("stack"))?;
    let most = crate::probe::layout::STACK_KEY_DEPTH as u32;
    if rest.is_empty() {
        return Some(Ok(Key::Stack(most)));
    }
    let n = rest.strip_prefix('(')?.strip_suffix(')')?.trim();
    Some(match n.parse::<u32>() {
        Ok(n) if (1..=most).contains(&n) => Ok(Key::Stack(n)),
        _ => Err(format!("`{}`: a stack key takes 1 to {most} frames", crate::escape::text(piece))),
    })
}

/// The most keys `--by` takes.
pub const MAX_KEYS: usize = 3;

/// Parses `--by 'len, tid'`: up to [`MAX_KEYS`] keys, each `tid`, `pid`,
/// `caller`, `stack` (`stack(N)`) or an integer argument (a parameter's
/// name or argN), with at most one of `caller`, `stack` and an argument.
pub fn parse_keys(text: &str) -> Result<Vec<Key>, String> {
    let mut out = Vec::new();
    for piece in split_top_level(text) {
        let piece = piece.trim();
        let key = if let Some(key) = stack_key(piece) {
            key?
        } else {
            match piece {
                "" => return Err("an empty key in the list (two commas, or one at an end)".into()),
                "tid" => Key::Tid,
                "pid" => Key::Pid,
                "caller" => Key::Caller,
                v => match parse(v)? {
                    Expr::Truth(Operand::Name(_) | Operand::Position(_)) => Key::Value(v.to_string()),
                    _ => {
                        return Err(format!(
                            "`{}` is not a key: name tid, pid, caller, stack, or one argument (a parameter's name or \
                         arg0..arg5)",
                            crate::escape::text(v)
                        ));
                    }
                },
            }
        };
        if out.contains(&key) {
            return Err(format!("`{piece}` is named twice"));
        }
        if key.in_call() && out.iter().any(Key::in_call) {
            return Err(
                "--by keys by one of an argument's value, the caller and the stack at most (with tid and pid)".into()
            );
        }
        out.push(key);
    }
    if out.len() > MAX_KEYS {
        return Err(format!("at most {MAX_KEYS} keys"));
    }
    Ok(out)
}

/// The fields (parameter, steps) `--agg`'s value names.
pub fn fields_of_agg(agg: &Agg, out: &mut Vec<(String, Vec<Step>)>) {
    if let Some((_, o)) = &agg.value {
        operand_fields(o, out);
    }
}

/// True if `--agg`'s value is read at the call's exit (`ret`, `latency`).
pub fn agg_at_exit(agg: &Agg) -> bool {
    matches!(agg.value, Some((_, Operand::Ret | Operand::Latency)))
}

/// True if `--agg`'s value is the call's duration (`latency`).
pub fn agg_latency(agg: &Agg) -> bool {
    matches!(agg.value, Some((_, Operand::Latency)))
}

/// The words of [`crate::probe::layout::ProbeConfig::agg`] that read
/// `--agg`'s value in the function `info` describes (with its fields
/// resolved): the header ([`fetch_word`], with its extension and sign),
/// then one offset per load. All zeros for `count()` alone. For `ret`,
/// the header alone, whose extension and sign the exit reads.
pub fn agg_program(agg: &Agg, info: &ProbeInfo) -> Result<[u64; AGG_VALUE_WORDS], String> {
    let mut out = [0u64; AGG_VALUE_WORDS];
    let Some((text, o)) = &agg.value else { return Ok(out) };
    if *o == Operand::Latency {
        // Nanoseconds, unsigned: the runtime reads no program for them.
        out[0] = fetch_word::VALID | (8 << fetch_word::WIDTH_SHIFT) | (filter_ext::U64 << fetch_word::EXT_SHIFT);
        return Ok(out);
    }
    let slots = arg_slots(info);
    if *o == Operand::Ret {
        let s = operand_slot(o, &slots, info, true)?.ok_or("name a value")?;
        out[0] = fetch_word::VALID
            | (8 << fetch_word::WIDTH_SHIFT)
            | (s.ext << fetch_word::EXT_SHIFT)
            | if s.signed { fetch_word::SIGNED } else { 0 };
        return Ok(out);
    }
    let (reg, loads, width, slot): (u64, &[i64], u64, Slot) = match o {
        Operand::Field(p, steps) => {
            let (reg, path) = field_of(p, steps, &slots, info)?;
            let slot = Slot::of(reg, &path.ty, Some(path.width as u64))
                .map_err(|why| format!("`{}` is {why}", crate::escape::text(text)))?;
            (reg, &path.loads[..], path.width as u64, slot)
        }
        o => {
            let s = operand_slot(o, &slots, info, false)?.ok_or("name a value")?;
            (s.reg, &[], 8, s)
        }
    };
    if reg >= crate::probe::layout::ENTRY_REGS as u64 {
        return Err(format!(
            "`{}` starts from an argument past the sixth register, which the runtime does not read",
            crate::escape::text(text)
        ));
    }
    if loads.len() > AGG_VALUE_WORDS - 1 {
        return Err(format!("`{}` takes more than {} loads", crate::escape::text(text), AGG_VALUE_WORDS - 1));
    }
    out[0] = fetch_word::VALID
        | reg
        | ((loads.len() as u64) << fetch_word::LOADS_SHIFT)
        | (width << fetch_word::WIDTH_SHIFT)
        | (slot.ext << fetch_word::EXT_SHIFT)
        | if slot.signed { fetch_word::SIGNED } else { 0 };
    for (w, &l) in out[1..].iter_mut().zip(loads) {
        *w = l as u64;
    }
    Ok(out)
}

/// A value [`agg_program`]'s header `head` read, as the user's type has it.
pub fn agg_value(head: u64, v: u64) -> i128 {
    match head & fetch_word::SIGNED != 0 {
        true => v as i64 as i128,
        false => v as i128,
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
            ..Default::default()
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

    /// `f(const char *path, struct req *r)` with `r->len` (a long at 24),
    /// `r->name` (a `char *` at 0) and `r->next->id` (a short at 6 of the
    /// struct `r->next` at 8 points at) looked up.
    fn with_fields() -> ProbeInfo {
        let mut i = info(&[("path", Type::CString), ("r", Type::Pointer)], None);
        let path = |loads: Vec<i64>, width, ty| Ok(FieldPath { loads, width, ty, type_name: String::new() });
        i.fields = vec![
            ("r->len".into(), path(vec![24], 8, Type::Signed(8))),
            ("r->name".into(), path(vec![0], 8, Type::CString)),
            ("r->next->id".into(), path(vec![8, 6], 2, Type::Signed(2))),
            ("r->gone".into(), Err("`struct req` has no member `gone`".into())),
        ];
        i
    }

    #[test]
    fn fields_parse_as_chains_and_compile_to_loads() {
        let e = parse("r->next->id[2].x == 1").unwrap();
        let steps = vec![Step::Arrow("next".into()), Step::Arrow("id".into()), Step::Index(2), Step::Dot("x".into())];
        assert_eq!(e, Expr::Cmp(Operand::Field("r".into(), steps), Cmp::Eq, Operand::Int(1)));
        let i = with_fields();
        // r = 0x1000: len 150 at 0x1018, name at 0x1000 -> "GET" at 0x2000,
        // next at 0x1008 -> 0x3000, whose id at 0x3006 is -3.
        let read = |addr: u64, buf: &mut [u8]| {
            let word = |v: u64| v.to_le_bytes();
            let bytes: Vec<u8> = match addr {
                0x1018 => word(150).to_vec(),
                0x1000 => word(0x2000).to_vec(),
                0x1008 => word(0x3000).to_vec(),
                0x3006 => (-3i16).to_le_bytes().to_vec(),
                0x2000 => b"GET\0".to_vec(),
                _ => return 0,
            };
            let n = buf.len().min(bytes.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            n
        };
        let pass = |expr: &str, r: u64| {
            let c = compile(&parse(expr).unwrap(), &i, false).unwrap();
            assert!(filter::reads_memory(&c.entry), "{expr}");
            filter::eval(&c.entry, &[0, r, 0, 0, 0, 0, 0], &read)
        };
        assert!(pass("r->len > 100", 0x1000));
        assert!(!pass("r->len > 200", 0x1000));
        assert!(pass(r#"str(r->name) == "GET""#, 0x1000));
        assert!(pass(r#"r->name == "GET""#, 0x1000), "a char * field is a string by itself");
        assert!(pass("r->next->id == -3 && r->len & 2", 0x1000));
        // A bad pointer: nothing is selected, also under `!`.
        assert!(!pass("r->len > 100", 0x10));
        assert!(!pass("!(r->len > 100)", 0x10));
        let err = |expr: &str| compile(&parse(expr).unwrap(), &i, false).unwrap_err();
        assert!(err("r->gone == 1").contains("has no member `gone`"));
        assert!(err("r->next->id == 40000").contains("out of the range"));
        assert!(err("arg1->len == 1").contains("no type to follow"));
        assert!(err("q->len == 1").contains("has no parameter `q`"));
        let none =
            ProbeInfo { name: "g".into(), module: "m".into(), dwarf: None, operands: None, ..Default::default() };
        assert!(compile(&parse("p->len == 1").unwrap(), &none, false).unwrap_err().contains("debugging information"));
    }

    #[test]
    fn args_lists_pick_parameters_fields_and_strings() {
        let picks = parse_picks("path, r->len, str(arg1), r->next->id, arg0").unwrap();
        let texts: Vec<&str> = picks.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, ["path", "r->len", "str(arg1)", "r->next->id", "arg0"]);
        let i = with_fields();
        let (prog, shown) = fetch_program(&picks, &i).unwrap();
        let h = |reg: u64, loads: u64, width: u64, s: u64| {
            fetch_word::VALID
                | reg
                | (loads << fetch_word::LOADS_SHIFT)
                | (width << fetch_word::WIDTH_SHIFT)
                | (s << fetch_word::STR_SHIFT)
        };
        let s = FETCH_STR_MAX as u64;
        // path (a char *: its string copied), r->len, str(arg1), r->next->id.
        assert_eq!(prog, [h(0, 0, 8, s), h(1, 1, 8, 0), 24, h(1, 0, 8, s), h(1, 2, 2, 0), 8, 6]);
        let froms: Vec<&PickFrom> = shown.iter().map(|p| &p.from).collect();
        assert_eq!(
            froms,
            [
                &PickFrom::Fetched(Type::CString),
                &PickFrom::Fetched(Type::Signed(8)),
                &PickFrom::Fetched(Type::CString),
                &PickFrom::Fetched(Type::Signed(2)),
                &PickFrom::Position(0),
            ]
        );
        for (text, why) in [
            ("a,,b", "empty value"),
            ("r->len + 1", "unexpected `+`"),
            ("r->len == 1", "unexpected `==`"),
            ("str(path, 4)", "a whole string"),
            ("1", "--args names"),
            ("r->", "member's name"),
            ("r->x[", "takes an index"),
        ] {
            let e = parse_picks(text).unwrap_err();
            assert!(e.contains(why) && !e.contains('\n'), "{text}: {e}");
        }
        let nine = ["r->len"; 9].join(", ");
        assert!(fetch_program(&parse_picks(&nine).unwrap(), &i).unwrap_err().contains("at most 8"));
        assert!(fetch_program(&parse_picks("r->gone").unwrap(), &i).unwrap_err().contains("no member"));
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
        let none =
            ProbeInfo { name: "g".into(), module: "m".into(), dwarf: None, operands: None, ..Default::default() };
        assert!(compile(&parse("n == 1").unwrap(), &none, false).unwrap_err().contains("use arg0..arg5"));
        assert!(compile(&parse("arg2 == -1").unwrap(), &none, false).is_ok());
    }
    #[test]
    fn agg_names_keep_in_a_short_form_that_reads_back() {
        let a = parse_agg("hist(len), sum( len ), count(), avg(len)").unwrap().names();
        assert_eq!(a.stored(256), "hist,sum,count,avg(len)");
        assert_eq!(AggNames::from_stored(&a.stored(256)), Some(a));
        let c = parse_agg("count()").unwrap().names();
        assert_eq!((c.stored(256).as_str(), AggNames::from_stored("count")), ("count", Some(c)));
        // A value too long for the room is cut at a character, marked.
        let long = AggNames { funcs: vec![AggFn::Sum], value: Some("é".repeat(200)) };
        let s = long.stored(256);
        assert!(s.len() < 256 && s.ends_with("…)") && s.starts_with("sum(éé"), "{s}");
        assert!(AggNames::from_stored(&s).is_some());
        // Text the target wrote: nothing but what stored() writes reads.
        for bad in ["", "count()", "sum", "count(x)", "sum,sum(x)", "sum(x", "bogus(x)", "sum,(x)", "hist(x))y"] {
            assert_eq!(AggNames::from_stored(bad), None, "{bad:?}");
        }
    }
    #[test]
    fn keys_keep_as_words_that_parse_back() {
        for (written, kept) in
            [("fd, tid", "fd,tid"), ("stack, pid", "stack,pid"), ("ustack(2)", "stack(2)"), ("caller", "caller")]
        {
            let keys = parse_keys(written).unwrap();
            assert_eq!(keys_text(&keys), kept);
            assert_eq!(parse_keys(kept).unwrap(), keys);
        }
    }
    #[test]
    fn agg_lists_parse_to_functions_of_one_value() {
        let a = parse_agg("hist(len), sum( len ), count(), avg(len)").unwrap();
        assert_eq!(a.funcs, [AggFn::Hist, AggFn::Sum, AggFn::Count, AggFn::Avg]);
        assert_eq!(a.value, Some(("len".to_string(), Operand::Name("len".into()))));
        let f = parse_agg("max(req->uri.len)").unwrap();
        assert!(matches!(f.value, Some((_, Operand::Field(..)))));
        assert_eq!(parse_agg("count()").unwrap().value, None);
        assert!(agg_at_exit(&parse_agg("hist(ret), sum(ret)").unwrap()));
        let l = parse_agg("count(), hist(latency), avg( latency )").unwrap();
        assert_eq!(l.value, Some(("latency".to_string(), Operand::Latency)));
        assert!(agg_at_exit(&l) && agg_latency(&l));
        assert!(!agg_latency(&parse_agg("sum(ret)").unwrap()));
        assert!(parse_agg("sum(latency), max(len)").unwrap_err().contains("one value per function"));
        for (bad, why) in [
            ("", "name the functions"),
            ("median(x)", "not a function"),
            ("sum(a), max(b)", "one value per function"),
            ("sum(a), sum(a)", "named twice"),
            ("sum(a) max(a)", "separate the functions with commas"),
            ("sum(a", "ends with `)`"),
            ("sum()", "needs a value"),
            ("count(a)", "takes no value"),
            ("sum(3)", "aggregates a parameter"),
            ("sum(str(a))", "aggregates a parameter"),
            ("len", "not a function"),
        ] {
            let e = parse_agg(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn by_keys_are_tid_pid_and_one_argument_the_caller_or_the_stack() {
        assert_eq!(parse_keys("fd, tid").unwrap(), [Key::Value("fd".into()), Key::Tid]);
        assert_eq!(parse_keys("pid,tid,arg2").unwrap(), [Key::Pid, Key::Tid, Key::Value("arg2".into())]);
        assert_eq!(parse_keys("caller, tid").unwrap(), [Key::Caller, Key::Tid]);
        assert_eq!(parse_keys("stack").unwrap(), [Key::Stack(32)]);
        assert_eq!(parse_keys("ustack(5), pid").unwrap(), [Key::Stack(5), Key::Pid]);
        for (bad, why) in [
            ("a, b", "one of an argument's value, the caller and the stack at most"),
            ("fd, caller", "one of an argument's value, the caller and the stack at most"),
            ("stack, caller", "one of an argument's value, the caller and the stack at most"),
            ("tid, tid", "named twice"),
            ("stack(0)", "takes 1 to 32 frames"),
            ("stack(33)", "takes 1 to 32 frames"),
            ("ustack(x)", "takes 1 to 32 frames"),
            ("a > 1", "not a key"),
            ("tid,", "an empty key"),
        ] {
            let e = parse_keys(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn an_agg_program_reads_a_field_at_its_width_and_sign() {
        let i = info(&[("n", Type::Signed(4))], None);
        let p = agg_program(&parse_agg("sum(n)").unwrap(), &i).unwrap();
        let reg = Host::arg_registers(Abi::C, &[ParamClass::Scalar])[0].unwrap() as u64;
        assert_eq!(p[0] & fetch_word::REG_MASK, reg);
        assert_eq!((p[0] >> fetch_word::LOADS_SHIFT) & 0xff, 0);
        assert_eq!((p[0] >> fetch_word::EXT_SHIFT) & 0xff, filter_ext::I32);
        assert!(p[0] & fetch_word::SIGNED != 0);
        assert_eq!(agg_value(p[0], -5i64 as u64), -5);
        assert_eq!(agg_program(&parse_agg("count()").unwrap(), &i).unwrap(), [0; AGG_VALUE_WORDS]);
        assert!(agg_program(&parse_agg("sum(m)").unwrap(), &i).unwrap_err().contains("no parameter `m`"));
    }
}
