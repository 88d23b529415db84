//! How much memory this process may use, so that a plan too big for it is an error naming the
//! knob rather than a process killed halfway through an epoch: the least of the machine's
//! (`MemTotal`), its cgroup's limit on the way to the root (v2 `memory.max`, v1
//! `memory.limit_in_bytes`: a SLURM job or a container) and its address-space limit
//! (`RLIMIT_AS`, `ulimit -v`).

use std::path::{Path, PathBuf};

/// The binding limit and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// Which limit binds.
    pub source: MemorySource,
}

/// Where a [`MemoryLimit`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// The machine's memory (`MemTotal`).
    Machine,
    /// The process's cgroup (a batch job's or a container's memory limit).
    Cgroup,
    /// The address-space limit (`ulimit -v`).
    AddressSpace,
    /// `memory_limit_bytes`, given to the dataset: the share of the process's memory the
    /// library may take, leaving the rest to its host (a model, a simulation).
    Given,
}

impl MemoryLimit {
    /// The lower of this process's limit and `given` (`memory_limit_bytes`), if either.
    pub fn with_given(process: Option<MemoryLimit>, given: Option<u64>) -> Option<MemoryLimit> {
        let given = given.map(|bytes| MemoryLimit {
            bytes,
            source: MemorySource::Given,
        });
        match (process, given) {
            (Some(p), Some(g)) if p.bytes < g.bytes => Some(p),
            (p, g) => g.or(p),
        }
    }
}

impl MemorySource {
    /// How the JSON reports it: `machine`, `cgroup`, `ulimit -v` or `memory_limit_bytes`.
    pub fn name(&self) -> &'static str {
        match self {
            MemorySource::Machine => "machine",
            MemorySource::Cgroup => "cgroup",
            MemorySource::AddressSpace => "ulimit -v",
            MemorySource::Given => "memory_limit_bytes",
        }
    }
}

impl std::fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.bytes;
        match self.source {
            MemorySource::Machine => write!(f, "this machine's {b} bytes of memory"),
            MemorySource::Cgroup => write!(
                f,
                "the {b}-byte memory limit of this process's cgroup (its job or container)"
            ),
            MemorySource::AddressSpace => {
                write!(f, "this process's {b}-byte address-space limit (ulimit -v)")
            }
            MemorySource::Given => write!(f, "the {b} bytes of memory_limit_bytes"),
        }
    }
}

/// The memory this process may use (read once per process), if anything says.
pub fn memory_limit() -> Option<MemoryLimit> {
    static LIMIT: std::sync::OnceLock<Option<MemoryLimit>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
        [
            machine_memory().map(|b| (b, MemorySource::Machine)),
            cgroup.map(|b| (b, MemorySource::Cgroup)),
            address_space_limit().map(|b| (b, MemorySource::AddressSpace)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|(b, _)| *b)
        .map(|(bytes, source)| MemoryLimit { bytes, source })
    })
}

/// `MemTotal` of `/proc/meminfo`.
fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `RLIMIT_AS`, unless unlimited (read each call: no allocation, safe before `main`).
pub fn address_space_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live one.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0;
    (ok && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// The least memory limit set on the cgroups of `proc_cgroup` (the text of `/proc/self/cgroup`)
/// and their ancestors, under `root` (`/sys/fs/cgroup`): v2 `memory.max`, v1
/// `memory/…/memory.limit_in_bytes`. "max" and v1's page-rounded `i64::MAX` mean none.
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir: PathBuf = base.join(path.trim_start_matches('/'));
        loop {
            let value = std::fs::read_to_string(dir.join(file)).ok();
            if let Some(n) = value.and_then(|v| v.trim().parse::<u64>().ok())
                && n < 1 << 62
            {
                least = Some(least.map_or(n, |l| l.min(n)));
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    least
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_least_cgroup_limit_on_the_way_to_the_root_binds() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // v2: the job's own cgroup says "max", its parent (the job's allocation) 8 GiB.
        write(&r.join("slurm/job_7/step_0/memory.max"), "max\n");
        write(&r.join("slurm/job_7/memory.max"), "8589934592\n");
        assert_eq!(cgroup_limit("0::/slurm/job_7/step_0\n", r), Some(8 << 30));
        // v1: a container limited to 2 GiB; unlimited reads as i64::MAX rounded to a page.
        write(
            &r.join("memory/docker/abc/memory.limit_in_bytes"),
            "2147483648\n",
        );
        write(
            &r.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let v1 = "12:pids:/docker/abc\n4:cpu,memory:/docker/abc\n";
        assert_eq!(cgroup_limit(v1, r), Some(2 << 30));
        // No limit anywhere, or no such files: none.
        assert_eq!(cgroup_limit("4:memory:/\n", r), None);
        assert_eq!(cgroup_limit("0::/elsewhere\n", r), None);
        assert_eq!(cgroup_limit("garbage", r), None);
    }

    #[test]
    fn the_limit_says_where_it_comes_from() {
        let l = |source| MemoryLimit { bytes: 5, source }.to_string();
        assert!(l(MemorySource::Machine).contains("machine"));
        assert!(l(MemorySource::Cgroup).contains("cgroup"));
        assert!(l(MemorySource::AddressSpace).contains("ulimit -v"));
        let here = memory_limit().expect("/proc/meminfo is readable on Linux");
        assert!(here.bytes > 0);
    }
}
