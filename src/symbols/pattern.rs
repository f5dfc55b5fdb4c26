//! What a user may write to name functions: `foo`, `libc:malloc`,
//! `libc.so.6:malloc`, globs such as `'sqlite3_*'` or `'libz:*'`.

/// A parsed `[module:]function` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The module part, if given (itself a glob).
    pub module: Option<String>,
    /// The function part (a glob).
    pub function: String,
}

impl Pattern {
    /// Parses `text`. A `:` separates the module from the function, except
    /// inside C++ and Rust paths (`ns::f`), which contain `::`.
    pub fn parse(text: &str) -> Pattern {
        let bytes = text.as_bytes();
        let split = (0..bytes.len())
            .find(|&i| bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':'));
        match split {
            Some(i) if i > 0 => Pattern { module: Some(text[..i].to_string()), function: text[i + 1..].to_string() },
            _ => Pattern { module: None, function: text.to_string() },
        }
    }

    /// True if the function part has glob characters.
    pub fn is_glob(&self) -> bool {
        has_glob(&self.function)
    }
}

/// True if `m` (from the user) names the module file `file_name`.
pub fn module_matches(m: &str, file_name: &str) -> bool {
    if has_glob(m) {
        return glob(m, file_name);
    }
    let m = m.rsplit('/').next().unwrap_or(m);
    file_name == m || file_name.strip_prefix(m).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
}

/// True if `s` has glob characters (`*`, `?`, `[`).
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Shell-style glob match: `*` any run, `?` one byte, `[abc]`/`[a-z]`/`[!x]`
/// a class. Symbol names are ASCII in practice, so this works on bytes and
/// allocates nothing: it runs over every name of every symbol a pattern is
/// tried against.
pub fn glob(pattern: &str, text: &str) -> bool {
    Glob::new(pattern).matches(text)
}

/// A glob read once, to match many names: [`glob`] without reading the
/// pattern again for each.
#[derive(Debug, Clone, Copy)]
pub enum Glob<'a> {
    /// No wildcard: the name itself.
    Exactly(&'a str),
    /// `name*`.
    Prefix(&'a str),
    /// `*name`.
    Suffix(&'a str),
    /// `*name*`.
    Inside(&'a str),
    /// Anything else.
    General(&'a str),
}

impl<'a> Glob<'a> {
    /// The glob `pattern`.
    pub fn new(pattern: &'a str) -> Glob<'a> {
        if !has_glob(pattern) {
            return Glob::Exactly(pattern);
        }
        // `*name`, `name*` and `*name*`, the commonest globs, without backtracking.
        let (lead, rest) = pattern.strip_prefix('*').map_or((false, pattern), |r| (true, r));
        let (trail, inner) = rest.strip_suffix('*').map_or((false, rest), |r| (true, r));
        match (lead, trail, has_glob(inner)) {
            (true, true, false) => Glob::Inside(inner),
            (true, false, false) => Glob::Suffix(inner),
            (false, true, false) => Glob::Prefix(inner),
            _ => Glob::General(pattern),
        }
    }

    /// True if `text` matches.
    pub fn matches(&self, text: &str) -> bool {
        match *self {
            Glob::Exactly(p) => p == text,
            Glob::Prefix(p) => text.starts_with(p),
            Glob::Suffix(p) => text.ends_with(p),
            Glob::Inside(p) => text.contains(p),
            Glob::General(p) => matches(p, text),
        }
    }
}

/// [`glob`] by its general matcher.
fn matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    // Iterative matcher with one backtrack point for the last `*`.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                b'?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                b'[' => {
                    if let Some((true, next)) = class(p, pi, t[ti]) {
                        pi = next;
                        ti += 1;
                        continue;
                    }
                }
                c if c == t[ti] => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns
/// (matched, index after the class), or None if the class is unterminated.
fn class(p: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let first = i;
    while i < p.len() && (p[i] != b']' || i == first) {
        if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            matched |= p[i] <= c && c <= p[i + 2];
            i += 3;
        } else {
            matched |= p[i] == c;
            i += 1;
        }
    }
    (i < p.len()).then_some((matched != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_module_and_function() {
        assert_eq!(Pattern::parse("foo"), Pattern { module: None, function: "foo".into() });
        assert_eq!(Pattern::parse("libc:malloc"), Pattern { module: Some("libc".into()), function: "malloc".into() });
        assert_eq!(
            Pattern::parse("libc.so.6:malloc"),
            Pattern { module: Some("libc.so.6".into()), function: "malloc".into() }
        );
        assert_eq!(Pattern::parse("libz:*"), Pattern { module: Some("libz".into()), function: "*".into() });
        // C++ and Rust paths keep their `::`.
        assert_eq!(Pattern::parse("ns::f"), Pattern { module: None, function: "ns::f".into() });
        assert_eq!(Pattern::parse("app:ns::f"), Pattern { module: Some("app".into()), function: "ns::f".into() });
    }

    #[test]
    fn module_names_match_by_stem() {
        assert!(module_matches("libc", "libc.so.6"));
        assert!(module_matches("libc.so.6", "libc.so.6"));
        assert!(module_matches("libc.so", "libc.so.6"));
        assert!(!module_matches("libc", "libcrypto.so.3"));
        assert!(module_matches("libpython3.11", "libpython3.11.so.1.0"));
        assert!(module_matches("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6"));
        assert!(module_matches("lib*crypto*", "libcrypto.so.3"));
        assert!(module_matches("ld-linux", "ld-linux-x86-64.so.2"));
    }

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob("*", ""));
        assert!(glob("sqlite3_*", "sqlite3_open"));
        assert!(!glob("sqlite3_*", "xsqlite3_open"));
        assert!(glob("*alloc", "malloc") && glob("*alloc", "calloc") && !glob("*alloc", "alloca"));
        assert!(glob("f?o", "foo") && !glob("f?o", "fo"));
        assert!(glob("[bf]oo", "boo") && !glob("[bf]oo", "zoo"));
        assert!(glob("[a-c]x", "bx") && !glob("[!a-c]x", "bx"));
        assert!(glob("*::push*", "std::vector<int>::push_back"));
        assert!(glob("a*b*c", "aXbYc") && !glob("a*b*c", "aXbY"));
        // The shortcuts for a star at either end agree with the general matcher.
        let parts = ["", "a", "ab", "ba", "*", "?", "[a]", "b"];
        let texts = ["", "a", "b", "ab", "ba", "aab", "abab", "bab", "aa*", "*"];
        for x in parts {
            for y in parts {
                for z in parts {
                    let p = format!("{x}{y}{z}");
                    for t in texts {
                        assert_eq!(glob(&p, t), has_glob(&p) && matches(&p, t) || p == t, "{p:?} {t:?}");
                    }
                }
            }
        }
    }
}
