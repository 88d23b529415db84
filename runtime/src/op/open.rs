//! `openat`: open a file relative to the current directory (absolute paths ignore it).

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};

use io_uring::{opcode, squeue, types};

use super::{OpKind, neg_errno, res_to_io};

pub(crate) struct OpenAt {
    pub(crate) path: CString,
    pub(crate) flags: i32,
    pub(crate) mode: u32,
}

impl OpKind for OpenAt {
    type Output = std::io::Result<OwnedFd>;

    fn uring_sqe(&mut self) -> squeue::Entry {
        let sqe = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), self.path.as_ptr())
            .flags(self.flags | libc::O_CLOEXEC)
            .mode(self.mode)
            .build();
        // Creating a file cannot be done without blocking: go straight to io_uring's workers
        // rather than try inline first.
        if self.flags & libc::O_CREAT != 0 {
            sqe.flags(squeue::Flags::ASYNC)
        } else {
            sqe
        }
    }

    fn blocking_call(&mut self) -> i32 {
        // SAFETY: `path` is a NUL-terminated string owned by self.
        let fd = unsafe {
            libc::openat(
                libc::AT_FDCWD,
                self.path.as_ptr(),
                self.flags | libc::O_CLOEXEC,
                self.mode,
            )
        };
        if fd < 0 { neg_errno() } else { fd }
    }

    fn try_nonblocking(&mut self) -> Option<i32> {
        super::nowait::open(&self.path, self.flags)
    }

    fn may_complete_nonblocking(&self) -> bool {
        super::nowait::may_open(self.flags)
    }

    fn complete(self, res: i32) -> Self::Output {
        let fd = res_to_io(res)?;
        // SAFETY: a successful open returned a descriptor nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        Err(err)
    }
}
