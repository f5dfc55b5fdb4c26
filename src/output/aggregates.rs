//! Aggregates kept in the target (`--agg`, and `--by` with `tid` or
//! `pid`): per function, one row per key, with the functions asked (count,
//! sum, min, max, avg) and a power-of-two histogram (`hist`), written as
//! bpftrace prints its maps (`@[key]: …`, `[lo, hi)  count |@@@|`). A
//! `caller` key (`--by caller`) is a return address, shown named
//! (`function+0x1f (module)`) from [`ProbeAgg::callers`]; a `stack` key
//! (`--by stack`) is the hash of a stack's return addresses, shown as its
//! frames from [`ProbeAgg::stacks`].

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::json::{self, Obj};
use super::thousands;
use crate::escape::text;
use crate::events::predicate::AggFn;
use crate::events::stacks::Frame;

/// Bar width of a histogram, as bpftrace draws it.
const BAR: u64 = 52;

/// One function's aggregates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeAgg {
    /// The function.
    pub function: String,
    /// The keys, as the user named them (`tid`, `pid`, an argument).
    pub keys: Vec<String>,
    /// The value aggregated, as the user named it; none for a count.
    pub value: Option<String>,
    /// The functions asked, in order.
    pub funcs: Vec<AggFn>,
    /// One row per key, in key order.
    pub rows: Vec<AggRow>,
    /// Calls not counted: a thread's table was full (the process's total).
    pub overflow: u64,
    /// Calls not counted: their value could not be read (the process's total).
    pub unreadable: u64,
    /// The `caller` key's values named (function, offset, module), by
    /// address; an address not here is shown as a number.
    pub callers: BTreeMap<i128, Frame>,
    /// The `stack` key's frames named, the call's return address first, by
    /// key (the frames' hash); a key not here is shown by its hash.
    pub stacks: BTreeMap<i128, Vec<Frame>>,
}

/// The key named `caller` (`--by caller`).
pub const CALLER: &str = "caller";
/// The key named `stack` (`--by stack`).
pub const STACK: &str = "stack";

impl ProbeAgg {
    /// The texts of `r`'s key values: numbers, a caller named, a stack
    /// folded (its frames outermost first, joined by `;`, as flame graphs
    /// take them).
    pub fn key_texts(&self, r: &AggRow) -> Vec<String> {
        r.key
            .iter()
            .enumerate()
            .map(|(i, v)| match self.keys.get(i).map(String::as_str) {
                Some(CALLER) => match self.callers.get(v) {
                    Some(f) => f.text(),
                    None => format!("{:#x}", *v as u64),
                },
                Some(STACK) => match self.stacks.get(v) {
                    Some(frames) => frames.iter().rev().map(Frame::text).collect::<Vec<_>>().join(";"),
                    None => stack_id(*v),
                },
                _ => v.to_string(),
            })
            .collect()
    }
}

/// A stack key by its hash, where its frames are not known.
fn stack_id(v: i128) -> String {
    format!("stack {:#018x}", v as u64)
}

/// The aggregate of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggRow {
    /// The key's values, in the order of [`ProbeAgg::keys`].
    pub key: Vec<i128>,
    /// Calls.
    pub count: u64,
    /// Sum of the values.
    pub sum: i128,
    /// Smallest value.
    pub min: i128,
    /// Largest value.
    pub max: i128,
    /// Calls per bucket ([`crate::events::aggregates::agg_bucket`]), or empty.
    pub hist: Vec<u64>,
}

impl AggRow {
    /// The mean value, rounded toward zero (as bpftrace's `avg`).
    pub fn avg(&self) -> i128 {
        if self.count == 0 { 0 } else { self.sum / self.count as i128 }
    }

    /// Adds the calls of `other` (the same key, another thread's).
    pub fn merge(&mut self, other: &AggRow) {
        if self.count == 0 {
            self.min = other.min;
            self.max = other.max;
        } else if other.count > 0 {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        if self.hist.len() < other.hist.len() {
            self.hist.resize(other.hist.len(), 0);
        }
        for (a, b) in self.hist.iter_mut().zip(&other.hist) {
            *a = a.saturating_add(*b);
        }
    }
}

/// Rows of the same key merged, in key order.
pub fn merged(rows: impl IntoIterator<Item = AggRow>) -> Vec<AggRow> {
    let mut by: BTreeMap<Vec<i128>, AggRow> = BTreeMap::new();
    for r in rows {
        match by.get_mut(&r.key) {
            Some(have) => have.merge(&r),
            None => {
                by.insert(r.key.clone(), r);
            }
        }
    }
    by.into_values().collect()
}

/// The values bucket `b` holds: `[low, high)`, `low` none for the negative ones.
pub fn bucket_bounds(b: usize) -> (Option<i128>, i128) {
    match b {
        0 => (None, 0),
        1 => (Some(0), 1),
        b => (Some(1i128 << (b - 2)), 1i128 << (b - 1)),
    }
}

fn short(v: i128) -> String {
    match v {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// `@[key, …]`, a stack key's frames one per line as bpftrace prints a
/// `ustack` key, the call's return address first.
fn key_text(p: &ProbeAgg, r: &AggRow) -> String {
    if r.key.is_empty() {
        return "@".into();
    }
    let texts = p.key_texts(r);
    let parts: Vec<String> = r
        .key
        .iter()
        .zip(&texts)
        .enumerate()
        .map(|(i, (v, t))| match (p.keys.get(i).map(String::as_str), p.stacks.get(v)) {
            (Some(STACK), Some(frames)) => {
                let lines: String = frames.iter().map(|f| format!("    {}\n", text(&f.text()))).collect();
                format!("\n{lines}")
            }
            _ => text(t).into_owned(),
        })
        .collect();
    format!("@[{}]", parts.join(", "))
}

/// The histogram lines of `hist`: from its first bucket with calls to its last.
fn hist_text(out: &mut impl Write, hist: &[u64]) -> io::Result<()> {
    let (Some(first), Some(last)) = (hist.iter().position(|&n| n > 0), hist.iter().rposition(|&n| n > 0)) else {
        return Ok(());
    };
    let max = hist.iter().copied().max().unwrap_or(0).max(1);
    for (b, &n) in hist.iter().enumerate().take(last + 1).skip(first) {
        let label = match bucket_bounds(b) {
            (None, _) => "(..., 0)".to_string(),
            (Some(lo), hi) if hi - lo == 1 => format!("[{}]", short(lo)),
            (Some(lo), hi) => format!("[{}, {})", short(lo), short(hi)),
        };
        // Counts the target wrote: no product may overflow.
        let bar = "@".repeat((u128::from(n) * u128::from(BAR) / u128::from(max)) as usize);
        writeln!(out, "{label:<16}{n:>8} |{bar:<52}|")?;
    }
    Ok(())
}

/// The functions' names with their value: `sum(len), hist(len)`.
fn title(p: &ProbeAgg) -> String {
    let value = p.value.as_deref().map(text).unwrap_or_default();
    p.funcs
        .iter()
        .map(|f| format!("{}({})", f.name(), if *f == AggFn::Count { "" } else { &value }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes each function's aggregates.
pub fn write_text(out: &mut impl Write, all: &[ProbeAgg]) -> io::Result<()> {
    for p in all {
        let by = match p.keys.is_empty() {
            true => String::new(),
            false => format!(" by {}", p.keys.iter().map(|k| text(k).into_owned()).collect::<Vec<_>>().join(", ")),
        };
        writeln!(out, "\n{} of {}{by}:", title(p), text(&p.function))?;
        for r in &p.rows {
            let parts: Vec<String> = p
                .funcs
                .iter()
                .filter_map(|f| match f {
                    AggFn::Count => Some(format!("count {}", thousands(r.count))),
                    AggFn::Sum => Some(format!("sum {}", r.sum)),
                    AggFn::Min => Some(format!("min {}", r.min)),
                    AggFn::Max => Some(format!("max {}", r.max)),
                    AggFn::Avg => Some(format!("avg {}", r.avg())),
                    AggFn::Hist => None,
                })
                .collect();
            match parts.is_empty() {
                true => writeln!(out, "{}:", key_text(p, r))?,
                false => writeln!(out, "{}: {}", key_text(p, r), parts.join(", "))?,
            }
            if p.funcs.contains(&AggFn::Hist) {
                hist_text(out, &r.hist)?;
                writeln!(out)?;
            }
        }
        if p.overflow > 0 {
            writeln!(out, "({} calls not counted: a thread's table of aggregates was full)", thousands(p.overflow))?;
        }
        if p.unreadable > 0 {
            writeln!(out, "({} calls not counted: their value could not be read)", thousands(p.unreadable))?;
        }
    }
    Ok(())
}

fn row_json(p: &ProbeAgg, r: &AggRow) -> String {
    let has = p.value.is_some();
    let hist = match p.funcs.contains(&AggFn::Hist) {
        true => r
            .hist
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(b, n)| {
                let (lo, hi) = bucket_bounds(b);
                Obj::new().opt("low", lo).num("high", hi).num("count", n).finish()
            })
            .collect(),
        false => Vec::new(),
    };
    // A caller's key is its name; its address and parts come beside it.
    let caller = p.keys.iter().position(|k| k == CALLER);
    let stack_at = p.keys.iter().position(|k| k == STACK);
    let key = r.key.iter().zip(p.key_texts(r)).enumerate().map(|(i, (v, t))| match i {
        _ if Some(i) == caller => json::string(&t),
        _ if Some(i) == stack_at => json::string(&format!("{:#x}", *v as u64)),
        _ => v.to_string(),
    });
    let site = caller.and_then(|i| r.key.get(i)).map(|&v| {
        let f = p.callers.get(&v);
        Obj::new()
            .str("addr", &json::address(v as u64))
            .opt_str("func", f.and_then(|f| f.function.as_deref()))
            .opt("offset", f.filter(|f| f.function.is_some()).map(|f| f.offset))
            .opt_str("module", f.and_then(|f| f.module.as_deref()))
            .finish()
    });
    // A stack's key is its hash; its frames come beside it, as --stack's.
    let stack = p.keys.iter().position(|k| k == STACK).and_then(|i| r.key.get(i)).and_then(|v| p.stacks.get(v));
    let mut o = Obj::new().list("key", key);
    if let Some(site) = site {
        o = o.raw("caller", &site);
    }
    if let Some(frames) = stack {
        o = o.list("stack", frames.iter().map(|f| json::string(&f.text())));
    }
    o.num("count", r.count)
        .opt("sum", has.then_some(r.sum))
        .opt("min", has.then_some(r.min))
        .opt("max", has.then_some(r.max))
        .opt("avg", has.then_some(r.avg()))
        .list("hist", hist)
        .finish()
}

/// One function's aggregates as JSON (docs/output.md).
pub fn to_json(p: &ProbeAgg) -> String {
    Obj::new()
        .str("func", &p.function)
        .list("keys", p.keys.iter().map(|k| json::string(k)))
        .opt_str("value", p.value.as_deref())
        .list("funcs", p.funcs.iter().map(|f| json::string(f.name())))
        .num("overflow", p.overflow)
        .num("unreadable", p.unreadable)
        .list("rows", p.rows.iter().map(|r| row_json(p, r)))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::aggregates::{AGG_HIST_BUCKETS as BUCKETS, agg_bucket};

    #[test]
    fn buckets_hold_what_agg_bucket_puts_there() {
        for v in [1i64, 2, 3, 4, 7, 8, 100, 1 << 40, i64::MAX] {
            let b = agg_bucket(v as u64, true);
            let (lo, hi) = bucket_bounds(b);
            assert!(lo.unwrap() <= v as i128 && (v as i128) < hi, "{v} in bucket {b}");
        }
        assert_eq!(bucket_bounds(agg_bucket(0, true)), (Some(0), 1));
        assert_eq!(bucket_bounds(agg_bucket(-5i64 as u64, true)), (None, 0));
        assert_eq!(agg_bucket(u64::MAX, false), BUCKETS - 1);
    }

    #[test]
    fn rows_of_one_key_merge_and_print_as_bpftrace_does() {
        let row = |key: i128, vals: &[i128]| {
            let mut hist = vec![0; BUCKETS];
            for &v in vals {
                hist[agg_bucket(v as u64, true)] += 1;
            }
            AggRow {
                key: vec![key],
                count: vals.len() as u64,
                sum: vals.iter().sum(),
                min: *vals.iter().min().unwrap(),
                max: *vals.iter().max().unwrap(),
                hist,
            }
        };
        let rows = merged([row(7, &[1, 5]), row(3, &[0]), row(7, &[100, -2])]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].count, rows[1].sum, rows[1].min, rows[1].max, rows[1].avg()), (4, 104, -2, 100, 26));
        let p = ProbeAgg {
            function: "f".into(),
            keys: vec!["tid".into()],
            value: Some("len".into()),
            funcs: vec![AggFn::Sum, AggFn::Hist],
            rows,
            overflow: 0,
            unreadable: 2,
            callers: BTreeMap::new(),
            stacks: BTreeMap::new(),
        };
        let mut out = Vec::new();
        write_text(&mut out, std::slice::from_ref(&p)).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("\nsum(len), hist(len) of f by tid:\n@[3]: sum 0\n[0]"), "{s}");
        assert!(s.contains("@[7]: sum 104\n(..., 0)  "), "{s}");
        assert!(s.contains("\n[4, 8)                 1 |"), "{s}");
        assert!(s.contains("\n[64, 128)              1 |"), "{s}");
        assert!(s.ends_with("(2 calls not counted: their value could not be read)\n"), "{s}");
        let v: serde_json::Value = serde_json::from_str(&to_json(&p)).unwrap();
        assert_eq!(v["rows"][1]["key"][0], 7);
        assert_eq!(v["rows"][1]["avg"], 26);
        assert_eq!(v["rows"][1]["hist"][0]["low"], serde_json::Value::Null);
        assert_eq!(v["rows"][1]["hist"].as_array().unwrap().len(), 4);
    }
    #[test]
    fn counts_the_target_wrote_never_overflow_a_bar() {
        let mut hist = vec![0; BUCKETS];
        hist[3] = u64::MAX;
        hist[4] = u64::MAX / 2;
        let row = AggRow { key: vec![], count: u64::MAX, sum: i128::MAX, min: 0, max: 1, hist };
        let p = ProbeAgg {
            function: "f".into(),
            funcs: vec![AggFn::Avg, AggFn::Hist],
            rows: vec![row],
            ..Default::default()
        };
        let mut out = Vec::new();
        write_text(&mut out, &[p]).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("@: avg "), "{s}");
        assert!(s.contains(&format!("|{}|", "@".repeat(52))), "{s}");
    }
}
