//! JSON output, written by hand: tp emits a few fixed shapes, so a string
//! escaper and a formatter per shape are all it needs.

use std::fmt::Write;

use super::Summary;
use crate::events::format::Value;

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
        Value::Int(v) => v.to_string(),
        Value::Uint(v) => v.to_string(),
        Value::Bool(v) => v.to_string(),
        Value::Char(c) => string(&(*c as char).to_string()),
        Value::Hex(v) => format!("\"{v:#x}\""),
        Value::Str(0, _) => "null".into(),
        Value::Str(_, Some(s)) => string(s),
        Value::Str(p, None) => format!("\"{p:#x}\""),
        Value::Unknown => "null".into(),
    }
}

/// The arguments of a call: `{"a":1,"b":"x"}`.
pub fn args(args: &[(String, Value)]) -> String {
    let inner: Vec<String> = args.iter().map(|(n, v)| format!("{}:{}", string(n), value(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// `{"pid":…,"probes":[{"func":"foo","module":"m","address":"0x…","hits":N,"enabled":true},…]}`.
pub fn summary(s: &Summary) -> String {
    let probes: Vec<String> = s
        .probes
        .iter()
        .map(|p| {
            format!(
                "{{\"func\":{},\"module\":{},\"address\":\"{:#x}\",\"hits\":{},\"enabled\":{}}}",
                string(&p.func),
                string(&p.module),
                p.address,
                p.hits,
                p.enabled
            )
        })
        .collect();
    format!("{{\"pid\":{},\"probes\":[{}]}}", s.pid, probes.join(","))
}

/// The summary with latency: each probe gains `calls_timed`, `total_ns`,
/// `avg_ns`, `p50_ns`, `p99_ns` and `histogram` (`[[low_ns, high_ns, count], …]`)
/// when it was timed, and the object gains `lost_events`.
pub fn summary_with_latency(s: &Summary, latency: &[Option<&crate::events::stats::Latency>], lost: u64) -> String {
    let probes: Vec<String> = s
        .probes
        .iter()
        .zip(latency)
        .map(|(p, l)| {
            let mut o = format!(
                "{{\"func\":{},\"module\":{},\"address\":\"{:#x}\",\"hits\":{}",
                string(&p.func),
                string(&p.module),
                p.address,
                p.hits
            );
            if let Some(l) = l {
                let hist: Vec<String> = l.log2_buckets().iter().map(|(lo, hi, n)| format!("[{lo},{hi},{n}]")).collect();
                let _ = write!(
                    o,
                    ",\"calls_timed\":{},\"total_ns\":{},\"avg_ns\":{},\"p50_ns\":{},\"p99_ns\":{},\"histogram\":[{}]",
                    l.count,
                    l.total_ns,
                    l.avg_ns(),
                    l.quantile_ns(0.5),
                    l.quantile_ns(0.99),
                    hist.join(",")
                );
            }
            o.push('}');
            o
        })
        .collect();
    format!("{{\"pid\":{},\"probes\":[{}],\"lost_events\":{lost}}}", s.pid, probes.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::format::Value;
    use crate::output::ProbeStat;

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
    fn summary_shape() {
        let s = Summary {
            pid: 7,
            probes: vec![ProbeStat { func: "foo".into(), module: "m".into(), address: 0x1630, hits: 3, enabled: true }],
        };
        assert_eq!(
            summary(&s),
            r#"{"pid":7,"probes":[{"func":"foo","module":"m","address":"0x1630","hits":3,"enabled":true}]}"#
        );
    }
}
