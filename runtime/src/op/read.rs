//! `read_at`: read up to a buffer's capacity from a file offset.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use super::{OpKind, res_to_io, retrying_interrupted};
use crate::buf::IoBufMut;

pub(crate) struct ReadAt<B: IoBufMut> {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) buf: B,
    pub(crate) offset: u64,
    /// Bytes already in `buf` (reads append after them).
    pub(crate) start: usize,
    /// The thread fallback may try it as a page-cache read first (not for `O_DIRECT`).
    pub(crate) cached: bool,
}

impl<B: IoBufMut> ReadAt<B> {
    fn dst(&mut self) -> (*mut u8, usize) {
        let total = self.buf.bytes_total();
        // SAFETY: start <= bytes_total (checked by the public API), so the pointer stays inside
        // the buffer's allocation. One read is capped so its count fits the i32 result.
        let ptr = unsafe { self.buf.stable_mut_ptr().add(self.start) };
        (ptr, (total - self.start).min(i32::MAX as usize))
    }
}

impl<B: IoBufMut> OpKind for ReadAt<B> {
    type Output = (std::io::Result<usize>, B);

    fn uring_sqe(&mut self) -> squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let (ptr, len) = self.dst();
        opcode::Read::new(fd, ptr, len as u32)
            .offset(self.offset)
            .build()
    }

    fn blocking_call(&mut self) -> i32 {
        let fd = self.fd.as_raw_fd();
        let (ptr, len) = self.dst();
        retrying_interrupted(|| {
            // SAFETY: `ptr` points to `len` writable bytes owned by `self.buf`.
            unsafe { libc::pread(fd, ptr.cast(), len, self.offset as libc::off_t) }
        })
    }

    fn may_complete_nonblocking(&self) -> bool {
        self.cached
    }

    fn try_nonblocking(&mut self) -> Option<i32> {
        let (ptr, len) = self.dst();
        let n = super::nowait::pread(self.fd.as_raw_fd(), ptr, len, self.offset)?;
        Some(n as i32)
    }

    fn complete(mut self, res: i32) -> Self::Output {
        match res_to_io(res) {
            Ok(n) => {
                // SAFETY: the kernel (or pread) wrote `n` bytes after `start`.
                unsafe { self.buf.set_init(self.start + n as usize) };
                (Ok(n as usize), self.buf)
            }
            Err(e) => (Err(e), self.buf),
        }
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        (Err(err), self.buf)
    }
}
