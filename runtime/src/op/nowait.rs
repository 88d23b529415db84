//! Calls that never wait for a device, made on the executor thread on either backend.
//!
//! io_uring tries an open or a buffered read inline first (a lookup the dentry cache can answer,
//! a read the page cache holds) and hands it to its kernel workers only when that would block.
//! The runtime makes the same attempt itself, with plain system calls: `openat2` with
//! `RESOLVE_CACHED` and `preadv2` with `RWF_NOWAIT`. What succeeds costs neither a trip to an IO
//! thread (the fallback: two wake-ups) nor a ring round trip (io_uring: a submission reaped on
//! the loop's next turn, and more kernel work per operation than the system call it wraps), and
//! lands in the cache of the core that asked for it; what would block goes to the ring or to an
//! IO thread. Each function returns `None` for "hand it over", so the backend's own call stays
//! the one authority on every error the attempt is not sure of. Measured in
//! docs/benchmarks.md ("Read layer").

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::sync::OnceLock;

use super::statx::{EMPTY_PATH, FileStat};

/// Takes a turn of the polled task's inline budget, yielding first if it is spent (a task
/// completes at most a few dozen operations inline per poll). Off the runtime it is the error
/// every IO operation gives there.
pub(crate) async fn inline_turn() -> std::io::Result<()> {
    std::future::poll_fn(|cx| match crate::executor::current() {
        None => std::task::Poll::Ready(Err(super::not_on_runtime())),
        Some(exec) if !exec.take_inline_turn(cx) => std::task::Poll::Pending,
        Some(_) => std::task::Poll::Ready(Ok(())),
    })
    .await
}

/// Whether this kernel (and its seccomp policy) answers `openat2` with `RESOLVE_CACHED`
/// (Linux 5.12+): probed once on a directory that always exists.
fn cached_open_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(
        || match openat2_cached(c"/", libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(fd) => {
                // SAFETY: `fd` was just opened here and is owned by nobody else.
                unsafe { libc::close(fd) };
                true
            }
            Err(e) => e == libc::EAGAIN,
        },
    )
}

fn openat2_cached(path: &CStr, flags: i32) -> Result<RawFd, i32> {
    // SAFETY: open_how is plain data; all-zero is valid (mode 0, no resolve flags).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: `path` is NUL-terminated and `how` lives across the call; the size is its own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if r >= 0 {
        Ok(r as RawFd)
    } else {
        Err(-super::neg_errno())
    }
}

/// Whether [`open`] can answer for these flags: an open that creates or truncates always
/// writes, and a kernel without cached lookups cannot tell.
pub(crate) fn may_open(flags: i32) -> bool {
    flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_TMPFILE) == 0 && cached_open_supported()
}

/// Opens `path` for reading (or read-write, never creating or truncating) if the lookup can be
/// answered from the dentry cache: `Some(fd)`, or `Some(-errno)` for an answer the cache gave
/// for sure (no such file, not a directory, permission denied). `None`: hand it over.
pub(crate) fn open(path: &CStr, flags: i32) -> Option<i32> {
    if !may_open(flags) {
        return None;
    }
    match openat2_cached(path, flags) {
        Ok(fd) => {
            // `O_NONBLOCK` only kept the open itself from waiting (a FIFO's open waits for a
            // writer); the descriptor gets the flags that were asked for, as io_uring does.
            // SAFETY: `fd` is ours; F_SETFL changes only its status flags.
            if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
                // SAFETY: as above; the descriptor is dropped and the open handed over.
                unsafe { libc::close(fd) };
                return None;
            }
            Some(fd)
        }
        Err(e @ (libc::ENOENT | libc::ENOTDIR | libc::EACCES)) => Some(-e),
        Err(_) => None,
    }
}

/// Size and type of an open file from the attributes the kernel holds (`AT_STATX_DONT_SYNC`: a
/// network file system is not asked again; its open has just fetched them). `None` if the call
/// fails: ask with a plain `statx`, which io_uring always runs on its workers.
pub(crate) fn stat(fd: RawFd) -> Option<FileStat> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is live; the path is the empty C string with AT_EMPTY_PATH on `fd`.
    let r = unsafe {
        libc::statx(
            fd,
            EMPTY_PATH.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_SIZE,
            &mut st,
        )
    };
    (r == 0).then(|| FileStat::from_statx(&st))
}

/// Reads up to `len` bytes at `offset` into `dst` if the page cache holds (the start of) them:
/// `Some(n)`, possibly short. `None`: it would wait for the device, or this file or kernel does
/// not support the attempt; hand it over. Never for a descriptor opened `O_DIRECT`, whose read
/// waits for the device even when asked not to block.
pub(crate) fn pread(fd: RawFd, dst: *mut u8, len: usize, offset: u64) -> Option<usize> {
    let iov = libc::iovec {
        iov_base: dst.cast(),
        iov_len: len,
    };
    // SAFETY: `dst` points to `len` writable bytes (the caller's contract) and `iov` lives across
    // the call.
    let n = unsafe { libc::preadv2(fd, &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
    (n >= 0).then_some(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_cached_file_opens_and_reads_without_a_hand_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        // Written just now: its dentry and pages are cached.
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        if !cached_open_supported() {
            // A kernel before 5.12, or a seccomp policy that refuses openat2: every open is
            // handed over.
            assert_eq!(open(&c, libc::O_RDONLY), None);
            return;
        }
        let fd = open(&c, libc::O_RDONLY).expect("a cached lookup");
        assert!(fd >= 0, "open failed: {fd}");
        // SAFETY: fd was opened above and is owned by this test.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: F_GETFL reads the status flags of our own descriptor.
        let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(
            fl & libc::O_NONBLOCK,
            0,
            "O_NONBLOCK must not stay on the descriptor"
        );
        let mut buf = [0u8; 16];
        // A file system without RWF_NOWAIT support answers every attempt with a hand-over.
        if let Some(n) = pread(f.as_raw_fd(), buf.as_mut_ptr(), buf.len(), 2) {
            assert_eq!(&buf[..n], b"23456789");
            assert_eq!(pread(f.as_raw_fd(), buf.as_mut_ptr(), 4, 10), Some(0));
        }
    }

    #[test]
    fn a_missing_file_is_an_answer_and_creating_opens_are_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let missing =
            std::ffi::CString::new(dir.path().join("nope").as_os_str().as_encoded_bytes()).unwrap();
        // The parent was just created, so the negative lookup is answered from the cache, or
        // (if the dentry was never cached) handed over: never a wrong descriptor.
        if let Some(r) = open(&missing, libc::O_RDONLY) {
            assert_eq!(r, -libc::ENOENT);
        }
        assert_eq!(open(&missing, libc::O_RDWR | libc::O_CREAT), None);
        assert_eq!(open(&missing, libc::O_RDWR | libc::O_TRUNC), None);
    }
}
