//! Shared helpers for the cross-crate tests in `tests/tests/`: zarr-python fixtures written at
//! test time, and reference arrays to compare against.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The message a panic carried (its `String` or `&str` payload; empty for another), for a
/// test that catches a case's panic to name the case.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// SplitMix64: small, seedable, and good enough to pick test shapes (the random engine cases,
/// the metadata fuzz).
pub struct Rng(u64);

impl Rng {
    /// A generator for case `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Directory holding the conformance fixtures, written once per fixture-script version by
/// zarr-python (`tests/fixtures/make_fixtures.py`). Concurrent test processes share it: the
/// first takes an exclusive lock and writes into a temporary directory that is renamed into
/// place; the others wait on the lock.
pub fn fixtures_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("fixtures/make_fixtures.py");
    let text = std::fs::read(&script).expect("read make_fixtures.py");
    let hash = text.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    });
    let base = root.join("../target/zarr-fixtures");
    std::fs::create_dir_all(&base).expect("create target/zarr-fixtures");
    let dir = base.join(format!("{hash:016x}"));
    if dir.join("manifest.json").exists() {
        return dir;
    }
    let lock = std::fs::File::create(base.join(".lock")).expect("create fixture lock");
    lock_exclusive(&lock);
    if !dir.join("manifest.json").exists() {
        let tmp = base.join(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&python).arg(&script).arg(&tmp).output().unwrap_or_else(|e| {
            panic!("cannot run {python} to write Zarr fixtures ({e}); install Python 3 and `pip install -r requirements-test.txt`")
        });
        assert!(
            out.status.success(),
            "writing Zarr fixtures with zarr-python failed; run `pip install -r requirements-test.txt`.\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &dir).expect("move fixtures into place");
    }
    dir
}

fn lock_exclusive(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock fixture lock");
}

/// One array of the fixture manifest.
#[derive(Clone, Debug)]
pub struct FixtureArray {
    /// Case name.
    pub case: String,
    /// Store directory.
    pub store: PathBuf,
    /// Array path inside the store (`""` for a root array).
    pub array: String,
    /// zarr-python's read of the whole array.
    pub reference: Vec<u8>,
    /// Its shape.
    pub shape: Vec<u64>,
    /// numpy dtype name.
    pub dtype: String,
    /// The raw manifest entry.
    pub entry: Value,
}

/// Every fixture array.
pub fn fixture_arrays() -> Vec<FixtureArray> {
    let dir = fixtures_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| FixtureArray {
            case: c["case"].as_str().unwrap().to_string(),
            store: dir.join(c["store"].as_str().unwrap()),
            array: c["array"].as_str().unwrap().to_string(),
            reference: std::fs::read(dir.join(c["ref"].as_str().unwrap())).unwrap(),
            shape: c["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect(),
            dtype: c["dtype"].as_str().unwrap().to_string(),
            entry: c.clone(),
        })
        .collect()
}

/// Copies the part of a decoded chunk (`chunk_shape`, at grid `index`) that lies inside the
/// array out of the reference, and the same part out of the chunk; returns both as byte vectors.
pub fn chunk_region_pair(
    reference: &[u8],
    shape: &[u64],
    chunk: &[u8],
    chunk_shape: &[u64],
    index: &[u64],
    item: usize,
) -> (Vec<u8>, Vec<u8>) {
    let nd = shape.len();
    let start: Vec<u64> = index.iter().zip(chunk_shape).map(|(i, c)| i * c).collect();
    let extent: Vec<u64> = (0..nd)
        .map(|d| chunk_shape[d].min(shape[d] - start[d]))
        .collect();
    let mut want = Vec::new();
    let mut got = Vec::new();
    let total: u64 = extent.iter().product();
    for flat in 0..total {
        let mut rem = flat;
        let mut local = vec![0u64; nd];
        for d in (0..nd).rev() {
            local[d] = rem % extent[d];
            rem /= extent[d];
        }
        let (mut a_off, mut c_off) = (0u64, 0u64);
        for d in 0..nd {
            a_off = a_off * shape[d] + start[d] + local[d];
            c_off = c_off * chunk_shape[d] + local[d];
        }
        let (a, c) = (a_off as usize * item, c_off as usize * item);
        want.extend_from_slice(&reference[a..a + item]);
        got.extend_from_slice(&chunk[c..c + item]);
    }
    (want, got)
}

/// The bytes of sample `index` along physical axis `axis` of a C-order array of `shape`
/// (the field axes in physical order): what the engine must deliver for that sample.
pub fn sample_of(reference: &[u8], shape: &[u64], axis: usize, index: u64, item: usize) -> Vec<u8> {
    let outer: u64 = shape[..axis].iter().product();
    let inner: u64 = shape[axis + 1..].iter().product();
    let run = inner as usize * item;
    let mut out = Vec::with_capacity(outer as usize * run);
    for o in 0..outer {
        let start = ((o * shape[axis] + index) * inner) as usize * item;
        out.extend_from_slice(&reference[start..start + run]);
    }
    out
}

/// The window of `patch` over the last axes of a sample shaped `inner`, at `origin`, walked
/// element by element, indices taken modulo their axis (a window across the end of a periodic
/// axis continues from its start): the reference a patched row is checked against.
pub fn window_of(
    sample: &[u8],
    inner: &[usize],
    patch: &[usize],
    origin: &[usize],
    item: usize,
) -> Vec<u8> {
    let lead = inner.len() - patch.len();
    let row: Vec<usize> = inner[..lead].iter().chain(patch).copied().collect();
    let n: usize = row.iter().product();
    let mut out = Vec::with_capacity(n * item);
    for flat in 0..n {
        let (mut rem, mut at, mut stride) = (flat, 0, 1);
        for d in (0..row.len()).rev() {
            let k = rem % row[d];
            rem /= row[d];
            let o = if d >= lead { origin[d - lead] } else { 0 };
            at += (k + o) % inner[d] * stride;
            stride *= inner[d];
        }
        out.extend_from_slice(&sample[at * item..(at + 1) * item]);
    }
    out
}

/// Item size of a numpy dtype name used by the fixtures.
pub fn item_size(dtype: &str) -> usize {
    match dtype {
        "uint8" | "int8" | "bool" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        _ => 8,
    }
}

/// Threads of this process whose name starts with `prefix`.
pub fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with(prefix))
        .count()
}

/// `threads_named(prefix)` once it equals `want`, or its value after 2 s: a thread that has been
/// joined can stay listed in `/proc/self/task` for a moment while the kernel finishes its exit.
pub fn threads_named_settled(prefix: &str, want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let n = threads_named(prefix);
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `threads_named(prefix)` once it has not changed for 50 ms (at most 2 s): the count of
/// threads that stay, right after others were joined (a joined thread can stay listed for a
/// moment).
pub fn threads_named_stable(prefix: &str) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let (mut last, mut since) = (threads_named(prefix), std::time::Instant::now());
    loop {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let n = threads_named(prefix);
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        }
        if since.elapsed() >= std::time::Duration::from_millis(50)
            || std::time::Instant::now() > deadline
        {
            return last;
        }
    }
}

/// Copies the directory tree `from` into `to` (a store to damage without touching the
/// fixtures).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for e in std::fs::read_dir(from).expect("read the directory to copy") {
        let e = e.expect("directory entry");
        let dst = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).expect("copy a file");
        }
    }
}

/// A write lease on a file: while it is held, any other open of the file waits (until the lease
/// is dropped, or until the kernel breaks it after `/proc/sys/fs/lease-break-time`, 45 s by
/// default). It stands in for a store that stops answering.
pub struct Lease(std::fs::File);

impl Lease {
    /// Takes the lease on `path`, which nobody else may have open.
    pub fn take(path: &Path) -> Lease {
        use std::os::fd::AsRawFd;
        // A holder is told with SIGIO that an open waits; its default action ends the process.
        // SAFETY: installs the "ignore" disposition, which needs no handler code.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        let file = std::fs::File::open(path).expect("open the file to lease");
        // SAFETY: `file` is an open descriptor; F_SETLEASE takes an integer argument.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
        assert_eq!(
            r,
            0,
            "a write lease on {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Lease(file)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in `take`; closing the file below would release the lease too.
        unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

/// A plain HTTP server (`tests/fixtures/http_server.py`) over a directory, for the object-store
/// tests; stopped when dropped. It cannot list, as most static web servers cannot.
pub struct HttpServer {
    child: std::process::Child,
    /// The port it listens on at 127.0.0.1.
    pub port: u16,
}

impl HttpServer {
    /// Serves `dir`; a GET of a path under any of `fail` (relative to `dir`) answers 500.
    pub fn serve(dir: &Path, fail: &[&str]) -> Self {
        Self::start(dir, fail, None, true)
    }

    /// Serves `dir` like a server that ignores `Range` headers: every GET answers whole.
    pub fn serve_without_ranges(dir: &Path) -> Self {
        Self::start(dir, &[], None, false)
    }

    /// Serves `dir`, holding every response to a path under `prefix` for `delay` (counted in
    /// [`HttpServer::held_stats`]).
    pub fn serve_slow(dir: &Path, prefix: &str, delay: std::time::Duration) -> Self {
        Self::start(dir, &[], Some((prefix, delay)), true)
    }

    fn start(
        dir: &Path,
        fail: &[&str],
        slow: Option<(&str, std::time::Duration)>,
        ranges: bool,
    ) -> Self {
        use std::io::BufRead;
        use std::process::Stdio;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/http_server.py");
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut cmd = Command::new(&python);
        cmd.arg(&script).arg(dir);
        for f in fail {
            cmd.arg("--fail").arg(f);
        }
        if !ranges {
            cmd.arg("--no-ranges");
        }
        if let Some((prefix, delay)) = slow {
            cmd.arg("--slow")
                .arg(prefix)
                .arg("--delay-ms")
                .arg(delay.as_millis().to_string());
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python} {}: {e}", script.display()));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the server's port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("http_server.py printed {line:?}, not a port"));
        Self { child, port }
    }

    /// The URL of `path` (relative to the served directory).
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// Requests held so far (under the slow prefix): how many, how many of them the client
    /// abandoned (hung up before the answer), and how many were answered.
    pub fn held_stats(&self) -> (u64, u64, u64) {
        // A stats request can come back empty under load (the connection reset before the
        // answer, seen once in a full check run): ask again, a few times, before failing.
        let mut last = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            last = self.stats_response();
            if let Some(body) = last.split("\r\n\r\n").nth(1).filter(|b| b.contains('}')) {
                let v: Value = serde_json::from_str(body).expect("stats JSON");
                let get = |k: &str| v[k].as_u64().expect("a count");
                return (get("held"), get("abandoned"), get("answered"));
            }
        }
        panic!("the test server answered no stats in 5 attempts; last response: {last:?}");
    }

    /// One `GET /__stats` exchange, whatever arrived.
    fn stats_response(&self) -> String {
        use std::io::{Read, Write};
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        if conn
            .write_all(b"GET /__stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return String::new();
        }
        conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .ok();
        let mut text = String::new();
        // The server keeps the connection open after its answer: read what arrives, then stop.
        let mut buf = [0u8; 4096];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            if text.contains('}') {
                break;
            }
        }
        text
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
