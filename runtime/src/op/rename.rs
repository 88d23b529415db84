//! `renameat`: move a file to another name, replacing what was there.

use std::ffi::CString;

use io_uring::{opcode, squeue, types};

use super::{OpKind, neg_errno, res_to_io};

pub(crate) struct RenameAt {
    pub(crate) from: CString,
    pub(crate) to: CString,
}

impl OpKind for RenameAt {
    type Output = std::io::Result<()>;

    fn uring_sqe(&mut self) -> squeue::Entry {
        // A rename takes its directory's lock and writes the journal: io_uring runs it on its
        // workers whatever the flags say, so say so.
        opcode::RenameAt::new(
            types::Fd(libc::AT_FDCWD),
            self.from.as_ptr(),
            types::Fd(libc::AT_FDCWD),
            self.to.as_ptr(),
        )
        .build()
        .flags(squeue::Flags::ASYNC)
    }

    fn blocking_call(&mut self) -> i32 {
        // SAFETY: both paths are NUL-terminated strings owned by self.
        let r = unsafe {
            libc::renameat(
                libc::AT_FDCWD,
                self.from.as_ptr(),
                libc::AT_FDCWD,
                self.to.as_ptr(),
            )
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
