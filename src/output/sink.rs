//! Where a session's own output goes: stdout for `tp attach` (data on
//! stdout, status on stderr), stderr or a file for `tp run`, whose program
//! owns stdout. One handle, cloned by everything that writes, so the lines
//! of several processes' tracers and the summary land in one stream in the
//! order they were written.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::rc::Rc;

/// A shared writer.
#[derive(Clone)]
pub struct Sink(Rc<RefCell<Box<dyn Write>>>);

impl Sink {
    fn of(w: impl Write + 'static) -> Sink {
        Sink(Rc::new(RefCell::new(Box::new(w))))
    }

    /// Standard output (its failures noted: [`crate::streams`]).
    pub fn stdout() -> Sink {
        Sink::of(crate::streams::stdout())
    }

    /// Standard error.
    pub fn stderr() -> Sink {
        Sink::of(io::stderr())
    }

    /// A new file at `path` (truncated if it exists); a failed write says
    /// which file.
    pub fn create(path: &Path) -> io::Result<Sink> {
        let file = BufWriter::new(File::create(path)?);
        Ok(Sink::of(Named { file, path: path.display().to_string() }))
    }
}

/// A file whose errors name it.
struct Named {
    file: BufWriter<File>,
    path: String,
}

impl Named {
    fn named<T>(&self, r: io::Result<T>) -> io::Result<T> {
        r.map_err(|e| io::Error::new(e.kind(), format!("writing `{}`: {e}", self.path)))
    }
}

impl Write for Named {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = self.file.write(buf);
        self.named(r)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let r = self.file.write_all(buf);
        self.named(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        let r = self.file.flush();
        self.named(r)
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.borrow_mut().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_write_to_one_file_in_order() {
        let dir = std::env::temp_dir().join(format!("tp-sink-{}", std::process::id()));
        let mut a = Sink::create(&dir).unwrap();
        let mut b = a.clone();
        writeln!(a, "one").unwrap();
        writeln!(b, "two").unwrap();
        a.flush().unwrap();
        drop((a, b));
        assert_eq!(std::fs::read_to_string(&dir).unwrap(), "one\ntwo\n");
        std::fs::remove_file(&dir).unwrap();
    }
}
