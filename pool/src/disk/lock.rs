//! One writer per cache directory: an advisory `flock` on `insitu_cache.lock`, held for the
//! pool's lifetime. The kernel drops it when the process dies (SIGKILL included), so there is
//! never a stale lock to clean up; deleting the lock file releases nothing and lets the next two
//! processes lock different inodes.
//!
//! A `flock` belongs to the open file, which a child made by `fork` shares (a `fork`-started
//! DataLoader worker, a `multiprocessing` pool): the lock would then outlive the dataset that
//! took it for as long as the child lives. So each held lock's descriptor is registered, and a
//! `pthread_atfork` child handler points it at `/dev/null` in the child (`dup3`, a plain system
//! call, async-signal-safe); the parent's lock is untouched and the child's copy of the
//! descriptor stays valid, so nothing the child later does with it can touch another file. The
//! handler runs when the child first runs: between `fork` and then, the child's copy still
//! holds the lock.
#![allow(unsafe_code)]

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use super::CacheError;

/// The lock file's name inside the cache directory.
pub const LOCK_NAME: &str = "insitu_cache.lock";

/// A held lock (released when dropped, or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    file: std::fs::File,
    exclusive: bool,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Before the descriptor closes, so a fork from here on does not touch its number.
        forget_on_fork(self.file.as_raw_fd());
        if self.exclusive {
            // Clear the holder record while still holding the lock, so a later conflict with
            // readers does not name a writer that has gone. (A killed writer leaves its record;
            // the next writer overwrites it.)
            let _ = self.file.set_len(0);
        }
    }
}

/// Takes the lock: exclusive for a writer, shared for `readonly_cache`. Never waits: a held lock
/// is an error naming the holder. A file system without `flock` support is reported in
/// `warnings` and the cache runs unarbitrated.
pub fn acquire(
    dir: &Path,
    shared: bool,
    warnings: &mut Vec<String>,
) -> Result<DirLock, CacheError> {
    let path = dir.join(LOCK_NAME);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(!shared)
        .create(!shared)
        .truncate(false)
        .open(&path)
        .or_else(|e| match e.kind() {
            // A readonly job over a cache no writer ever locked: nothing to share with.
            std::io::ErrorKind::NotFound if shared => std::fs::File::open(dir),
            _ => Err(e),
        })
        .map_err(|e| CacheError::io("open the cache lock", &path, e))?;
    let op = if shared { libc::LOCK_SH } else { libc::LOCK_EX } | libc::LOCK_NB;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(CacheError::Locked {
                    dir: dir.to_path_buf(),
                    wanted: if shared {
                        "shared (readonly_cache)"
                    } else {
                        "exclusive (writer)"
                    },
                    holder: if holder.is_empty() {
                        "readonly_cache readers (they record no PID)".to_string()
                    } else if holder == holder_record().trim() {
                        format!(
                            "another dataset in this process ({holder}): close it first, or \
                             give this one a cache_dir of its own"
                        )
                    } else {
                        format!("another process ({holder})")
                    },
                });
            }
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => {
                warnings.push(format!(
                    "cache_dir {} does not support flock ({err}): nothing stops two writers from \
                     corrupting each other's files; give each writing job its own cache_dir",
                    dir.display()
                ));
                break;
            }
            _ => return Err(CacheError::io("lock", &path, err)),
        }
    }
    if !shared {
        let who = holder_record();
        let write = file
            .set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| file.write_all(who.as_bytes()));
        write.map_err(|e| CacheError::io("record the lock holder in", &path, e))?;
    }
    release_on_fork(file.as_raw_fd());
    Ok(DirLock {
        file,
        exclusive: !shared,
    })
}

/// Descriptors of held locks (-1: free). More locks than this in one process are simply not
/// released in forked children.
static HELD: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
/// An open `/dev/null` the child handler points held descriptors at.
static DEV_NULL: AtomicI32 = AtomicI32::new(-1);

/// Registers a held lock's descriptor so a forked child lets go of it.
fn release_on_fork(fd: i32) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // SAFETY: a NUL-terminated path; the descriptor is kept for the process's lifetime.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if null >= 0 {
            DEV_NULL.store(null, Ordering::SeqCst);
            // SAFETY: registers a handler that only makes dup3 system calls (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(let_go_in_child)) };
        }
    });
    for slot in &HELD {
        if slot
            .compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

fn forget_on_fork(fd: i32) {
    for slot in &HELD {
        let _ = slot.compare_exchange(fd, -1, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Runs in a child right after `fork`: only async-signal-safe calls.
extern "C" fn let_go_in_child() {
    let null = DEV_NULL.load(Ordering::SeqCst);
    if null < 0 {
        return;
    }
    for slot in &HELD {
        let fd = slot.load(Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: both are descriptors of this (child) process; dup3 replaces `fd`'s open
            // file with /dev/null, dropping the child's reference to the lock.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    }
}

/// What a writer records in the lock file: who holds it.
fn holder_record() -> String {
    format!("pid {} on host {}\n", std::process::id(), hostname())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// File systems where `flock` may be emulated per client or not arbitrated at all.
const NETWORK_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x00C3_6400, "CephFS"),
    (0x0102_1997, "9p"),
    (0x6573_5546, "FUSE"),
    (0x1983_0326, "BeeGFS"),
];

/// The name of the network file system `dir` is on, if it is on one we know.
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let kind = st.f_type as i64;
    NETWORK_FS
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_fails_fast_naming_the_holder_and_readers_share() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Vec::new();
        let held = acquire(dir.path(), false, &mut w).unwrap();
        // flock is per open file description: a second open in this process conflicts too.
        let err = acquire(dir.path(), false, &mut w).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())) && err.contains("host"),
            "{err}"
        );
        assert!(err.contains("another dataset in this process"), "{err}");
        let err = acquire(dir.path(), true, &mut w).unwrap_err().to_string();
        assert!(err.contains("shared (readonly_cache)"), "{err}");
        drop(held);
        let r1 = acquire(dir.path(), true, &mut w).unwrap();
        let _r2 = acquire(dir.path(), true, &mut w).unwrap();
        let err = acquire(dir.path(), false, &mut w).unwrap_err().to_string();
        assert!(err.contains("readonly_cache readers"), "{err}");
        drop(r1);
        assert!(w.is_empty(), "{w:?}");
    }
}
