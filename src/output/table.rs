//! Text tables.

use std::io::{self, Write};

use super::{Summary, thousands};
use crate::escape::text;

/// The summary as an aligned table; a switched-off probe is marked `off`.
pub fn summary(s: &Summary, out: &mut impl Write) -> io::Result<()> {
    let name_w = s.probes.iter().map(|p| text(&p.func).len()).max().unwrap_or(0).max(8);
    let mod_w = s.probes.iter().map(|p| text(&p.module).len()).max().unwrap_or(0).max(6);
    writeln!(out, "{:<name_w$}  {:<mod_w$}  {:<18}  {:>15}", "FUNCTION", "MODULE", "ADDRESS", "HITS")?;
    for p in &s.probes {
        writeln!(
            out,
            "{:<name_w$}  {:<mod_w$}  {:<18}  {:>15}{}",
            text(&p.func),
            text(&p.module),
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
                ProbeStat { func: "foo".into(), module: "counter".into(), address: 0x1630, hits: 1234, enabled: true },
                ProbeStat {
                    func: "a_longer_name".into(),
                    module: "counter".into(),
                    address: 0x1670,
                    hits: 5,
                    enabled: false,
                },
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
}
