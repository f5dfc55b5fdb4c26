//! Text tables, and the cells they are made of: a name from a target is
//! escaped for the terminal and, past a column's widest, shortened in the
//! middle with an ellipsis, so one long name (a C++ or Rust generic runs to
//! thousands of characters) never widens every row. JSON keeps names whole.

use std::io::{self, Write};

use super::{Summary, thousands};
use crate::escape::text;

/// The widest a function column grows.
pub const NAME_MAX: usize = 60;
/// The widest a module column grows.
pub const MODULE_MAX: usize = 28;

/// `s` escaped for a terminal, and if longer than `max` characters (at
/// least 5), shortened to `max` with `…` in place of its middle.
pub fn fit(s: &str, max: usize) -> String {
    let s = text(s);
    let n = s.chars().count();
    let max = max.max(5);
    if n <= max {
        return s.into_owned();
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}

/// The width of a column of `cells` ([`fit`] to `max`), at least `min`.
pub fn width<'a>(cells: impl Iterator<Item = &'a str>, min: usize, max: usize) -> usize {
    cells.map(|c| text(c).chars().count().min(max)).max().unwrap_or(0).max(min)
}

/// The summary as an aligned table, its rows in the order given; a
/// switched-off probe is marked `off`. With `--if`, every call that
/// reached a probe (`UNFILTERED`) is beside the calls that passed (`HITS`).
pub fn summary(s: &Summary, out: &mut impl Write) -> io::Result<()> {
    let name_w = width(s.probes.iter().map(|p| p.func.as_str()), 8, NAME_MAX);
    let mod_w = width(s.probes.iter().map(|p| p.module.as_str()), 6, MODULE_MAX);
    let filtered = s.probes.iter().any(|p| p.unfiltered.is_some());
    let extra = if filtered { format!("  {:>15}", "UNFILTERED") } else { String::new() };
    writeln!(out, "{:<name_w$}  {:<mod_w$}  {:<18}  {:>15}{extra}", "FUNCTION", "MODULE", "ADDRESS", "HITS")?;
    for p in &s.probes {
        let extra = match filtered {
            true => format!("  {:>15}", thousands(p.unfiltered.unwrap_or(p.hits))),
            false => String::new(),
        };
        writeln!(
            out,
            "{:<name_w$}  {:<mod_w$}  {:<18}  {:>15}{extra}{}",
            fit(&p.func, name_w),
            fit(&p.module, mod_w),
            format!("{:#x}", p.address),
            thousands(p.hits),
            if p.enabled { "" } else { "  off" }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ProbeStat;

    #[test]
    fn aligns_columns() {
        let s = Summary {
            pid: 1,
            probes: vec![
                ProbeStat::new("foo".into(), "counter".into(), 0x1630, (1234, None)),
                ProbeStat::new("a_longer_name".into(), "counter".into(), 0x1670, (5, None)).switched(false),
            ],
        };
        let mut out = Vec::new();
        summary(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "FUNCTION       MODULE   ADDRESS                        HITS");
        assert_eq!(lines[1], "foo            counter  0x1630                        1,234");
        assert_eq!(lines[2], "a_longer_name  counter  0x1670                            5  off");
    }

    #[test]
    fn long_names_are_shortened_in_the_middle() {
        assert_eq!(fit("short", 60), "short");
        let long = format!("<app::Sink<{}> as app::Trait>::matched", "M,".repeat(3000));
        let cell = fit(&long, 20);
        assert_eq!(cell.chars().count(), 20);
        assert_eq!(cell, "<app::Sin…>::matched");
        // Escaped first: what is shortened is the escaped text, safe to print.
        assert_eq!(fit("a\x1bb", 60), "a\\x1bb");
        let probes: Vec<ProbeStat> =
            (0..3).map(|i| ProbeStat::new(long.repeat(i + 1), "m".into(), 0, (1, None))).collect();
        let mut out = Vec::new();
        summary(&Summary { pid: 1, probes }, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().all(|l| l.chars().count() <= NAME_MAX + 60), "{text}");
    }
}
