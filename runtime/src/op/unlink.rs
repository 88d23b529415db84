//! `unlinkat`: remove a file's name.

use std::ffi::CString;

use io_uring::{opcode, squeue, types};

use super::{OpKind, neg_errno, res_to_io};

pub(crate) struct UnlinkAt {
    pub(crate) path: CString,
}

impl OpKind for UnlinkAt {
    type Output = std::io::Result<()>;

    fn uring_sqe(&mut self) -> squeue::Entry {
        // An unlink takes its directory's lock and frees the file's blocks (on a file system
        // mounted with `discard`, after the device has discarded them): it runs on io_uring's
        // workers whatever the flags say, so say so.
        opcode::UnlinkAt::new(types::Fd(libc::AT_FDCWD), self.path.as_ptr())
            .build()
            .flags(squeue::Flags::ASYNC)
    }

    fn blocking_call(&mut self) -> i32 {
        // SAFETY: the path is a NUL-terminated string owned by self.
        let r = unsafe { libc::unlinkat(libc::AT_FDCWD, self.path.as_ptr(), 0) };
        if r < 0 { neg_errno() } else { 0 }
    }

    fn complete(self, res: i32) -> Self::Output {
        res_to_io(res).map(|_| ())
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        Err(err)
    }
}
