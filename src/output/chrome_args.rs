//! The `args` of a Chrome trace event ([`super::chrome::ChromeTrace`]): a
//! call's arguments in their order, then what the trace adds (its stack,
//! its return value, how it ended), serialized by serde_json with the
//! escapes of [`super::json::string`] (a control or invisible format
//! character as `\uXXXX`), so that a trace printed to a terminal cannot act
//! on it and reads the same as tp's other JSON.

use std::io::{self, Write};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value as Json;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

use crate::escape;
use crate::events::values::Value;

/// The `args` object of one event: its keys in the order they were added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChromeArgs(Vec<(String, Json)>);

impl ChromeArgs {
    /// A call's arguments, in their order.
    pub fn of_call(args: &[(String, Value)]) -> ChromeArgs {
        ChromeArgs(args.iter().map(|(name, v)| (name.clone(), value(v))).collect())
    }

    /// Adds `key` after the keys already there.
    pub fn push(&mut self, key: &str, v: Json) {
        self.0.push((key.to_string(), v));
    }

    /// The object as JSON text, on one line.
    pub fn to_json(&self) -> io::Result<String> {
        let mut out = Vec::new();
        write(&mut out, self)?;
        String::from_utf8(out).map_err(io::Error::other)
    }
}

impl Serialize for ChromeArgs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (key, v) in &self.0 {
            map.serialize_entry(key, v)?;
        }
        map.end()
    }
}

/// An argument or return value, as [`super::json::value`] writes it.
pub fn value(v: &Value) -> Json {
    match v {
        Value::Int(v) | Value::Enum(v, None) => Json::from(*v),
        Value::Enum(_, Some(name)) => Json::from(name.as_str()),
        Value::Uint(v) => Json::from(*v),
        Value::Bool(v) => Json::from(*v),
        Value::Char(c) => Json::from((*c as char).to_string()),
        Value::Hex(v) => Json::from(format!("{v:#x}")),
        Value::Str(0, _) => Json::Null,
        Value::Str(_, Some(s)) => Json::from(s.as_str()),
        Value::Str(p, None) => Json::from(format!("{p:#x}")),
        Value::Unknown => Json::Null,
        Value::Unreadable(at) => serde_json::json!({ "unreadable": format!("{at:#x}") }),
    }
}

/// Writes `v` to `w` as a trace writes its JSON: compact, with the escapes
/// of [`super::json::string`], times to the nanosecond.
pub fn write(w: &mut impl Write, v: &impl Serialize) -> io::Result<()> {
    v.serialize(&mut serde_json::Serializer::with_formatter(w, Escapes)).map_err(io::Error::other)
}

/// serde_json's compact output with the escapes of [`super::json::string`]:
/// `\"`, `\\`, `\n`, `\r` and `\t`, and every other [`escape::is_unsafe`]
/// character (serde_json leaves DEL, the C1 controls and the invisible
/// format characters as they are, and writes `\b` and `\f`) as `\uXXXX`.
/// A number with a fraction is a trace's time in microseconds, written to
/// the nanosecond (three decimals); the values of a call are integers.
struct Escapes;

impl Formatter for Escapes {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        write!(w, "{value:.3}")
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| escape::is_unsafe(c)) {
            w.write_all(&rest.as_bytes()[..at])?;
            write!(w, "\\u{:04x}", c as u32)?;
            rest = &rest[at + c.len_utf8()..];
        }
        w.write_all(rest.as_bytes())
    }

    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, e: CharEscape) -> io::Result<()> {
        match e {
            CharEscape::Backspace => w.write_all(b"\\u0008"),
            CharEscape::FormFeed => w.write_all(b"\\u000c"),
            e => CompactFormatter.write_char_escape(w, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    /// Every character class the escapes tell apart.
    fn nasty() -> String {
        let mut s: String = (0u32..0x100).filter_map(char::from_u32).collect();
        s.push_str("/\u{061c}\u{200b}\u{200f}\u{2028}\u{202e}\u{2060}\u{2069}\u{feff}\u{fffb}é€😀\u{10ffff}");
        s
    }

    #[test]
    fn arguments_are_written_as_tps_own_json_writes_them() {
        let args: Vec<(String, Value)> = vec![
            ("i".into(), Value::Int(-7)),
            ("e".into(), Value::Enum(3, None)),
            ("n".into(), Value::Enum(2, Some("RED".into()))),
            ("u".into(), Value::Uint(u64::MAX)),
            ("b".into(), Value::Bool(true)),
            ("c".into(), Value::Char(b'"')),
            ("c2".into(), Value::Char(0x1b)),
            ("h".into(), Value::Hex(0xdead_beef)),
            ("null".into(), Value::Str(0, Some("x".into()))),
            ("s".into(), Value::Str(0x1000, Some(nasty()))),
            ("p".into(), Value::Str(0x1000, None)),
            ("unknown".into(), Value::Unknown),
            ("bad".into(), Value::Unreadable(0x10)),
            (nasty(), Value::Int(1)),
            ("i".into(), Value::Int(2)),
        ];
        assert_eq!(ChromeArgs::of_call(&args).to_json().unwrap(), json::args(&args));
        assert_eq!(ChromeArgs::of_call(&[]).to_json().unwrap(), "{}");
    }

    #[test]
    fn what_the_trace_adds_follows_the_arguments() {
        let mut a = ChromeArgs::of_call(&[("x".into(), Value::Int(1))]);
        a.push("stack", Json::from(vec!["main", "f\u{202e}"]));
        a.push("ret", value(&Value::Hex(16)));
        assert_eq!(a.to_json().unwrap(), r#"{"x":1,"stack":["main","f\u202e"],"ret":"0x10"}"#);
        let mut b = ChromeArgs::default();
        b.push("unwound", Json::Bool(true));
        assert_eq!(b.to_json().unwrap(), r#"{"unwound":true}"#);
    }
}
