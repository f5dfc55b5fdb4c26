//! What form tp's results take, chosen once per command: by `--format`
//! (or its shorthands `--json`, `--folded`, `--openmetrics`,
//! `--prometheus`), else by the extension of `-o FILE`, else text. A file
//! whose name says no format, with no flag that does, is refused in one
//! line, as are two flags that disagree and a format the command cannot
//! produce (docs/output.md).

use std::path::Path;

/// A form of tp's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Tables and event lines for people.
    Text,
    /// tp's JSON (JSON Lines of events, then one summary document).
    Json,
    /// A Chrome trace event file (the Perfetto UI opens it).
    Chrome,
    /// Folded stacks, `root;...;leaf count` (flamegraph.pl, speedscope).
    Folded,
    /// A flame graph of the stacks, as an SVG.
    Svg,
    /// The OpenMetrics text format.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Prometheus,
}

/// Every format, with its `--format` name and the file extensions that choose it.
const FORMATS: &[(Format, &str, &[&str])] = &[
    (Format::Text, "text", &["txt", "text", "log"]),
    (Format::Json, "json", &["json", "jsonl", "ndjson"]),
    (Format::Chrome, "chrome", &["trace.json", "perfetto.json"]),
    (Format::Folded, "folded", &["folded"]),
    (Format::Svg, "svg", &["svg"]),
    (Format::OpenMetrics, "openmetrics", &["om", "openmetrics"]),
    (Format::Prometheus, "prometheus", &["prom"]),
];

impl Format {
    /// Its `--format` name.
    pub fn name(self) -> &'static str {
        FORMATS.iter().find(|f| f.0 == self).map_or("text", |f| f.1)
    }

    /// The format a file's name says (`.trace.json` before `.json`).
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let mut best: Option<(usize, Format)> = None;
        for &(format, _, exts) in FORMATS {
            for ext in exts {
                if name.len() > ext.len() + 1
                    && name.ends_with(&format!(".{ext}"))
                    && best.is_none_or(|b| b.0 < ext.len())
                {
                    best = Some((ext.len(), format));
                }
            }
        }
        best.map(|b| b.1)
    }

    /// The extensions that choose it, as a user would type them.
    fn extensions(self) -> String {
        let exts = FORMATS.iter().find(|f| f.0 == self).map_or(&[][..], |f| f.2);
        exts.iter().map(|e| format!(".{e}")).collect::<Vec<_>>().join(", ")
    }
}

/// The names of `formats`, for a message: `text, json or chrome`.
pub fn names(formats: &[Format]) -> String {
    let names: Vec<&str> = formats.iter().map(|f| f.name()).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The format of the results of `tp COMMAND`: `asked` by its flags (each
/// set flag with the format it means), then `format` (`--format`), else
/// the one `file`'s name says, else text; refused when flags disagree,
/// when a file says none, or when it is not among `allowed`.
pub fn choose(
    command: &str,
    asked: &[(bool, Format)],
    format: Option<Format>,
    file: Option<&Path>,
    allowed: &[Format],
) -> Result<Format, String> {
    let mut wanted: Vec<Format> = asked.iter().filter(|a| a.0).map(|a| a.1).collect();
    wanted.extend(format);
    wanted.dedup();
    let chosen = match (wanted.as_slice(), file) {
        ([], None) => Format::Text,
        ([], Some(path)) => Format::from_path(path).ok_or_else(|| {
            let exts: Vec<String> = allowed.iter().map(|f| format!("{} ({})", f.name(), f.extensions())).collect();
            format!(
                "cannot tell the format of `{}` from its name; add --format {} or name it for one: {}",
                path.display(),
                allowed.iter().map(|f| f.name()).collect::<Vec<_>>().join("|"),
                exts.join(", ")
            )
        })?,
        ([one], _) => *one,
        (many, _) => {
            let all = names(many);
            return Err(format!("the flags ask for two formats ({all}); choose one"));
        }
    };
    if !allowed.contains(&chosen) {
        return Err(format!("`tp {command}` writes {}, not {}", names(allowed), chosen.name()));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ATTACH: &[Format] = &[Format::Text, Format::Json, Format::Chrome, Format::Folded, Format::Svg];

    #[test]
    fn a_files_name_says_its_format() {
        for (name, f) in [
            ("out.txt", Format::Text),
            ("calls.json", Format::Json),
            ("calls.trace.json", Format::Chrome),
            ("x.PERFETTO.json", Format::Chrome),
            ("flame.svg", Format::Svg),
            ("s.folded", Format::Folded),
            ("/var/lib/node_exporter/textfile/tp.prom", Format::Prometheus),
        ] {
            assert_eq!(Format::from_path(Path::new(name)), Some(f), "{name}");
        }
        for name in ["out", "out.dat", ".json", "trace"] {
            assert_eq!(Format::from_path(Path::new(name)), None, "{name}");
        }
    }

    #[test]
    fn flags_then_the_file_then_text() {
        let file = Some(Path::new("out.txt"));
        let choose =
            |a: &[(bool, Format)], f: Option<Format>, file: Option<&Path>| super::choose("attach", a, f, file, ATTACH);
        assert_eq!(choose(&[(true, Format::Json)], None, file), Ok(Format::Json));
        assert_eq!(choose(&[(false, Format::Json)], None, file), Ok(Format::Text));
        assert_eq!(choose(&[], None, None), Ok(Format::Text));
        assert_eq!(choose(&[], Some(Format::Chrome), None), Ok(Format::Chrome));
        assert_eq!(choose(&[(true, Format::Json)], Some(Format::Json), None), Ok(Format::Json));
        let two = choose(&[(true, Format::Json), (true, Format::Folded)], None, None).unwrap_err();
        assert_eq!(two, "the flags ask for two formats (json or folded); choose one");
        let unknown = choose(&[], None, Some(Path::new("out.dat"))).unwrap_err();
        assert!(
            unknown.starts_with("cannot tell the format of `out.dat` from its name; add --format text|json|"),
            "{unknown}"
        );
        assert!(unknown.contains("chrome (.trace.json, .perfetto.json)"), "{unknown}");
        let wrong = choose(&[], None, Some(Path::new("m.prom"))).unwrap_err();
        assert_eq!(wrong, "`tp attach` writes text, json, chrome, folded or svg, not prometheus");
    }
}
