//! `--if` expressions and `--args` lists: arbitrary text parsed, compiled
//! for a function with parameters of every kind and a few fields, and the
//! programs run. Parsing and compiling
//! must answer in one line or give programs the runtime's checker accepts
//! ([`tp::probe::filter::validate`]); the interpreter (the same as
//! runtime.c's) must never panic, also on programs of arbitrary words,
//! which the target could write into the region, as it could the short
//! forms of `--by` and `--agg` `tp status` reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::events::values::ProbeInfo;
use tp::events::predicate;
use tp::probe::filter;
use tp::probe::layout::{FETCH_WORDS, fetch_word};
use tp::symbols::dwarf::{DwFunction, Param, Type};
use tp::symbols::fields::FieldPath;

fn info() -> ProbeInfo {
    let p = |name: &str, ty: Type, size: u64| Param { name: name.into(), type_name: String::new(), ty, size: Some(size) };
    ProbeInfo {
        name: "f".into(),
        module: "m".into(),
        operands: None,
        dwarf: Some(DwFunction {
            name: "f".into(),
            linkage_name: None,
            entry: tp::addr::FileAddr(0),
            params: vec![
                p("a", Type::Signed(4), 4),
                p("b", Type::Unsigned(1), 1),
                p("x", Type::Float, 8),
                p("s", Type::CString, 8),
                p("c", Type::Char, 1),
                p("big", Type::Other, 32),
                p("w", Type::Unsigned(2), 2),
                p("r", Type::Pointer, 8),
            ],
            return_type: Some(("long".into(), Type::Signed(8))),
            abi: Default::default(),
        }),
        // Fields of `r` as tp would have looked them up (others are errors).
        fields: vec![
            ("r->len".into(), Ok(FieldPath { loads: vec![24], width: 8, ty: Type::Signed(8), type_name: "long".into() })),
            ("r->name".into(), Ok(FieldPath { loads: vec![0], width: 8, ty: Type::CString, type_name: "char *".into() })),
            (
                "r->next->id[3]".into(),
                Ok(FieldPath { loads: vec![8, 46], width: 2, ty: Type::Unsigned(2), type_name: "short".into() }),
            ),
            ("r->gone".into(), Err("`r` has no member `gone`".into())),
        ],
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let values: [u64; 7] = std::array::from_fn(|i| {
        data.get(i * 8..i * 8 + 8).map_or(i as u64, |b| u64::from_le_bytes(b.try_into().unwrap()))
    });
    // Arbitrary words as a program, as the target could leave them.
    let words: Vec<u64> = data.chunks(8).map(|c| c.iter().fold(0u64, |w, &b| (w << 8) | b as u64)).collect();
    let _ = filter::validate(&words, 6);
    let _ = filter::eval(&words, &values, &|_, buf: &mut [u8]| buf.len() / 2);
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The short forms the region keeps for `tp status` (target-writable):
    // what reads back writes back the same.
    if let Some(names) = predicate::AggNames::from_stored(text) {
        assert_eq!(predicate::AggNames::from_stored(&names.stored(usize::MAX)), Some(names), "{text}");
    }
    if let Ok(keys) = predicate::parse_keys(text) {
        assert_eq!(predicate::parse_keys(&predicate::keys_text(&keys)), Ok(keys), "{text}");
    }
    let Ok(e) = predicate::parse(text) else { return };
    let info = info();
    for ret in [false, true] {
        match predicate::compile(&e, &info, ret) {
            Ok(c) => {
                for (p, max) in [(&c.entry, 5), (&c.exit, 6)] {
                    if !p.is_empty() {
                        assert_eq!(filter::validate(p, max), Ok(()), "{text}");
                        let _ = filter::eval(p, &values, &|_, buf: &mut [u8]| buf.len());
                    }
                }
            }
            Err(why) => assert!(!why.contains('\n'), "{why}"),
        }
    }
    let _ = predicate::by_word(text, &info);
    if let Ok(picks) = predicate::parse_picks(text) {
        match predicate::fetch_program(&picks, &info) {
            Ok((prog, shown)) => {
                assert!(prog.len() <= FETCH_WORDS, "{text}");
                assert!(prog.first().is_none_or(|h| h & fetch_word::VALID != 0), "{text}");
                assert_eq!(shown.len(), picks.len(), "{text}");
            }
            Err(why) => assert!(!why.contains('\n'), "{why}"),
        }
    }
});
