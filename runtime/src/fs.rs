//! File IO through the runtime: open, stat, read, write, fsync.
//!
//! Every function here must be awaited on an executor thread; the same code runs on io_uring or
//! on the blocking pool depending on the runtime's backend.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::buf::{IoBuf, IoBufMut};
use crate::driver::Driver;
use crate::executor::current;
use crate::op::Op;
use crate::op::blocking::BlockingPool;
use crate::op::fsync::Fsync;
use crate::op::nowait;
use crate::op::open::OpenAt;
use crate::op::read::ReadAt;
use crate::op::rename::RenameAt;
pub use crate::op::statx::FileStat;
use crate::op::statx::Statx;
use crate::op::unlink::UnlinkAt;
use crate::op::write::WriteAt;
use crate::op::writev::WritevAt;

/// What one write of a write-all loop moved: its bytes (none when it was interrupted, to be
/// made again), or the error that ends the loop (a write of no bytes would never finish).
fn write_progress(r: std::io::Result<usize>) -> std::io::Result<usize> {
    match r {
        Ok(0) => Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "write returned 0",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        other => other,
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    write: bool,
    create: bool,
    truncate: bool,
    direct: bool,
}

impl OpenOptions {
    /// Read-only.
    pub fn read() -> Self {
        Self::default()
    }

    /// Read-write, created if missing (mode 0644), not truncated.
    pub fn write_create() -> Self {
        Self {
            write: true,
            create: true,
            ..Self::default()
        }
    }

    /// Truncate on open (with write).
    pub fn truncate(mut self, yes: bool) -> Self {
        self.truncate = yes;
        self
    }

    /// Bypass the page cache (O_DIRECT). Buffers, lengths and offsets must then be aligned to
    /// the device's logical block size: use [`crate::AlignedBuf`]. A file system that refuses
    /// O_DIRECT (tmpfs) makes `open` fail with `EINVAL`; callers fall back to buffered IO.
    pub fn direct(mut self, yes: bool) -> Self {
        self.direct = yes;
        self
    }

    fn flags(&self) -> i32 {
        let mut f = if self.write {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        if self.create {
            f |= libc::O_CREAT;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.direct {
            f |= libc::O_DIRECT;
        }
        f
    }
}

/// An open file. Cloning shares the descriptor; operations in flight keep it open.
#[derive(Clone, Debug)]
pub struct File {
    fd: Arc<OwnedFd>,
    path: Arc<Path>,
    /// Opened O_DIRECT and created or truncated: every write extends it, which a file system
    /// cannot do without blocking, so writes go to io_uring's workers at once.
    writes_block: bool,
    /// Opened O_DIRECT: a read always waits for the device, so the thread fallback never tries
    /// it inline as a page-cache hit.
    direct: bool,
}

fn path_cstring(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("path {} contains a NUL byte", path.display()),
        )
    })
}

impl File {
    /// Opens `path`.
    pub async fn open(path: impl AsRef<Path>, options: OpenOptions) -> std::io::Result<File> {
        let path = path.as_ref();
        let fd = Op::new(OpenAt {
            path: path_cstring(path)?,
            flags: options.flags(),
            mode: 0o644,
        })
        .await?;
        Ok(File {
            fd: Arc::new(fd),
            path: Arc::from(path),
            writes_block: options.direct && (options.create || options.truncate),
            direct: options.direct,
        })
    }

    /// Takes over a file opened elsewhere (its IO then goes through the runtime).
    pub fn from_std(file: std::fs::File, path: impl AsRef<Path>) -> File {
        // SAFETY: F_GETFL reads the status flags of a descriptor `file` owns.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        File {
            fd: Arc::new(OwnedFd::from(file)),
            path: Arc::from(path.as_ref()),
            writes_block: false,
            // Unknown flags count as O_DIRECT: never tried inline.
            direct: flags < 0 || flags & libc::O_DIRECT != 0,
        }
    }

    /// Fills `buf` after its initialised bytes, up to its capacity, from the file at `offset`
    /// on: the whole range, or an `UnexpectedEof` error naming the file if it ends first. The
    /// buffer comes back either way.
    pub async fn read_exact_buf<B: IoBufMut>(
        &self,
        buf: B,
        offset: u64,
    ) -> (std::io::Result<()>, B) {
        let (first, want) = (buf.bytes_init(), buf.bytes_total());
        let (r, buf) = self.fill(buf, offset).await;
        if r.is_ok() && buf.bytes_init() < want {
            let err = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "{} ends after {} of the {} bytes at offset {offset}",
                    self.path.display(),
                    buf.bytes_init() - first,
                    want - first
                ),
            );
            return (Err(err), buf);
        }
        (r, buf)
    }

    /// Reads into `buf` after its initialised bytes until it is full or the file ends (the one
    /// read loop behind every "read this range" here).
    async fn fill<B: IoBufMut>(&self, mut buf: B, offset: u64) -> (std::io::Result<()>, B) {
        let first = buf.bytes_init();
        while buf.bytes_init() < buf.bytes_total() {
            let at = offset + (buf.bytes_init() - first) as u64;
            let (r, b) = self.read_at(buf, at).await;
            buf = b;
            match r {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// The path this file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size and type.
    pub async fn stat(&self) -> std::io::Result<FileStat> {
        // SAFETY: statx is plain data; all-zero is a valid value.
        let buf: Box<libc::statx> = Box::new(unsafe { std::mem::zeroed() });
        Op::new(Statx {
            fd: Arc::clone(&self.fd),
            buf,
        })
        .await
    }

    /// One read of up to `buf`'s spare capacity at `offset`, appended after its initialised
    /// bytes. Returns the number of bytes read (0 at end of file) and the buffer.
    pub async fn read_at<B: IoBufMut>(&self, buf: B, offset: u64) -> (std::io::Result<usize>, B) {
        let start = buf.bytes_init();
        if start > buf.bytes_total() {
            return (
                Err(std::io::Error::other(
                    "buffer initialised length exceeds capacity",
                )),
                buf,
            );
        }
        Op::new(ReadAt {
            fd: Arc::clone(&self.fd),
            buf,
            offset,
            start,
            cached: !self.direct,
        })
        .await
    }

    /// Reads `len` bytes at `offset` (fewer only at end of file) into a new buffer.
    pub async fn read_exact_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let (r, mut buf) = self.fill(Vec::with_capacity(len), offset).await;
        r?;
        // The allocation may be roomier than asked; only `len` bytes belong to the range.
        buf.truncate(len);
        Ok(buf)
    }

    /// One write of `buf`'s initialised bytes at `offset`. Returns bytes written and the buffer.
    pub async fn write_at<B: IoBuf>(&self, buf: B, offset: u64) -> (std::io::Result<usize>, B) {
        Op::new(WriteAt {
            fd: Arc::clone(&self.fd),
            buf,
            offset,
            start: 0,
            punt: self.writes_block,
        })
        .await
    }

    /// Writes all of `head` and then all of `body` at `offset` (`body` right after `head`), in
    /// one call when the file takes it whole, retrying short writes; hands both buffers back.
    pub async fn write_all_vectored_at<A: IoBuf, B: IoBuf>(
        &self,
        head: A,
        body: B,
        offset: u64,
    ) -> (std::io::Result<()>, A, B) {
        let total = head.bytes_init() + body.bytes_init();
        let (mut head, mut body) = (head, body);
        let mut done = 0usize;
        while done < total {
            let (r, h, b) = Op::new(WritevAt {
                fd: Arc::clone(&self.fd),
                head,
                body,
                offset,
                start: done,
                punt: self.writes_block,
                iov: [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            })
            .await;
            (head, body) = (h, b);
            match write_progress(r) {
                Ok(n) => done += n,
                Err(e) => return (Err(e), head, body),
            }
        }
        (Ok(()), head, body)
    }

    /// Writes all of `buf` at `offset`, retrying short writes.
    pub async fn write_all_at<B: IoBuf>(&self, buf: B, offset: u64) -> (std::io::Result<()>, B) {
        let total = buf.bytes_init();
        let mut done = 0usize;
        let mut buf = buf;
        while done < total {
            let (r, b) = Op::new(WriteAt {
                fd: Arc::clone(&self.fd),
                buf,
                offset: offset + done as u64,
                start: done,
                punt: self.writes_block,
            })
            .await;
            buf = b;
            match write_progress(r) {
                Ok(n) => done += n,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// `fsync` (or `fdatasync` when `datasync`).
    pub async fn sync(&self, datasync: bool) -> std::io::Result<()> {
        Op::new(Fsync {
            fd: Arc::clone(&self.fd),
            datasync,
        })
        .await
    }
}

impl std::os::fd::AsRawFd for File {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Reads a whole file: open, stat, read until the size is reached or end of file.
///
/// A directory is an `EISDIR` error naming the path (opening one read-only succeeds on Linux).
pub async fn read(path: impl AsRef<Path>) -> std::io::Result<Vec<u8>> {
    read_into(path, Vec::new()).await
}

/// Reads a whole file into `buf` (cleared first; its capacity is reused), so a caller that
/// recycles buffers pays no allocation and no page faults per read.
///
/// What the dentry and page caches hold is read on this thread (`op::nowait`); the rest goes
/// through the ring (io_uring) or in one trip to an IO thread (the fallback) rather than a trip
/// per system call.
pub async fn read_into(path: impl AsRef<Path>, buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
    let path = path.as_ref();
    nowait::inline_turn().await?;
    let rest = match read_whole_nowait(path, buf) {
        Ok(done) => return done,
        Err(rest) => rest,
    };
    if let Some(pool) = BlockingPool::current() {
        let path = path.to_path_buf();
        return pool.run(move || rest.finish(&path)).await;
    }
    match rest {
        Rest::Open(buf) => read_whole_ring(path, buf).await,
        Rest::Read(file, len, buf) => read_to_len(&File::from_std(file, path), len, buf).await,
    }
}

/// [`read_into`] through the ring: open, stat, read until the size is reached.
async fn read_whole_ring(path: &Path, mut buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
    let file = File::open(path, OpenOptions::read()).await?;
    // io_uring runs every statx on its workers (a trip to a kernel thread and back per file);
    // the attributes the open just fetched are at hand without one.
    let stat = match nowait::stat(file.fd.as_raw_fd()) {
        Some(stat) => stat,
        None => file.stat().await?,
    };
    if stat.is_dir {
        return Err(is_a_directory(path));
    }
    buf.clear();
    read_to_len(&file, stat.len as usize, buf).await
}

/// Reads `file` from `buf.len()` on until `len` bytes are in `buf` or the file ends (a file
/// that grew since its size was taken is read as it was).
async fn read_to_len(file: &File, len: usize, mut buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
    // Amortised growth, not `reserve_exact`: stored chunks differ in size by a few bytes, and
    // a recycled buffer grown to each larger one exactly would be reallocated (fresh, cold
    // memory) on most reads.
    buf.reserve(len.saturating_sub(buf.len()));
    loop {
        let have = buf.len();
        if have >= len {
            return Ok(buf);
        }
        // `read_at` fills up to the spare capacity, which a recycled buffer may have more of.
        let (r, mut b) = file.read_at(buf, have as u64).await;
        b.truncate(len);
        buf = b;
        match r {
            Ok(0) => return Ok(buf),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// What is left of a whole-file read that could not finish without waiting for a device.
enum Rest {
    /// Not opened yet: everything.
    Open(Vec<u8>),
    /// Opened, `len` bytes long, `buf` holds the first of them.
    Read(std::fs::File, usize, Vec<u8>),
}

impl Rest {
    /// Finishes the read of `path` with plain system calls, on an IO thread (the fallback): the
    /// same checks and the same result as [`read_into`].
    fn finish(self, path: &Path) -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let (mut file, len, mut buf) = match self {
            Rest::Read(file, len, buf) => (file, len, buf),
            Rest::Open(mut buf) => {
                let file = std::fs::File::open(path)?;
                let meta = file.metadata()?;
                if meta.is_dir() {
                    return Err(is_a_directory(path));
                }
                buf.clear();
                (file, meta.len() as usize, buf)
            }
        };
        let have = buf.len();
        if have > 0 {
            file.seek(SeekFrom::Start(have as u64))?;
        }
        buf.reserve(len.saturating_sub(have));
        // A file that grew since its size was taken is read as it was.
        file.take(len.saturating_sub(have) as u64)
            .read_to_end(&mut buf)?;
        Ok(buf)
    }
}

/// [`read_into`] on the executor thread as far as the caches allow (`op::nowait`): `Ok` is the
/// result, `Err` what is left for an IO thread.
fn read_whole_nowait(path: &Path, mut buf: Vec<u8>) -> Result<std::io::Result<Vec<u8>>, Rest> {
    use std::os::fd::FromRawFd;
    let Ok(c_path) = path_cstring(path) else {
        return Err(Rest::Open(buf));
    };
    let fd = match nowait::open(&c_path, libc::O_RDONLY) {
        None => return Err(Rest::Open(buf)),
        Some(e) if e < 0 => return Ok(Err(std::io::Error::from_raw_os_error(-e))),
        // SAFETY: a descriptor just opened, owned by nobody else.
        Some(fd) => unsafe { std::fs::File::from_raw_fd(fd) },
    };
    let Some(stat) = nowait::stat(fd.as_raw_fd()) else {
        return Err(Rest::Open(buf));
    };
    if stat.is_dir {
        return Ok(Err(is_a_directory(path)));
    }
    let len = stat.len as usize;
    buf.clear();
    buf.reserve(len);
    while buf.len() < len {
        let have = buf.len();
        // SAFETY: `reserve(len)` made room for `len` bytes, so `have..len` is spare capacity
        // of `buf`.
        let dst = unsafe { buf.as_mut_ptr().add(have) };
        match nowait::pread(fd.as_raw_fd(), dst, len - have, have as u64) {
            // The file is shorter than its size said: read as it is.
            Some(0) => break,
            // SAFETY: the kernel wrote `n` bytes after the `have` initialised ones.
            Some(n) => unsafe { buf.set_len(have + n) },
            None => return Err(Rest::Read(fd, len, buf)),
        }
    }
    Ok(Ok(buf))
}

fn is_a_directory(path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::IsADirectory,
        format!("{} is a directory, not a file", path.display()),
    )
}

/// Reads `len` bytes at `offset` of the file at `path` (fewer at end of file).
pub async fn read_range(
    path: impl AsRef<Path>,
    offset: u64,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let file = File::open(path, OpenOptions::read()).await?;
    file.read_exact_at(offset, len).await
}

/// What to do when `e` says the process or the system is out of file descriptors (`EMFILE`,
/// `ENFILE`), as a clause to append to the error; `None` for any other error. One wording for
/// every open made on a read's behalf (a stored chunk, a cached chunk's file).
pub fn out_of_descriptors_hint(e: &std::io::Error) -> Option<&'static str> {
    match e.raw_os_error() {
        Some(libc::EMFILE) => Some(
            "the process is at its open-file limit: lower max_inflight (every read in flight, \
             and every cached chunk looked up ahead, holds a file open) or raise the limit \
             (ulimit -n)",
        ),
        Some(libc::ENFILE) => Some(
            "the system is at its open-file limit (fs.file-max): lower max_inflight or close \
             other files",
        ),
        _ => None,
    }
}

/// Renames `from` to `to`, replacing a file there (`rename(2)`). The call runs on io_uring's
/// workers or on an IO thread: a rename waits for its directory's lock, which the creation of
/// every other file in that directory takes too, and an executor must not spin on it while the
/// tasks it runs wait (`docs/benchmarks.md`, "NVMe tier"). On a kernel
/// whose io_uring cannot rename (before Linux 5.11) it is a system call on this thread.
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> std::io::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    if !crate::backend::probe().renameat
        && current().is_some_and(|e| matches!(e.driver, Driver::Uring(_)))
    {
        return std::fs::rename(from, to);
    }
    Op::new(RenameAt {
        from: path_cstring(from)?,
        to: path_cstring(to)?,
    })
    .await
}

/// Removes the file at `path` (`unlink(2)`). Like [`rename`], the call runs on io_uring's
/// workers or on an IO thread: it waits for its directory's lock and, on a file system mounted
/// with `discard`, for the device to discard the file's blocks (1 ms for 4 MiB on the
/// benchmark VM). On a kernel whose io_uring cannot unlink (before Linux 5.11) it is a system
/// call on this thread.
pub async fn remove_file(path: impl AsRef<Path>) -> std::io::Result<()> {
    let path = path.as_ref();
    if !crate::backend::probe().unlinkat
        && current().is_some_and(|e| matches!(e.driver, Driver::Uring(_)))
    {
        return std::fs::remove_file(path);
    }
    Op::new(UnlinkAt {
        path: path_cstring(path)?,
    })
    .await
}

/// Writes `data` to `path` through a temporary name and renames it into place, so a reader
/// never sees a partial file.
pub async fn write_atomic(path: impl AsRef<Path>, data: Vec<u8>) -> std::io::Result<()> {
    let path = path.as_ref();
    let tmp: PathBuf = {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".tmp{}", std::process::id()));
        path.with_file_name(name)
    };
    let file = File::open(&tmp, OpenOptions::write_create().truncate(true)).await?;
    let (r, _) = file.write_all_at(data, 0).await;
    r?;
    drop(file);
    rename(&tmp, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_io_thread_finishes_of_a_whole_file_read_is_the_rest_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        // Not opened yet (the lookup was not cached): everything, into a recycled buffer.
        let got = Rest::Open(vec![9u8; 10]).finish(&p).unwrap();
        assert_eq!(got, data);
        // Opened and partly read inline: the rest, after the bytes already there.
        let got = Rest::Read(
            std::fs::File::open(&p).unwrap(),
            data.len(),
            data[..777].to_vec(),
        )
        .finish(&p)
        .unwrap();
        assert_eq!(got, data);
        // A file shorter than its size said is read as it is.
        let got = Rest::Read(
            std::fs::File::open(&p).unwrap(),
            data.len() + 50,
            Vec::new(),
        )
        .finish(&p)
        .unwrap();
        assert_eq!(got, data);
        let err = Rest::Open(Vec::new()).finish(dir.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::IsADirectory, "{err}");
    }

    #[test]
    fn a_whole_file_read_from_the_caches_matches_the_file_or_says_what_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        match read_whole_nowait(&p, Vec::new()) {
            Ok(got) => assert_eq!(got.unwrap(), data),
            // A kernel without cached lookups hands the whole read over.
            Err(rest) => assert_eq!(rest.finish(&p).unwrap(), data),
        }
        match read_whole_nowait(dir.path(), Vec::new()) {
            Ok(r) => assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::IsADirectory),
            Err(rest) => assert!(rest.finish(dir.path()).is_err()),
        }
        match read_whole_nowait(&dir.path().join("missing"), Vec::new()) {
            Ok(r) => assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::NotFound),
            Err(rest) => assert_eq!(
                rest.finish(&dir.path().join("missing")).unwrap_err().kind(),
                std::io::ErrorKind::NotFound
            ),
        }
    }
}
