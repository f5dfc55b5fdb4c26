//! The live display while attached, on stderr when it is a terminal: a
//! title with the time elapsed and how many probes were hit, then the
//! busiest probes (by calls per second, then hits), one line each, as
//! many as the terminal has room for. Every line is cut to the terminal's
//! width, read again at each redraw, so a resize redraws cleanly: what was
//! drawn is cleared by the rows it takes at the width of now.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use super::{rate, thousands};

/// The most probes shown, whatever the terminal's height.
const MAX_LINES: usize = 12;

/// The live display.
pub struct Live {
    title: String,
    names: Vec<String>,
    /// Hits at the last update, by probe.
    last: Vec<u64>,
    last_at: Instant,
    started: Instant,
    /// The lines shown now (without their newline).
    lines: Vec<String>,
    /// The number of characters of each line on the terminal now.
    drawn: Vec<usize>,
    /// False when stderr is no terminal: nothing is drawn.
    on: bool,
}

impl Live {
    /// A display for probes named `names` in process `pid`.
    pub fn new(pid: i32, names: &[String]) -> Live {
        Live::titled(format!("tracing process {pid}"), names)
    }

    /// A display for probes named `names` under the title `title`.
    pub fn titled(title: String, names: &[String]) -> Live {
        Live {
            title,
            names: names.iter().map(|n| super::table::fit(n, super::table::NAME_MAX)).collect(),
            last: vec![0; names.len()],
            last_at: Instant::now(),
            started: Instant::now(),
            lines: Vec::new(),
            drawn: Vec::new(),
            on: std::io::stderr().is_terminal(),
        }
    }

    /// Takes a new title and new probes (a library loaded, a process gone);
    /// the rates of the probes that stay go on from their last counts.
    pub fn set_names(&mut self, title: String, names: &[String]) {
        let names: Vec<String> = names.iter().map(|n| super::table::fit(n, super::table::NAME_MAX)).collect();
        let before: HashMap<&String, u64> = self.names.iter().zip(&self.last).map(|(n, &h)| (n, h)).collect();
        self.last = names.iter().map(|n| before.get(n).copied().unwrap_or(0)).collect();
        self.names = names;
        self.title = title;
    }

    /// Shows the current hit counts (same order as the names).
    pub fn update(&mut self, hits: &[u64]) {
        let dt = self.last_at.elapsed().as_secs_f64().max(1e-3);
        let rates: Vec<f64> =
            hits.iter().zip(&self.last).map(|(&now, &before)| now.saturating_sub(before) as f64 / dt).collect();
        self.lines = lines(&self.title, self.started.elapsed().as_secs_f64(), &self.names, hits, &rates, height());
        self.last = hits.to_vec();
        self.last.resize(self.names.len(), 0);
        self.last_at = Instant::now();
        self.redraw();
    }

    fn redraw(&mut self) {
        if !self.on {
            return;
        }
        let cols = width();
        let mut out = self.clearing(cols);
        let mut drawn = Vec::with_capacity(self.lines.len());
        for line in &self.lines {
            let cut: String = line.chars().take(cols.saturating_sub(1).max(1)).collect();
            drawn.push(cut.chars().count());
            out.push_str(&cut);
            out.push('\n');
        }
        self.drawn = drawn;
        write_stderr(&out);
    }

    /// The bytes that move the cursor back over what is drawn and clear it,
    /// counting the rows each line takes at `cols` columns (a terminal
    /// made narrower wraps them).
    fn clearing(&self, cols: usize) -> String {
        let rows: usize = self.drawn.iter().map(|&w| w.max(1).div_ceil(cols.max(1))).sum();
        match rows {
            0 => String::new(),
            n => format!("\r\x1b[{n}A\x1b[J"),
        }
    }

    /// Runs `f` with the display hidden, so lines printed meanwhile do not tear it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        if !self.on || self.drawn.is_empty() {
            return f();
        }
        write_stderr(&self.clearing(width()));
        let r = f();
        // Drawn again as it was (the next update brings new numbers).
        let mut again = String::new();
        for line in &self.lines {
            again.extend(line.chars().take(width().saturating_sub(1).max(1)));
            again.push('\n');
        }
        write_stderr(&again);
        r
    }

    /// Removes the display from the terminal.
    pub fn finish(self) {
        if self.on {
            write_stderr(&self.clearing(width()));
        }
    }
}

/// The display's lines: the title with the time elapsed and the probes hit,
/// then the busiest probes, as many as `room` leaves space for.
fn lines(title: &str, secs: f64, names: &[String], hits: &[u64], rates: &[f64], room: usize) -> Vec<String> {
    let hit = hits.iter().filter(|&&h| h > 0).count();
    let mut order: Vec<usize> = (0..names.len().min(hits.len())).filter(|&i| hits[i] > 0).collect();
    order.sort_by(|&a, &b| rates[b].total_cmp(&rates[a]).then(hits[b].cmp(&hits[a])).then(a.cmp(&b)));
    let shown = order.len().min(MAX_LINES).min(room.saturating_sub(2).max(1));
    // What changes first: a narrow terminal cuts the end.
    let mut out = vec![format!(
        "{} · {} of {} probe{} hit · {title} · Ctrl-C to detach",
        elapsed(secs),
        thousands(hit as u64),
        thousands(names.len() as u64),
        if names.len() == 1 { "" } else { "s" }
    )];
    for &i in &order[..shown] {
        out.push(format!(
            "{:>15}  {:>9}  {}",
            thousands(hits[i]),
            rate(rates.get(i).copied().unwrap_or(0.0)),
            names[i]
        ));
    }
    if order.len() > shown {
        out.push(format!("{:>15}  {:>9}  and {} more with hits", "", "", thousands((order.len() - shown) as u64)));
    }
    out
}

/// `4.2 s`, `3 min 05 s`, `2 h 01 min`.
fn elapsed(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..60 => format!("{secs:.1} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s / 60 % 60),
    }
}

/// The terminal's size on stderr: (columns, rows), 80×24 when unknown.
fn size() -> (usize, usize) {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`.
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0;
    match ok && ws.ws_col > 0 && ws.ws_row > 0 {
        true => (ws.ws_col as usize, ws.ws_row as usize),
        false => (80, 24),
    }
}

fn width() -> usize {
    size().0
}

fn height() -> usize {
    size().1
}

fn write_stderr(s: &str) {
    if s.is_empty() {
        return;
    }
    let mut err = std::io::stderr().lock();
    let r = err.write_all(s.as_bytes()).and_then(|()| err.flush());
    crate::streams::note(crate::streams::Stream::Stderr, &r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_come_first_and_the_idle_stay_out() {
        let names: Vec<String> = ["cold", "warm", "hot", "idle"].iter().map(|s| s.to_string()).collect();
        let lines = lines("tracing process 7", 12.34, &names, &[5, 100, 3_000_000, 0], &[0.0, 50.0, 1e6, 0.0], 24);
        assert_eq!(lines[0], "12.3 s · 3 of 4 probes hit · tracing process 7 · Ctrl-C to detach");
        assert!(lines[1].ends_with("  hot") && lines[1].contains("3,000,000") && lines[1].contains("1.00M/s"));
        assert!(lines[2].ends_with("  warm") && lines[3].ends_with("  cold"), "{lines:?}");
        assert_eq!(lines.len(), 4, "no line for a probe without hits: {lines:?}");
    }

    #[test]
    fn a_short_terminal_shows_fewer_and_counts_the_rest() {
        let names: Vec<String> = (0..30).map(|i| format!("f{i}")).collect();
        let hits: Vec<u64> = (1..=30).collect();
        let rates: Vec<f64> = hits.iter().map(|&h| h as f64).collect();
        let lines = lines("t", 0.5, &names, &hits, &rates, 6);
        assert_eq!(lines.len(), 6, "{lines:?}");
        assert!(lines[1].ends_with("  f29"), "{lines:?}");
        assert!(lines[5].ends_with("and 26 more with hits"), "{lines:?}");
        let tall = super::lines("t", 0.5, &names, &hits, &rates, 100);
        assert_eq!(tall.len(), 1 + MAX_LINES + 1);
    }

    #[test]
    fn time_reads_naturally() {
        assert_eq!(elapsed(4.25), "4.2 s");
        assert_eq!(elapsed(185.0), "3 min 05 s");
        assert_eq!(elapsed(7260.0), "2 h 01 min");
    }

    #[test]
    fn clearing_counts_the_rows_lines_wrap_to() {
        let mut l = Live::titled("t".into(), &[]);
        l.drawn = vec![10, 100, 0];
        assert_eq!(l.clearing(80), "\r\x1b[4A\x1b[J");
        assert_eq!(l.clearing(40), "\r\x1b[5A\x1b[J");
        l.drawn.clear();
        assert_eq!(l.clearing(80), "");
    }
}
