//! Text that came from a target, made safe for a terminal.
//!
//! Function and module names, `char *` arguments, paths from `/proc` and
//! everything else a target can choose may hold escape sequences (a CSI that
//! moves the cursor, retitles the window or rewrites what tp printed), line
//! breaks that forge extra output lines, or Unicode controls that reorder
//! what a reader sees. Every place tp prints such text to a terminal passes
//! it through [`text`]; JSON output escapes the same characters
//! ([`crate::output::json::string`] uses [`is_unsafe`]). It imports nothing,
//! so every layer that prints (`probe`, `events`, `output`, `session`, `cmd`,
//! `main`) can use it.

use std::borrow::Cow;
use std::fmt::Write;

/// True for a character a terminal would act on rather than show: C0 and C1
/// controls and DEL (escape sequences, line breaks, backspace), and the
/// invisible Unicode format characters that reorder or hide text (bidi
/// embeddings, overrides and isolates, zero-width characters, line and
/// paragraph separators, the byte-order mark, interlinear annotations).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}'
            | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

/// `s` with every [`is_unsafe`] character written as an escape (`\x1b`,
/// `\u{202e}`) and every backslash doubled, so the result is one line that
/// shows exactly what the target holds. Borrowed when nothing needs escaping.
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || is_unsafe(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if is_unsafe(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_borrowed_unchanged() {
        for s in ["foo", "app::Stats::add(long)", "libc.so.6", "é漢字", "a b"] {
            assert!(matches!(text(s), Cow::Borrowed(t) if t == s), "{s}");
        }
    }

    #[test]
    fn controls_become_visible_escapes() {
        assert_eq!(text("\x1b[2J\x1b]0;owned\x07"), "\\x1b[2J\\x1b]0;owned\\x07");
        assert_eq!(text("a\nb\rc\td"), "a\\x0ab\\x0dc\\x09d");
        assert_eq!(text("\u{9b}31m"), "\\u{9b}31m", "8-bit CSI");
        assert_eq!(text("x\u{7f}"), "x\\x7f");
        assert_eq!(text("abc\u{202e}fed"), "abc\\u{202e}fed", "bidi override");
        assert_eq!(text("a\u{200b}b\u{2028}"), "a\\u{200b}b\\u{2028}");
        assert_eq!(text("C:\\x1b"), "C:\\\\x1b", "a literal backslash cannot pass for an escape");
        assert!(!text("\x1b\n\u{9b}\u{202e}").chars().any(is_unsafe));
    }
}
