//! Static probes (USDT, SystemTap SDT): the `.note.stapsdt` notes that
//! `<sys/sdt.h>` leaves in a binary, one per probe site. Each (type 3,
//! owner `stapsdt`) holds the site's address (a `nop`), the address of the
//! `.stapsdt.base` section as linked, the address of the probe's semaphore
//! (0 for none), and three strings: provider, name, and the arguments
//! (`SIZE@OPERAND`, spaces between). A file that was prelinked moved its sections
//! after the notes were written: the difference between where
//! `.stapsdt.base` is now and where the note says it was is added to the
//! site and the semaphore.
//!
//! The notes are bytes of the target's files: read bounded, every size
//! checked, nothing trusted (`tests/fuzz/fuzz_targets/sdt_notes.rs`).

use super::ElfFile;
use crate::addr::FileAddr;

/// The note type of a SystemTap probe (version 3, the one in use).
const NT_STAPSDT: u32 = 3;
/// The longest provider or probe name tp takes.
const MAX_NAME: usize = 256;
/// The longest argument string tp takes.
const MAX_ARGS: usize = 4096;
/// The most notes tp reads from one file.
const MAX_NOTES: usize = 1 << 16;

/// One static probe site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdtNote {
    /// The provider (`libc`, `python`).
    pub provider: String,
    /// The probe's name (`setjmp`, `function__entry`).
    pub name: String,
    /// Where the site is (its `nop`), a file address.
    pub pc: FileAddr,
    /// The semaphore's file address, if the probe has one.
    pub semaphore: Option<FileAddr>,
    /// The argument string, arguments separated by spaces.
    pub args: String,
}

impl SdtNote {
    /// Each argument's text (`SIZE@OPERAND`). Spaces separate them, but
    /// not inside brackets: AArch64 writes memory as `[sp, 8]`.
    pub fn arg_texts(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let (mut depth, mut start) = (0usize, None);
        for (i, c) in self.args.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                c if c.is_ascii_whitespace() && depth == 0 => {
                    if let Some(s) = start.take() {
                        out.push(&self.args[s..i]);
                    }
                    continue;
                }
                _ => {}
            }
            start.get_or_insert(i);
        }
        if let Some(s) = start {
            out.push(&self.args[s..]);
        }
        out
    }
}

/// The static probes of `elf`: every note of every `.note.stapsdt`
/// section, moved by what a prelink moved.
pub fn notes(elf: &ElfFile) -> Vec<SdtNote> {
    let base = elf.sections.iter().find(|s| s.name == ".stapsdt.base").map(|s| s.addr);
    let mut out = Vec::new();
    for s in elf.sections.iter().filter(|s| s.name == ".note.stapsdt" && !s.nobits) {
        let Some(bytes) = usize::try_from(s.offset)
            .ok()
            .and_then(|o| elf.data().get(o..o.checked_add(usize::try_from(s.size).ok()?)?))
        else {
            continue;
        };
        out.extend(parse(bytes, base));
        if out.len() >= MAX_NOTES {
            out.truncate(MAX_NOTES);
            break;
        }
    }
    out
}

/// The probes in the bytes of one `.note.stapsdt` section; `base` is where
/// the file's `.stapsdt.base` section is now, if it has one. A note that
/// does not parse is skipped; parsing stops at a size that leaves the
/// section.
pub fn parse(section: &[u8], base: Option<u64>) -> Vec<SdtNote> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 12 <= section.len() && out.len() < MAX_NOTES {
        let word = |k: usize| u32::from_le_bytes(section[at + 4 * k..at + 4 * k + 4].try_into().expect("4 bytes"));
        let (namesz, descsz, kind) = (word(0) as usize, word(1) as usize, word(2));
        let name_at = at + 12;
        let Some(desc_at) = name_at.checked_add(namesz.next_multiple_of(4)) else { break };
        let Some(next) = desc_at.checked_add(descsz.next_multiple_of(4)) else { break };
        if desc_at.checked_add(descsz).is_none_or(|end| end > section.len()) || name_at + namesz > section.len() {
            break;
        }
        let owner = &section[name_at..name_at + namesz];
        if kind == NT_STAPSDT
            && owner == b"stapsdt\0"
            && let Some(note) = desc(&section[desc_at..desc_at + descsz], base)
        {
            out.push(note);
        }
        at = next;
    }
    out
}

/// One note's description: three addresses and three strings.
fn desc(d: &[u8], base: Option<u64>) -> Option<SdtNote> {
    let addr = |k: usize| Some(u64::from_le_bytes(d.get(8 * k..8 * k + 8)?.try_into().ok()?));
    let (pc, linked_base, semaphore) = (addr(0)?, addr(1)?, addr(2)?);
    let mut strings = d.get(24..)?.splitn(4, |&b| b == 0);
    let mut text = |max: usize| {
        let s = strings.next()?;
        (s.len() <= max).then(|| std::str::from_utf8(s).ok().map(str::to_string)).flatten()
    };
    let provider = text(MAX_NAME)?;
    let name = text(MAX_NAME)?;
    let args = text(MAX_ARGS)?;
    // The three strings are each NUL-terminated: a fourth piece follows.
    strings.next()?;
    if provider.is_empty() || name.is_empty() || pc == 0 {
        return None;
    }
    let shift = base.map_or(0, |b| b.wrapping_sub(linked_base));
    Some(SdtNote {
        provider,
        name,
        pc: FileAddr(pc.wrapping_add(shift)),
        semaphore: (semaphore != 0).then(|| FileAddr(semaphore.wrapping_add(shift))),
        args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note as `<sys/sdt.h>` lays it out.
    fn note(pc: u64, base: u64, sem: u64, strings: &[&str]) -> Vec<u8> {
        let mut desc = Vec::new();
        for v in [pc, base, sem] {
            desc.extend(v.to_le_bytes());
        }
        for s in strings {
            desc.extend(s.as_bytes());
            desc.push(0);
        }
        let mut out = Vec::new();
        out.extend(8u32.to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend(b"stapsdt\0");
        out.extend(&desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn notes_parse_with_their_semaphores() {
        let mut bytes = note(0x1139, 0x2004, 0x4010, &["tpsdt", "tick", "-4@OP1 8@OP2"]);
        bytes.extend(note(0x1200, 0x2004, 0, &["tpsdt", "idle", ""]));
        let notes = parse(&bytes, Some(0x2004));
        assert_eq!(notes.len(), 2);
        assert_eq!(
            notes[0],
            SdtNote {
                provider: "tpsdt".into(),
                name: "tick".into(),
                pc: FileAddr(0x1139),
                semaphore: Some(FileAddr(0x4010)),
                args: "-4@OP1 8@OP2".into(),
            }
        );
        assert_eq!(notes[0].arg_texts(), ["-4@OP1", "8@OP2"]);
        assert_eq!((notes[1].semaphore, notes[1].arg_texts().len()), (None, 0));
    }

    #[test]
    fn spaces_inside_brackets_do_not_separate_arguments() {
        let n = |args: &str| SdtNote {
            provider: "p".into(),
            name: "n".into(),
            pc: FileAddr(1),
            semaphore: None,
            args: args.into(),
        };
        assert_eq!(n("8@A 4@[B, 8]  -4@5").arg_texts(), ["8@A", "4@[B, 8]", "-4@5"]);
        assert_eq!(n(" -4@[B, #:lo12:.LANCHOR2] ").arg_texts(), ["-4@[B, #:lo12:.LANCHOR2]"]);
        assert_eq!(n("8@[A 8@B").arg_texts(), ["8@[A 8@B"], "an unclosed bracket takes the rest");
        assert!(n("").arg_texts().is_empty());
    }

    #[test]
    fn a_prelinked_file_moves_sites_and_semaphores() {
        let bytes = note(0x1139, 0x2004, 0x4010, &["p", "n", ""]);
        let n = &parse(&bytes, Some(0x3004))[0];
        assert_eq!((n.pc, n.semaphore), (FileAddr(0x2139), Some(FileAddr(0x5010))));
    }

    #[test]
    fn broken_notes_are_skipped_never_trusted() {
        let good = note(0x10, 0, 0, &["p", "n", "8@OP"]);
        // Other owners and types are not probes.
        let mut other = good.clone();
        other[8] = 1;
        assert!(parse(&other, None).is_empty());
        // Sizes that leave the section end the parse.
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&huge, None).is_empty());
        // A description without its strings' terminators is skipped.
        let cut = note(0x10, 0, 0, &["p"]);
        assert!(parse(&cut, None).is_empty());
        // Every prefix of good notes parses to at most the notes it holds.
        let two = [good.clone(), good].concat();
        for n in 0..two.len() {
            assert!(parse(&two[..n], None).len() <= 2);
        }
        assert_eq!(parse(&two, None).len(), 2);
    }
}
