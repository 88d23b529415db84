//! `write_at`: write a buffer's initialised bytes at a file offset.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use super::{OpKind, punted, res_to_io, retrying_interrupted};
use crate::buf::IoBuf;

pub(crate) struct WriteAt<B: IoBuf> {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) buf: B,
    pub(crate) offset: u64,
    /// Bytes of `buf` already written (writes continue after them).
    pub(crate) start: usize,
    /// The write cannot complete without blocking (an O_DIRECT write extending a new file):
    /// submit it to io_uring's workers at once instead of trying inline first.
    pub(crate) punt: bool,
}

impl<B: IoBuf> WriteAt<B> {
    fn src(&self) -> (*const u8, usize) {
        let len = self.buf.bytes_init();
        // SAFETY: start <= bytes_init (kept by the public API).
        let ptr = unsafe { self.buf.stable_ptr().add(self.start) };
        (ptr, (len - self.start).min(u32::MAX as usize))
    }
}

impl<B: IoBuf> OpKind for WriteAt<B> {
    type Output = (std::io::Result<usize>, B);

    fn uring_sqe(&mut self) -> squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let (ptr, len) = self.src();
        let sqe = opcode::Write::new(fd, ptr, len as u32)
            .offset(self.offset)
            .build();
        punted(sqe, self.punt)
    }

    fn blocking_call(&mut self) -> i32 {
        let (ptr, len) = self.src();
        let (fd, offset) = (self.fd.as_raw_fd(), self.offset as libc::off_t);
        retrying_interrupted(|| {
            // SAFETY: `ptr` points to `len` initialised bytes owned by `self.buf`.
            unsafe { libc::pwrite(fd, ptr.cast(), len, offset) }
        })
    }

    fn complete(self, res: i32) -> Self::Output {
        (res_to_io(res).map(|n| n as usize), self.buf)
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        (Err(err), self.buf)
    }
}
