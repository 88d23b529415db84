//! `statx` on an open descriptor: size and file type.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use super::{OpKind, neg_errno, res_to_io};

/// What we need to know about an open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// Size in bytes.
    pub len: u64,
    /// True for a directory.
    pub is_dir: bool,
    /// True for a regular file.
    pub is_file: bool,
}

impl FileStat {
    pub(crate) fn from_statx(st: &libc::statx) -> Self {
        let mode = u32::from(st.stx_mode) & libc::S_IFMT;
        FileStat {
            len: st.stx_size,
            is_dir: mode == libc::S_IFDIR,
            is_file: mode == libc::S_IFREG,
        }
    }
}

pub(crate) struct Statx {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) buf: Box<libc::statx>,
}

pub(crate) const EMPTY_PATH: &std::ffi::CStr = c"";

impl OpKind for Statx {
    type Output = std::io::Result<FileStat>;

    fn uring_sqe(&mut self) -> squeue::Entry {
        let buf: *mut libc::statx = &mut *self.buf;
        opcode::Statx::new(
            types::Fd(self.fd.as_raw_fd()),
            EMPTY_PATH.as_ptr(),
            buf.cast(),
        )
        .flags(libc::AT_EMPTY_PATH)
        .mask(libc::STATX_TYPE | libc::STATX_SIZE)
        .build()
    }

    fn blocking_call(&mut self) -> i32 {
        // SAFETY: `buf` is a live statx struct; the path is the empty C string with AT_EMPTY_PATH.
        let r = unsafe {
            libc::statx(
                self.fd.as_raw_fd(),
                EMPTY_PATH.as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_TYPE | libc::STATX_SIZE,
                &mut *self.buf,
            )
        };
        if r < 0 { neg_errno() } else { 0 }
    }

    fn complete(self, res: i32) -> Self::Output {
        res_to_io(res)?;
        Ok(FileStat::from_statx(&self.buf))
    }

    fn fail(self, err: std::io::Error) -> Self::Output {
        Err(err)
    }
}
