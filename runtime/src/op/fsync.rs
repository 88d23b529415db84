//! `fsync` / `fdatasync`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use super::{OpKind, neg_errno, res_to_io};

pub(crate) struct Fsync {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) datasync: bool,
}

impl OpKind for Fsync {
    type Output = std::io::Result<()>;

    fn uring_sqe(&mut self) -> squeue::Entry {
        let mut op = opcode::Fsync::new(types::Fd(self.fd.as_raw_fd()));
        if self.datasync {
            op = op.flags(types::FsyncFlags::DATASYNC);
        }
        op.build()
    }

    fn blocking_call(&mut self) -> i32 {
        let fd = self.fd.as_raw_fd();
        // SAFETY: plain syscalls on an fd we keep open.
        let r = unsafe {
            if self.datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        };
        if r < 0 { neg_errno() } else { 0 }
    }

    fn complete(self, res: i32) -> Self::Output {
        res_to_io(res).map(|_| ())
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        Err(err)
    }
}
