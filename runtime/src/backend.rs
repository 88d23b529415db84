//! Which IO backend a runtime uses, and why io_uring was not used when it was not.
//!
//! The probe runs once per process (`OnceLock`): it creates a small ring, asks the kernel which
//! opcodes it supports, and records a [`FallbackReason`] when anything needed is missing. The
//! environment variable `INSITUBATCH_IO=uring|threads` overrides the choice.

use std::fmt;
use std::sync::OnceLock;

use io_uring::{IoUring, Probe, opcode};

/// Environment variable that forces a backend: `uring` or `threads`.
pub const IO_ENV: &str = "INSITUBATCH_IO";

/// The IO backend of a runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoBackend {
    /// One io_uring ring per executor thread, many operations in flight.
    Uring,
    /// Blocking system calls on a bounded pool of IO threads.
    Threads,
}

impl IoBackend {
    /// Lower-case name as accepted by `INSITUBATCH_IO`.
    pub fn name(self) -> &'static str {
        match self {
            IoBackend::Uring => "uring",
            IoBackend::Threads => "threads",
        }
    }
}

impl fmt::Display for IoBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the caller asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoBackendChoice {
    /// io_uring when the probe succeeds, the thread fallback otherwise. `INSITUBATCH_IO` overrides.
    #[default]
    Auto,
    /// io_uring or an error naming why it is unavailable.
    Uring,
    /// The blocking-thread fallback.
    Threads,
}

/// Why io_uring was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// `INSITUBATCH_IO=threads` (or an explicit choice) asked for the fallback.
    Forced,
    /// The kernel has no io_uring (`ENOSYS`: built without it or older than 5.1).
    NotSupported,
    /// `io_uring_setup` was refused with `EPERM`: a seccomp profile (most container runtimes)
    /// or a policy module blocks it.
    Seccomp,
    /// The `kernel.io_uring_disabled` sysctl is set (value given).
    Sysctl(u32),
    /// `ENOMEM` creating the ring: `RLIMIT_MEMLOCK` is too low on kernels that charge rings to it.
    Memlock,
    /// The kernel lacks an opcode we need (name given).
    MissingOpcode(&'static str),
    /// Anything else (the OS error is given).
    Other(String),
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::Forced => {
                write!(f, "forced by {IO_ENV}=threads or the runtime builder")
            }
            FallbackReason::NotSupported => {
                write!(f, "io_uring is not supported by this kernel (ENOSYS)")
            }
            FallbackReason::Seccomp => write!(
                f,
                "io_uring_setup was refused (EPERM): a seccomp profile or security module blocks it"
            ),
            FallbackReason::Sysctl(v) => {
                write!(
                    f,
                    "io_uring is disabled by sysctl kernel.io_uring_disabled={v}"
                )
            }
            FallbackReason::Memlock => write!(
                f,
                "io_uring ring allocation failed (ENOMEM): RLIMIT_MEMLOCK is too low; raise `ulimit -l`"
            ),
            FallbackReason::MissingOpcode(op) => {
                write!(f, "the kernel's io_uring lacks the {op} opcode")
            }
            FallbackReason::Other(e) => write!(f, "io_uring setup failed: {e}"),
        }
    }
}

/// Result of the once-per-process probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// `None` when io_uring is usable.
    pub unavailable: Option<FallbackReason>,
    /// The ring can rename (`IORING_OP_RENAMEAT`, Linux 5.11); without it a rename on an
    /// io_uring executor is a system call on the executor thread.
    pub renameat: bool,
    /// The ring can unlink (`IORING_OP_UNLINKAT`, Linux 5.11); without it an unlink on an
    /// io_uring executor is a system call on the executor thread.
    pub unlinkat: bool,
}

/// Opcodes the uring driver submits; a kernel without one of them falls back.
const REQUIRED_OPCODES: [(u8, &str); 7] = [
    (opcode::Read::CODE, "READ"),
    (opcode::Write::CODE, "WRITE"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::OpenAt::CODE, "OPENAT"),
    (opcode::Statx::CODE, "STATX"),
    (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
    (opcode::Nop::CODE, "NOP"),
];

/// Probes io_uring once per process and returns the cached report.
pub fn probe() -> &'static ProbeReport {
    static REPORT: OnceLock<ProbeReport> = OnceLock::new();
    REPORT.get_or_init(|| match probe_uncached() {
        Ok(probe) => ProbeReport {
            unavailable: None,
            renameat: probe.is_supported(opcode::RenameAt::CODE),
            unlinkat: probe.is_supported(opcode::UnlinkAt::CODE),
        },
        Err(reason) => ProbeReport {
            unavailable: Some(reason),
            renameat: false,
            unlinkat: false,
        },
    })
}

fn sysctl_disabled() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok()?;
    let v: u32 = text.trim().parse().ok()?;
    (v != 0).then_some(v)
}

/// The kernel's answer to which opcodes its io_uring has, or why io_uring cannot be used.
fn probe_uncached() -> Result<Probe, FallbackReason> {
    let ring = match IoUring::new(8) {
        Ok(ring) => ring,
        Err(e) => {
            return Err(match e.raw_os_error() {
                Some(libc::ENOSYS) => FallbackReason::NotSupported,
                Some(libc::EPERM) => match sysctl_disabled() {
                    Some(v) => FallbackReason::Sysctl(v),
                    None => FallbackReason::Seccomp,
                },
                Some(libc::ENOMEM) => FallbackReason::Memlock,
                _ => FallbackReason::Other(e.to_string()),
            });
        }
    };
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| FallbackReason::Other(format!("IORING_REGISTER_PROBE: {e}")))?;
    for (code, name) in REQUIRED_OPCODES {
        if !probe.is_supported(code) {
            return Err(FallbackReason::MissingOpcode(name));
        }
    }
    Ok(probe)
}

/// Reads `INSITUBATCH_IO`. An unknown value is an error naming the variable and the accepted values.
pub fn env_choice() -> Result<Option<IoBackendChoice>, String> {
    match std::env::var(IO_ENV) {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Some(IoBackendChoice::Auto)),
            "uring" | "io_uring" => Ok(Some(IoBackendChoice::Uring)),
            "threads" | "thread" => Ok(Some(IoBackendChoice::Threads)),
            other => Err(format!(
                "{IO_ENV}={other:?} is not a backend: use `uring`, `threads` or `auto`"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_cached_and_reason_displays() {
        let a = probe() as *const _;
        let b = probe() as *const _;
        assert_eq!(a, b);
        for r in [
            FallbackReason::Forced,
            FallbackReason::NotSupported,
            FallbackReason::Seccomp,
            FallbackReason::Sysctl(2),
            FallbackReason::Memlock,
            FallbackReason::MissingOpcode("STATX"),
        ] {
            assert!(!r.to_string().is_empty());
        }
        assert!(
            FallbackReason::Sysctl(2)
                .to_string()
                .contains("io_uring_disabled=2")
        );
    }
}
