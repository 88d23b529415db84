//! `write_vectored_at`: write two buffers' initialised bytes back to back at a file offset in
//! one call (`pwritev`), as a slot file's header and its data.
//!
//! One call instead of two halves the trips a buffered write of a new file makes: on io_uring
//! such a write cannot complete inline and goes to the ring's workers, on the fallback to an IO
//! thread, so each write is a hand-over and a wake-up.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use super::{OpKind, punted, res_to_io, retrying_interrupted};
use crate::buf::IoBuf;

pub(crate) struct WritevAt<A: IoBuf, B: IoBuf> {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) head: A,
    pub(crate) body: B,
    /// File offset of `head`'s first byte.
    pub(crate) offset: u64,
    /// Bytes of `head` then `body` already written (writes continue after them).
    pub(crate) start: usize,
    /// Submit to io_uring's workers at once (see [`super::write::WriteAt`]).
    pub(crate) punt: bool,
    /// The vectors the call is given: filled by [`WritevAt::vectors`], read by the kernel until
    /// the completion (this value is boxed and owned by the driver meanwhile).
    pub(crate) iov: [libc::iovec; 2],
}

// SAFETY: the iovecs point into `head` and `body`, which are `Send` and move with this value;
// the raw pointers are only dereferenced by the kernel or the blocking call that owns it.
unsafe impl<A: IoBuf, B: IoBuf> Send for WritevAt<A, B> {}

impl<A: IoBuf, B: IoBuf> WritevAt<A, B> {
    /// Fills `iov` with what is left to write after `start`; returns how many vectors and the
    /// file offset they start at.
    fn vectors(&mut self) -> (usize, u64) {
        let (h, b) = (self.head.bytes_init(), self.body.bytes_init());
        let mut n = 0;
        if self.start < h {
            // SAFETY: start < h, so the pointer stays within `head`'s initialised bytes.
            let base = unsafe { self.head.stable_ptr().add(self.start) };
            self.iov[n] = libc::iovec {
                iov_base: base as *mut _,
                iov_len: h - self.start,
            };
            n += 1;
        }
        let into_body = self.start.saturating_sub(h);
        if into_body < b {
            // SAFETY: into_body < b, so the pointer stays within `body`'s initialised bytes.
            let base = unsafe { self.body.stable_ptr().add(into_body) };
            self.iov[n] = libc::iovec {
                iov_base: base as *mut _,
                iov_len: b - into_body,
            };
            n += 1;
        }
        (n, self.offset + self.start as u64)
    }
}

impl<A: IoBuf, B: IoBuf> OpKind for WritevAt<A, B> {
    type Output = (std::io::Result<usize>, A, B);

    fn uring_sqe(&mut self) -> squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let (n, offset) = self.vectors();
        let sqe = opcode::Writev::new(fd, self.iov.as_ptr(), n as u32)
            .offset(offset)
            .build();
        punted(sqe, self.punt)
    }

    fn blocking_call(&mut self) -> i32 {
        let (n, offset) = self.vectors();
        let (fd, iov) = (self.fd.as_raw_fd(), self.iov.as_ptr());
        retrying_interrupted(|| {
            // SAFETY: `iov` holds `n` vectors over initialised bytes owned by `self`.
            unsafe { libc::pwritev(fd, iov, n as libc::c_int, offset as libc::off_t) }
        })
    }

    fn complete(self, res: i32) -> Self::Output {
        (res_to_io(res).map(|n| n as usize), self.head, self.body)
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        (Err(err), self.head, self.body)
    }
}
