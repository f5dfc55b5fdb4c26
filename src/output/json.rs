//! JSON output, written by hand: tp emits a few fixed shapes (docs/output.md),
//! so a string escaper and an object writer are all it needs.

use std::fmt::Write;

use crate::events::values::Value;

/// `s` as a JSON string literal.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Controls and invisible format characters (all in the BMP):
            // a JSON line printed to a terminal must not act on it.
            c if crate::escape::is_unsafe(c) => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An argument or return value.
pub fn value(v: &Value) -> String {
    match v {
        Value::Int(v) | Value::Enum(v, None) => v.to_string(),
        Value::Enum(_, Some(name)) => string(name),
        Value::Uint(v) => v.to_string(),
        Value::Bool(v) => v.to_string(),
        Value::Char(c) => string(&(*c as char).to_string()),
        Value::Hex(v) => format!("\"{v:#x}\""),
        Value::Str(0, _) => "null".into(),
        Value::Str(_, Some(s)) => string(s),
        Value::Str(p, None) => format!("\"{p:#x}\""),
        Value::Unknown => "null".into(),
        Value::Unreadable(at) => format!("{{\"unreadable\":\"{at:#x}\"}}"),
    }
}

/// The arguments of a call: `{"a":1,"b":"x"}`.
pub fn args(args: &[(String, Value)]) -> String {
    let inner: Vec<String> = args.iter().map(|(n, v)| format!("{}:{}", string(n), value(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// A JSON object written key by key, in the order of the calls: tp's
/// documents have a fixed shape (docs/output.md), so every key is written
/// every time, `null` where there is no value.
#[derive(Debug, Clone)]
pub struct Obj(String);

impl Default for Obj {
    fn default() -> Obj {
        Obj::new()
    }
}

impl Obj {
    /// `{`.
    pub fn new() -> Obj {
        Obj(String::from("{"))
    }

    fn key(mut self, k: &str) -> Obj {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push_str(&string(k));
        self.0.push(':');
        self
    }

    /// A string value.
    pub fn str(self, k: &str, v: &str) -> Obj {
        let mut o = self.key(k);
        o.0.push_str(&string(v));
        o
    }

    /// A number (or any value whose text is JSON already: `true`, `null`).
    pub fn num(self, k: &str, v: impl std::fmt::Display) -> Obj {
        let mut o = self.key(k);
        let _ = write!(o.0, "{v}");
        o
    }

    /// A number, or `null`.
    pub fn opt(self, k: &str, v: Option<impl std::fmt::Display>) -> Obj {
        match v {
            Some(v) => self.num(k, v),
            None => self.num(k, "null"),
        }
    }

    /// A string, or `null`.
    pub fn opt_str(self, k: &str, v: Option<&str>) -> Obj {
        match v {
            Some(v) => self.str(k, v),
            None => self.num(k, "null"),
        }
    }

    /// A value already written as JSON (an object, an array).
    pub fn raw(self, k: &str, json: &str) -> Obj {
        let mut o = self.key(k);
        o.0.push_str(json);
        o
    }

    /// An array of values already written as JSON.
    pub fn list(self, k: &str, items: impl IntoIterator<Item = String>) -> Obj {
        let items: Vec<String> = items.into_iter().collect();
        self.raw(k, &format!("[{}]", items.join(",")))
    }

    /// `}`: the object's text.
    pub fn finish(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

/// An address as tp's JSON writes it: a hexadecimal string.
pub fn address(a: u64) -> String {
    format!("{a:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::values::Value;

    #[test]
    fn values_and_arguments() {
        let a = [
            ("n".to_string(), Value::Int(-5)),
            ("x".to_string(), Value::Unknown),
            ("ok".to_string(), Value::Bool(true)),
        ];
        assert_eq!(args(&a), r#"{"n":-5,"x":null,"ok":true}"#);
        assert_eq!(value(&Value::Str(0x10, Some("a\"b".into()))), r#""a\"b""#);
        assert_eq!(value(&Value::Str(0x10, None)), r#""0x10""#);
        assert_eq!(value(&Value::Hex(255)), r#""0xff""#);
        assert_eq!(value(&Value::Char(b'x')), r#""x""#);
    }

    #[test]
    fn escapes_strings() {
        assert_eq!(string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }

    #[test]
    fn objects_keep_their_keys_in_order() {
        let o = Obj::new()
            .str("type", "x\"y")
            .num("n", 3)
            .opt("none", None::<u64>)
            .opt_str("s", Some("a"))
            .list("l", ["1".to_string(), "2".to_string()]);
        assert_eq!(o.finish(), r#"{"type":"x\"y","n":3,"none":null,"s":"a","l":[1,2]}"#);
        assert_eq!(Obj::new().finish(), "{}");
    }
}
