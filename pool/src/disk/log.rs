//! `insitu_cache.jsonl`: the append-only record of completed slot files.
//!
//! Line 1 is a format header; every other line is one [`LogEntry`], appended (one `write` of the
//! whole line, `O_APPEND`) the moment its file has been renamed into place. A process killed
//! at any point leaves a log whose entries all name complete files; at worst the final line is
//! torn by a power loss, and a torn final line is dropped on load. Anything else that does not
//! parse is damage, and damage raises.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CacheError;

/// The log's file name inside the cache directory.
pub const LOG_NAME: &str = "insitu_cache.jsonl";
/// Format name in the header line.
pub const FORMAT_NAME: &str = "insitubatch-cache";
/// The log format this build writes; part of every array's fingerprint.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
}

/// One cached slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Array path in the store.
    pub array: String,
    /// Absolute chunk index along the sample axis.
    pub chunk: u64,
    /// The slot file: a bare file name inside the cache directory.
    pub file: String,
    /// Shape of the slot (`[samples_per_chunk, *inner_shape]`).
    pub shape: Vec<u64>,
    /// Numpy type string.
    pub dtype: String,
    /// The array's chunk-transform fingerprint when the file was written.
    pub fingerprint: String,
}

/// What a load found.
pub enum Loaded {
    /// No log yet.
    Missing,
    /// A log in a format this build does not read: the whole cache is stale.
    OtherFormat { found: String },
    /// Entries in file order; `torn_tail` when a final partial line was dropped.
    Entries {
        entries: Vec<LogEntry>,
        torn_tail: bool,
    },
}

/// True for a name that stays inside the directory: no separators, not `.`/`..`, no NUL.
pub fn is_bare_basename(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.contains('\0')
}

/// Reads and checks the log at `path`.
pub fn load(path: &Path) -> Result<Loaded, CacheError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(CacheError::io("read the cache log", path, e)),
    };
    let corrupt = |line: usize, why: String| CacheError::Corrupt {
        path: path.to_path_buf(),
        line,
        why,
    };
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| corrupt(0, format!("the log is not UTF-8 text ({e})")))?;
    let ends_clean = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let Some(first) = lines.first() else {
        return Err(corrupt(
            1,
            "the log is empty: its format header is missing".into(),
        ));
    };
    let header: Header = serde_json::from_str(first)
        .map_err(|e| corrupt(1, format!("unreadable format header ({e})")))?;
    if header.format != FORMAT_NAME {
        return Err(corrupt(
            1,
            format!(
                "the header names format `{}`, not `{FORMAT_NAME}`",
                header.format
            ),
        ));
    }
    if header.version != FORMAT_VERSION {
        return Ok(Loaded::OtherFormat {
            found: format!("{} v{}", header.format, header.version),
        });
    }
    let mut entries = Vec::with_capacity(lines.len().saturating_sub(1));
    let mut torn_tail = false;
    for (i, line) in lines.iter().enumerate().skip(1) {
        let last = i + 1 == lines.len();
        match serde_json::from_str::<LogEntry>(line) {
            Ok(e) => {
                if !is_bare_basename(&e.file) {
                    return Err(corrupt(
                        i + 1,
                        format!(
                            "entry for {}[chunk {}] names file `{}`, which is not a bare file \
                             name inside the cache directory",
                            e.array, e.chunk, e.file
                        ),
                    ));
                }
                entries.push(e);
            }
            // Only a final line without its newline can be a torn append.
            Err(_) if last && !ends_clean => torn_tail = true,
            Err(e) => return Err(corrupt(i + 1, format!("malformed entry ({e})"))),
        }
    }
    Ok(Loaded::Entries { entries, torn_tail })
}

fn header_line() -> String {
    let h = Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
    };
    serde_json::to_string(&h).expect("the header serializes") + "\n"
}

/// One entry as a line (with its newline).
pub fn entry_line(e: &LogEntry) -> String {
    serde_json::to_string(e).expect("an entry serializes") + "\n"
}

/// Writes a log holding `entries` under a temporary name and renames it over `path`.
pub fn rewrite(path: &Path, entries: &[LogEntry]) -> Result<(), CacheError> {
    let tmp: PathBuf = path.with_extension(format!("jsonl.tmp{}", std::process::id()));
    let mut text = header_line();
    for e in entries {
        text.push_str(&entry_line(e));
    }
    std::fs::write(&tmp, text).map_err(|e| CacheError::io("write the cache log", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| CacheError::io("rename the cache log", path, e))
}

/// Opens the log for appending.
pub fn open_append(path: &Path) -> Result<std::fs::File, CacheError> {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| CacheError::io("open the cache log for appending", path, e))
}

/// Appends one entry with a single `write`, so a killed process never leaves half a line.
pub fn append(file: &mut std::fs::File, e: &LogEntry) -> std::io::Result<()> {
    let line = entry_line(e);
    let n = file.write(line.as_bytes())?;
    if n != line.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!(
                "short append to the cache log ({n} of {} bytes)",
                line.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(chunk: u64, file: &str) -> LogEntry {
        LogEntry {
            array: "t2m".into(),
            chunk,
            file: file.into(),
            shape: vec![4, 2],
            dtype: "<f4".into(),
            fingerprint: "00".into(),
        }
    }

    #[test]
    fn round_trip_torn_tail_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(LOG_NAME);
        assert!(matches!(load(&p).unwrap(), Loaded::Missing));
        rewrite(&p, &[entry(0, "a.npy")]).unwrap();
        let mut f = open_append(&p).unwrap();
        append(&mut f, &entry(1, "b.npy")).unwrap();
        let Loaded::Entries { entries, torn_tail } = load(&p).unwrap() else {
            panic!()
        };
        assert_eq!(entries, vec![entry(0, "a.npy"), entry(1, "b.npy")]);
        assert!(!torn_tail);

        // A final line cut short (no newline) is a torn append: dropped, not an error.
        f.write_all(b"{\"array\": \"t2").unwrap();
        let Loaded::Entries { entries, torn_tail } = load(&p).unwrap() else {
            panic!()
        };
        assert_eq!(entries.len(), 2);
        assert!(torn_tail);

        // The same bytes followed by more lines are damage inside the log.
        f.write_all(b"\n").unwrap();
        append(&mut f, &entry(2, "c.npy")).unwrap();
        let err = load(&p).err().unwrap().to_string();
        assert!(err.contains("line 4") && err.contains("malformed"), "{err}");

        rewrite(&p, &[entry(0, "../escape.npy")]).unwrap();
        let err = load(&p).err().unwrap().to_string();
        assert!(err.contains("not a bare file name"), "{err}");

        std::fs::write(&p, "not json\n").unwrap();
        let err = load(&p).err().unwrap().to_string();
        assert!(err.contains("unreadable format header"), "{err}");

        std::fs::write(&p, "{\"format\":\"insitubatch-cache\",\"version\":0}\n").unwrap();
        assert!(matches!(load(&p).unwrap(), Loaded::OtherFormat { .. }));
    }
}
