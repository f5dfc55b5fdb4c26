//! Demangled names of Rust (legacy and v0) and C++ (Itanium) symbols, for
//! matching and display. Mangled names keep matching too.

/// The names a symbol answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// As stored in the symbol table.
    pub mangled: String,
    /// Demangled, for display (Rust without the hash; C++ with parameters).
    pub demangled: Option<String>,
    /// Demangled without parameters or trailing generic arguments:
    /// `std::vector<int>::push_back`, `app::work`.
    pub short: Option<String>,
    /// The path as users write it: `app::Counter::bump` for rustc-demangle's
    /// `<app::Counter>::bump`, `app::twice<long>` for the C++ template
    /// instance `long app::twice<long>(long)`.
    pub path: Option<String>,
}

impl Names {
    /// The names of symbol `mangled`.
    pub fn of(mangled: &str) -> Names {
        let demangled = demangle(mangled);
        let short = demangled.as_deref().map(strip_arguments).filter(|s| Some(s) != demangled.as_ref());
        let base = short.as_deref().or(demangled.as_deref());
        let path = base.and_then(inherent_path).or_else(|| base.and_then(without_return_type));
        Names { mangled: mangled.to_string(), demangled, short, path }
    }

    /// True if it answers to more than its name as stored.
    pub fn has_others(&self) -> bool {
        self.demangled.is_some() || self.short.is_some() || self.path.is_some()
    }

    /// The name to show: demangled when possible.
    pub fn display(&self) -> &str {
        self.demangled.as_deref().unwrap_or(&self.mangled)
    }

    /// Every name, for matching.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.mangled.as_str())
            .chain(self.demangled.as_deref())
            .chain(self.short.as_deref())
            .chain(self.path.as_deref())
    }
}

/// Demangles a Rust or C++ symbol, or None if it is neither.
pub fn demangle(name: &str) -> Option<String> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Some(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        let sym = cpp_demangle::Symbol::new(name).ok()?;
        return sym.demangle().ok();
    }
    None
}

/// `long app::twice<long>` as `app::twice<long>`: drops what precedes the
/// last space outside brackets (a template instance's return type).
fn without_return_type(name: &str) -> Option<String> {
    let mut depth = 0i32;
    let mut split = None;
    for (i, c) in name.char_indices() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' => depth -= 1,
            ' ' if depth == 0 => split = Some(i),
            _ => {}
        }
    }
    split.map(|i| name[i + 1..].to_string()).filter(|rest| !rest.is_empty() && rest != "const")
}

/// `<a::B>::f` as `a::B::f`; None for trait methods (`<T as Tr>::f`) and other names.
fn inherent_path(name: &str) -> Option<String> {
    let rest = name.strip_prefix('<')?;
    let mut depth = 1;
    let close = rest.char_indices().find_map(|(i, c)| {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ => {}
        }
        (depth == 0).then_some(i)
    })?;
    let (inside, after) = (&rest[..close], &rest[close + 1..]);
    (!inside.contains(" as ") && after.starts_with("::")).then(|| format!("{inside}{after}"))
}

/// Drops a trailing parameter list `(…)` with its qualifiers, or a trailing
/// generic argument list `::<…>`: `app::Stats::add(long)` → `app::Stats::add`.
pub fn strip_arguments(name: &str) -> String {
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == ' ' || c == '&');
    if let Some(open) = matching_open(trimmed, '(', ')') {
        return name[..open].to_string();
    }
    if trimmed.ends_with('>')
        && let Some(open) = matching_open(trimmed, '<', '>')
        && name[..open].ends_with("::")
    {
        return name[..open - 2].to_string();
    }
    name.to_string()
}

/// Index of the bracket that opens the group ending `s` with `close`.
fn matching_open(s: &str, open: char, close: char) -> Option<usize> {
    if !s.ends_with(close) {
        return None;
    }
    let mut depth = 0;
    for (i, c) in s.char_indices().rev() {
        if c == close {
            depth += 1;
        } else if c == open {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_and_v0() {
        let n = Names::of("_ZN2v05hello17h05df31c8c180333bE");
        assert_eq!(n.display(), "v0::hello");
        let n = Names::of("_RINvNtCsfq2Zq5gqAK1_2v05inner4workmEB4_");
        assert_eq!(n.display(), "v0::inner::work::<u32>");
        assert_eq!(n.short.as_deref(), Some("v0::inner::work"));
        let n = Names::of("_RNvMCs5MG4p4o9T2T_5rustyNtB2_7Counter4bump");
        assert_eq!(n.display(), "<rusty::Counter>::bump");
        assert!(n.all().any(|x| x == "rusty::Counter::bump"));
        assert_eq!(inherent_path("<T as core::fmt::Debug>::fmt"), None);
    }

    #[test]
    fn cpp_with_and_without_parameters() {
        let n = Names::of("_ZN3app6Shapes4areaEd");
        assert_eq!(n.display(), "app::Shapes::area(double)");
        assert_eq!(n.short.as_deref(), Some("app::Shapes::area"));
        let n = Names::of("_ZNKSt6vectorIiSaIiEE4sizeEv");
        assert_eq!(n.display(), "std::vector<int, std::allocator<int> >::size() const");
        assert_eq!(n.short.as_deref(), Some("std::vector<int, std::allocator<int> >::size"));
        assert_eq!(n.path, None, "spaces inside brackets are not a return type");
        let n = Names::of("_ZN3app5twiceIlEET_S1_");
        assert_eq!(n.display(), "long app::twice<long>(long)");
        assert_eq!(n.path.as_deref(), Some("app::twice<long>"));
    }

    #[test]
    fn plain_c_names_stay() {
        let n = Names::of("malloc");
        assert_eq!(n.display(), "malloc");
        assert_eq!(n.all().collect::<Vec<_>>(), ["malloc"]);
    }
}
