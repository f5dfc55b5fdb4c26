//! A progress bar on stderr for work over many functions, and for large
//! downloads; it stays hidden for short work and when stderr is not a
//! terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Work counts below this show no bar.
const MIN_ITEMS: u64 = 500;

/// A progress bar, or nothing.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar for `len` items of `what`.
    pub fn new(len: u64, what: &str) -> Progress {
        if len < MIN_ITEMS {
            return Progress(None);
        }
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(10));
        pb.set_style(
            ProgressStyle::with_template("{msg:>18} [{bar:40}] {pos}/{len} ({elapsed})")
                .expect("template")
                .progress_chars("=> "),
        );
        pb.set_message(what.to_string());
        Progress(Some(pb))
    }

    /// A bar for a download of `len` bytes of `what`, shown from 1 MiB on.
    pub fn bytes(len: u64, what: &str) -> Progress {
        if len < 1 << 20 {
            return Progress(None);
        }
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(10));
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
                .expect("template")
                .progress_chars("=> "),
        );
        pb.set_message(what.to_string());
        Progress(Some(pb))
    }

    /// `n` more bytes done.
    pub fn inc_by(&self, n: u64) {
        if let Some(pb) = &self.0 {
            pb.inc(n);
        }
    }

    /// One more item done.
    pub fn inc(&self) {
        if let Some(pb) = &self.0 {
            pb.inc(1);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}
