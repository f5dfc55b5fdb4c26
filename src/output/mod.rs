//! Presentation: what tp prints, and nothing about how the numbers were
//! obtained. Results go to stdout (or `-o FILE`), in the format chosen
//! once per command ([`mod@format`]); notes go to stderr. docs/output.md
//! documents every shape.

pub mod aggregates;
pub mod blocks;
pub mod chrome;
pub mod chrome_args;
pub mod events;
pub mod format;
pub mod histogram;
pub mod json;
pub mod listing;
pub mod live;
pub mod openmetrics;
pub mod profile;
pub mod report;
pub mod results;
pub mod sink;
pub mod stacks;
pub mod steps;
pub mod table;
pub mod tree;

/// One probe's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeStat {
    /// Function name.
    pub func: String,
    /// Module file name.
    pub module: String,
    /// The function's address in the target.
    pub address: u64,
    /// Calls counted: with `--if`, those that passed it.
    pub hits: u64,
    /// With `--if`: every call that reached the probe.
    pub unfiltered: Option<u64>,
    /// False while the probe is switched off (`tp disable`).
    pub enabled: bool,
}

impl ProbeStat {
    /// The row of the probe at `address` in `func` of `module`, switched
    /// on, with its `calls`: those counted (with `--if`, those that passed
    /// it) and, with `--if`, every call that reached it.
    pub fn new(func: String, module: String, address: u64, calls: (u64, Option<u64>)) -> ProbeStat {
        let (hits, unfiltered) = calls;
        ProbeStat { func, module, address, hits, unfiltered, enabled: true }
    }

    /// The row, switched on or off (`tp disable`).
    pub fn switched(self, enabled: bool) -> ProbeStat {
        ProbeStat { enabled, ..self }
    }
}

/// The probes of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The process.
    pub pid: i32,
    /// Its probes.
    pub probes: Vec<ProbeStat>,
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate per second, short: `950/s`, `12.3k/s`, `4.56M/s`.
pub fn rate(per_sec: f64) -> String {
    match per_sec {
        r if r >= 1e9 => format!("{:.2}G/s", r / 1e9),
        r if r >= 1e6 => format!("{:.2}M/s", r / 1e6),
        r if r >= 1e3 => format!("{:.1}k/s", r / 1e3),
        r => format!("{r:.0}/s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(rate(950.0), "950/s");
        assert_eq!(rate(12_345.0), "12.3k/s");
        assert_eq!(rate(4_560_000.0), "4.56M/s");
    }
}
