//! Medians with their spread, and how numbers are written in the tables.

/// The median of a set of runs, with the smallest and largest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many runs.
    pub n: usize,
}

impl Spread {
    /// The spread of `values`; None if there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if !n.is_multiple_of(2) { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Spread { median, min: v[0], max: v[n - 1], n })
    }

    /// `median [min–max]`.
    pub fn show(&self) -> String {
        if self.n == 1 {
            return num(self.median);
        }
        format!("{} [{}–{}]", num(self.median), num(self.min), num(self.max))
    }
}

/// `median [min–max]`, or `–` when there were no runs.
pub fn show(s: Option<Spread>) -> String {
    s.map_or_else(|| "–".to_string(), |s| s.show())
}

/// An integer with thousands separators: 10,000.
pub fn int(n: u64) -> String {
    tp::output::thousands(n)
}

/// A number with about three significant digits and thousands separators:
/// 0.42, 3.17, 15.2, 842, 11,245.
pub fn num(x: f64) -> String {
    let a = x.abs();
    let text = if a >= 1000.0 {
        let n = x.round() as i64;
        let out = int(n.unsigned_abs());
        if n < 0 { format!("-{out}") } else { out }
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    if text == "-0.00" { "0.00".into() } else { text }
}

/// `tp / peer` as a ratio, written so small ones stay readable (1/420).
pub fn ratio(tp: f64, peer: f64) -> String {
    if !(tp.is_finite() && peer.is_finite()) || peer <= 0.0 {
        return "–".into();
    }
    if tp <= 0.0 {
        return "≈0".into();
    }
    let r = tp / peer;
    if r >= 1.0 { format!("{}×", num(r)) } else { format!("1/{}", num(1.0 / r)) }
}
