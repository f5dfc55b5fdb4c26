//! The live display while attached: one line per probe with its hits and
//! rate, redrawn in place on stderr. Hidden when stderr is not a terminal.

use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{rate, thousands};

/// How many probes get a line of their own; the rest are summed in one line.
const MAX_LINES: usize = 12;

/// The live display.
pub struct Live {
    multi: MultiProgress,
    header: ProgressBar,
    lines: Vec<ProgressBar>,
    rest: Option<ProgressBar>,
    last: Vec<u64>,
    last_at: Instant,
}

impl Live {
    /// A display for probes named `names` in process `pid`.
    pub fn new(pid: i32, names: &[String]) -> Live {
        Live::titled(format!("tracing process {pid}; Ctrl-C to detach"), names)
    }

    /// A display for probes named `names` under the title `header`.
    pub fn titled(header: String, names: &[String]) -> Live {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let style = ProgressStyle::with_template("{prefix:>28.bold} {msg}").expect("template");
        let header_text = header;
        let header = multi.add(ProgressBar::new_spinner());
        header.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("template"));
        header.set_message(header_text);
        let mut lines = Vec::new();
        for name in names.iter().take(MAX_LINES) {
            let pb = multi.add(ProgressBar::new_spinner());
            pb.set_style(style.clone());
            pb.set_prefix(super::table::fit(name, super::table::NAME_MAX));
            lines.push(pb);
        }
        let rest = (names.len() > MAX_LINES).then(|| {
            let pb = multi.add(ProgressBar::new_spinner());
            pb.set_style(style.clone());
            pb.set_prefix(format!("{} more", names.len() - MAX_LINES));
            pb
        });
        Live { multi, header, lines, rest, last: vec![0; names.len()], last_at: Instant::now() }
    }

    /// Shows the current hit counts (same order as the names).
    pub fn update(&mut self, hits: &[u64]) {
        let dt = self.last_at.elapsed().as_secs_f64().max(1e-3);
        for (i, pb) in self.lines.iter().enumerate() {
            let per_sec = hits[i].saturating_sub(self.last[i]) as f64 / dt;
            pb.set_message(format!("{:>15} hits  {:>10}", thousands(hits[i]), rate(per_sec)));
        }
        if let Some(pb) = &self.rest {
            let now: u64 = hits[MAX_LINES..].iter().sum();
            let before: u64 = self.last[MAX_LINES..].iter().sum();
            pb.set_message(format!(
                "{:>15} hits  {:>10}",
                thousands(now),
                rate(now.saturating_sub(before) as f64 / dt)
            ));
        }
        self.header.tick();
        self.last.copy_from_slice(hits);
        self.last_at = Instant::now();
    }

    /// Runs `f` with the display hidden, so lines printed meanwhile do not tear it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.multi.suspend(f)
    }

    /// Removes the display from the terminal.
    pub fn finish(self) {
        for pb in self.lines.iter().chain(self.rest.iter()).chain(std::iter::once(&self.header)) {
            pb.finish_and_clear();
        }
        let _ = self.multi.clear();
    }
}
