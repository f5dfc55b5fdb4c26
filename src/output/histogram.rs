//! Latency summaries: a table per function, and bpftrace's power-of-two
//! histogram (`[lo, hi)  count |@@@@|`).

use std::io::{self, Write};

use super::events::duration;
use super::thousands;
use crate::events::stats::Latency;

/// Bar width of the histogram, as bpftrace draws it.
const BAR: u64 = 52;

fn short(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// The histogram of `l` under the title `name`, durations in nanoseconds.
pub fn histogram(out: &mut impl Write, name: &str, l: &Latency) -> io::Result<()> {
    writeln!(out, "@ns[{}]:", crate::escape::text(name))?;
    let buckets = l.log2_buckets();
    let max = buckets.iter().map(|b| b.2).max().unwrap_or(0).max(1);
    for (lo, hi, n) in buckets {
        let label = if hi - lo == 1 { format!("[{}]", short(lo)) } else { format!("[{}, {})", short(lo), short(hi)) };
        let bar = "@".repeat((n * BAR / max) as usize);
        writeln!(out, "{label:<16}{n:>8} |{bar:<52}|")?;
    }
    writeln!(out)
}

/// One row per function: hits (with `--if`, beside every call), timed
/// calls, total, mean, p50, p99; `-` where a row was not timed.
pub fn table(out: &mut impl Write, rows: &[(String, u64, Option<u64>, Option<&Latency>)]) -> io::Result<()> {
    let w = super::table::width(rows.iter().map(|r| r.0.as_str()), 8, super::table::NAME_MAX);
    let filtered = rows.iter().any(|r| r.2.is_some());
    let unfiltered = |u: Option<u64>, hits: u64| match filtered {
        true => format!("  {:>13}", thousands(u.unwrap_or(hits))),
        false => String::new(),
    };
    writeln!(
        out,
        "{:<w$}  {:>13}{}  {:>9}  {:>10}  {:>10}  {:>10}  {:>10}",
        "FUNCTION",
        "HITS",
        if filtered { format!("  {:>13}", "UNFILTERED") } else { String::new() },
        "TIMED",
        "TOTAL",
        "AVG",
        "P50",
        "P99"
    )?;
    for (name, hits, u, l) in rows {
        let name = super::table::fit(name, w);
        let Some(l) = l.filter(|l| l.count > 0) else {
            let timed = if l.is_some() { "0" } else { "-" };
            writeln!(
                out,
                "{name:<w$}  {:>13}{}  {timed:>9}  {:>10}  {:>10}  {:>10}  {:>10}",
                thousands(*hits),
                unfiltered(*u, *hits),
                "-",
                "-",
                "-",
                "-"
            )?;
            continue;
        };
        writeln!(
            out,
            "{name:<w$}  {:>13}{}  {:>9}  {:>10}  {:>10}  {:>10}  {:>10}",
            thousands(*hits),
            unfiltered(*u, *hits),
            thousands(l.count),
            duration(l.total_ns),
            duration(l.avg_ns()),
            duration(l.quantile_ns(0.5)),
            duration(l.quantile_ns(0.99))
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_like_bpftrace() {
        let mut l = Latency::default();
        for ns in [1, 2, 3, 1024, 1500, 1600, 1700] {
            l.add(ns);
        }
        let mut out = Vec::new();
        histogram(&mut out, "foo", &l).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "@ns[foo]:");
        assert_eq!(lines[1], format!("{:<16}{:>8} |{:<52}|", "[1]", 1, "@".repeat(13)));
        assert_eq!(lines[2], format!("{:<16}{:>8} |{:<52}|", "[2, 4)", 2, "@".repeat(26)));
        assert!(lines.iter().any(|l| l.starts_with("[1K, 2K)") && l.contains(&"@".repeat(52))), "{text}");
    }
}
