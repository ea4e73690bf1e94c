//! Reads what nsa needs to know about a shared library before it is loaded:
//! whether the file is a whole, well-formed ELF shared object for this machine,
//! its SONAME, its GNU build-id and whether it exports given symbols.
//!
//! Only headers, the dynamic symbol and string tables and the notes are read
//! (a few KB), so this is cheap enough to run on every process start. What it
//! catches: truncation (a load segment past the end of the file, which the
//! loader would map and fault on), files that are not libraries, libraries for
//! another machine, and libraries that lack a symbol a caller will resolve.

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::read::ReadCache;
use object::Endianness;
use std::fs::File;
use std::path::Path;

/// The smallest file worth calling a shared library (an ELF header and its tables).
const MIN_LIBRARY_BYTES: u64 = 4096;
/// No NVRTC build comes near this; a larger "library" is a wrong file.
const MAX_LIBRARY_BYTES: u64 = 2 << 30;

#[cfg(target_arch = "x86_64")]
const HOST_MACHINE: u16 = elf::EM_X86_64;
#[cfg(target_arch = "aarch64")]
const HOST_MACHINE: u16 = elf::EM_AARCH64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const HOST_MACHINE: u16 = elf::EM_NONE;

/// What [`inspect`] found in a well-formed library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryFacts {
    pub size: u64,
    /// `DT_SONAME`, when the library has one.
    pub soname: Option<String>,
    /// The GNU build-id note as hex, when present: names the exact build.
    pub build_id: Option<String>,
    /// Every defined dynamic symbol's name.
    pub exports: Vec<String>,
}

impl LibraryFacts {
    /// The first of `symbols` the library does not export.
    pub fn missing<'a>(&self, symbols: &[&'a str]) -> Option<&'a str> {
        symbols.iter().copied().find(|s| !self.exports.iter().any(|e| e == s))
    }
}

/// Checks that `path` is a regular file holding a whole ELF shared object for
/// this machine and reads its facts; the error says what is wrong, in words.
pub fn inspect(path: &Path) -> Result<LibraryFacts, String> {
    let file = crate::fsread::open_regular(path, true).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| format!("cannot stat it: {e}"))?.len();
    if !(MIN_LIBRARY_BYTES..=MAX_LIBRARY_BYTES).contains(&size) {
        return Err(format!(
            "it has {size} bytes, not a plausible size for a shared library ({MIN_LIBRARY_BYTES}..={MAX_LIBRARY_BYTES})"
        ));
    }
    let data = ReadCache::new(file);
    read_facts(&data, size).map_err(|e| format!("not a usable ELF shared library: {e}"))
}

fn read_facts(data: &ReadCache<File>, size: u64) -> Result<LibraryFacts, String> {
    let header = elf::FileHeader64::<Endianness>::parse(data).map_err(|e| format!("{e} (bad ELF header)"))?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    if header.e_type(endian) != elf::ET_DYN {
        return Err(format!("ELF type {} is not a shared object", header.e_type(endian)));
    }
    let machine = header.e_machine(endian);
    if machine != HOST_MACHINE {
        return Err(format!("built for ELF machine {machine}, this machine is {HOST_MACHINE}"));
    }
    let phdrs = header.program_headers(endian, data).map_err(|e| format!("{e} (program headers)"))?;
    if phdrs.is_empty() {
        return Err("it has no program headers".into());
    }
    for ph in phdrs {
        if ph.p_type(endian) != elf::PT_LOAD {
            continue;
        }
        let (offset, len) = (ph.p_offset(endian), ph.p_filesz(endian));
        let end = offset.checked_add(len).ok_or("a load segment's range overflows")?;
        if end > size {
            return Err(format!("a load segment ends at byte {end} but the file has {size}: the file is truncated"));
        }
    }
    let sections = header.sections(endian, data).map_err(|e| format!("{e} (section headers)"))?;
    let symbols = sections.symbols(endian, data, elf::SHT_DYNSYM).map_err(|e| format!("{e} (dynamic symbols)"))?;
    let strings = symbols.strings();
    let exports = symbols
        .iter()
        .filter(|s| s.st_shndx(endian) != elf::SHN_UNDEF)
        .filter_map(|s| s.name(endian, strings).ok())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    let soname = match sections.dynamic(endian, data).map_err(|e| format!("{e} (dynamic section)"))? {
        Some((entries, link)) => {
            let names = sections.strings(endian, data, link).map_err(|e| format!("{e} (dynamic strings)"))?;
            entries
                .iter()
                .find(|d| d.d_tag(endian) == elf::DT_SONAME)
                .and_then(|d| names.get(d.d_val(endian) as u32).ok())
                .map(|n| String::from_utf8_lossy(n).into_owned())
        }
        None => return Err("it has no dynamic section".into()),
    };
    let mut build_id = None;
    for section in sections.iter() {
        let Ok(Some(mut notes)) = section.notes(endian, data) else { continue };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                build_id = Some(note.desc().iter().map(|b| format!("{b:02x}")).collect());
            }
        }
    }
    Ok(LibraryFacts { size, soname, build_id, exports })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C library, which every Linux machine that runs these tests has.
    fn libc() -> &'static Path {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("libc.so.6 in a usual place")
    }

    #[test]
    fn reads_the_c_library() {
        let facts = inspect(libc()).unwrap();
        assert_eq!(facts.soname.as_deref(), Some("libc.so.6"));
        assert!(facts.missing(&["malloc", "free"]).is_none());
        assert_eq!(facts.missing(&["malloc", "nvrtcCreateProgram"]), Some("nvrtcCreateProgram"));
    }

    #[test]
    fn a_truncated_copy_is_caught_before_loading() {
        let bytes = std::fs::read(libc()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cut = dir.path().join("libc-cut.so");
        std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
        let err = inspect(&cut).unwrap_err();
        assert!(err.contains("truncated") || err.contains("not a usable ELF"), "{err}");
    }

    #[test]
    fn rejects_what_is_not_a_library() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.so");
        std::fs::write(&small, b"\x7fELF").unwrap();
        assert!(inspect(&small).unwrap_err().contains("plausible size"), "{}", inspect(&small).unwrap_err());
        let text = dir.path().join("text.so");
        std::fs::write(&text, vec![b'x'; 8192]).unwrap();
        assert!(inspect(&text).unwrap_err().contains("not a usable ELF"), "{}", inspect(&text).unwrap_err());
        assert!(inspect(dir.path()).unwrap_err().contains("not a regular file"));
    }
}
