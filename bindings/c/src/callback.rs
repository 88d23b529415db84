//! Chunk transforms written outside Rust: C function pointers the decoder calls on each decoded
//! chunk (`isb_dataset_open_with_transforms`), the Python shim's `transforms.Function` among
//! them. This is the slow path the brief allows beside the built-ins: a callback holds its
//! executor thread for as long as it runs, and Python's run one at a time under the GIL.

use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use insitubatch::DType;
use insitubatch::transform::{Chunk, ChunkTransform};
use serde::{Deserialize, Serialize};

/// One chunk as a callback sees it: the input or the output to fill.
#[repr(C)]
pub struct IsbChunk {
    /// The array's path (NUL-terminated UTF-8).
    pub array: *const c_char,
    /// The chunk's index along the sample axis: its first row is sample `index * shape[0]`.
    pub index: u64,
    /// Entries in `shape`: 1 + the number of inner axes.
    pub ndim: usize,
    /// `[samples_per_chunk, *inner_shape]`, sample axis first.
    pub shape: *const u64,
    /// The element type's name (`"float32"`, `"int16"`, ...; NUL-terminated).
    pub dtype: *const c_char,
    /// The elements, C order, native-endian.
    pub data: *mut c_void,
    /// Bytes at `data`.
    pub nbytes: usize,
}

/// A chunk transform: reads `input`, writes `output` (whose shape and type are the ones the
/// config entry declared; `output->data == input->data` when they are the input's, and the
/// transform then runs in place). `input->data` is the decoder's own buffer, discarded
/// afterwards unless it is the output: a transform may use it as scratch. Returns 0, or anything else with a message of at most
/// `message_len` bytes (NUL included) written to `message`. Called from the library's executor
/// threads, several at once: it must be thread-safe, and must not call back into this library.
pub type IsbTransformFn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        input: *const IsbChunk,
        output: *const IsbChunk,
        message: *mut c_char,
        message_len: usize,
    ) -> i32,
>;

/// Called with the callback's `user_data`: as `release`, once when the library no longer needs
/// it; as `thread_exit`, on a library thread that ran `apply`, as that thread ends.
pub type IsbReleaseFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// A callback chunk transform, referred to by its position from the config's
/// `{"type": "callback", "callback": <position>, ...}` entries.
#[repr(C)]
pub struct IsbTransformCallback {
    /// The transform (required).
    pub apply: IsbTransformFn,
    /// Releases `user_data` (may be NULL).
    pub release: IsbReleaseFn,
    /// Passed to `apply`, `release` and `thread_exit` as they were given.
    pub user_data: *mut c_void,
    /// Called on each library thread that ran `apply`, once, as the thread ends (before
    /// `release`), for a host that keeps state per thread: the Python shim keeps each thread's
    /// interpreter state between calls and frees it here. May be NULL.
    pub thread_exit: IsbReleaseFn,
}

/// Closed by `isb_callbacks_shutdown`: from then on no callback (and no release) is called.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Callbacks and releases running now.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Entry to a callback: `None` once callbacks are shut down. Counted before the flag is read,
/// and the shutdown sets the flag before it reads the count (both sequentially consistent),
/// so a shutdown that saw no call running sees none start after it.
struct Running;

impl Running {
    fn enter() -> Option<Self> {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        if CLOSED.load(Ordering::SeqCst) {
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Self)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Stops every callback transform of the process, waiting up to `timeout` for those running
/// to return. Afterwards a chunk that needs one fails its pass, and no `release` is called.
/// `false` when some were still running at the deadline.
pub(crate) fn shut_down(timeout: Duration) -> bool {
    CLOSED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + timeout;
    while RUNNING.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// A caller's callback, owned from the moment the library is given it: `release` runs once,
/// when the last transform made from it is dropped (or at once, when opening fails).
pub(crate) struct Callback {
    apply: IsbTransformFn,
    release: IsbReleaseFn,
    thread_exit: IsbReleaseFn,
    user_data: *mut c_void,
}

// SAFETY: the contract of `isb_dataset_open_with_transforms`: callbacks are thread-safe, and
// `user_data` is theirs to share between threads.
unsafe impl Send for Callback {}
// SAFETY: as above.
unsafe impl Sync for Callback {}

impl Callback {
    pub(crate) fn has_apply(&self) -> bool {
        self.apply.is_some()
    }

    pub(crate) fn new(c: &IsbTransformCallback) -> Arc<Self> {
        Arc::new(Self {
            apply: c.apply,
            release: c.release,
            thread_exit: c.thread_exit,
            user_data: c.user_data,
        })
    }

    /// Notes that this callback ran on the current thread, so that its `thread_exit` runs when
    /// the thread ends (the thread holds the callback until then).
    fn ran_on_this_thread(self: &Arc<Self>) {
        if self.thread_exit.is_none() {
            return;
        }
        // During the thread's own teardown the list is gone; nothing is kept then.
        let _ = RAN_HERE.try_with(|ran| {
            let mut ran = ran.0.borrow_mut();
            if !ran.iter().any(|c| Arc::ptr_eq(c, self)) {
                ran.push(Arc::clone(self));
            }
        });
    }
}

/// The callbacks with a `thread_exit` that ran on this thread. Executor threads belong to one
/// dataset's runtime, so this holds that dataset's callbacks only, and their `release` waits
/// for the runtime's threads to end (which `isb_dataset_free` and the last iteration's end do).
struct RanHere(std::cell::RefCell<Vec<Arc<Callback>>>);

impl Drop for RanHere {
    fn drop(&mut self) {
        for c in self.0.get_mut().drain(..) {
            if let (Some(exit), Some(_running)) = (c.thread_exit, Running::enter()) {
                // SAFETY: the caller's function with the caller's pointer, on a thread that ran
                // `apply`, once for this thread.
                unsafe { exit(c.user_data) };
            }
        }
    }
}

thread_local! {
    static RAN_HERE: RanHere = const { RanHere(std::cell::RefCell::new(Vec::new())) };
}

impl Drop for Callback {
    fn drop(&mut self) {
        if let (Some(release), Some(_running)) = (self.release, Running::enter()) {
            // SAFETY: the caller's function with the caller's pointer, called once.
            unsafe { release(self.user_data) };
        }
    }
}

/// A config entry `{"type": "callback", "callback": i, "identity", "shape", "dtype"}`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// The position of the callback in the array the caller passed.
    callback: usize,
    /// What the caller says the function is; the cache fingerprint. Required with `persist`.
    #[serde(default)]
    identity: Option<String>,
    /// The inner shape of a sample afterwards (default: unchanged).
    #[serde(default)]
    shape: Option<Vec<u64>>,
    /// The element type afterwards (default: unchanged).
    #[serde(default)]
    dtype: Option<DType>,
}

/// A chunk transform that calls a caller's function.
pub(crate) struct CallbackTransform {
    callback: Arc<Callback>,
    params: Params,
}

impl fmt::Debug for CallbackTransform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.identity())
    }
}

impl CallbackTransform {
    /// Parses an entry (its fields but `type` and `applies`) against the callbacks given.
    /// `persist`: the cache outlives the run, so the entry must say what the function is.
    pub(crate) fn from_json(
        params: serde_json::Value,
        callbacks: &[Arc<Callback>],
        persist: bool,
    ) -> Result<Self, String> {
        let params: Params = serde_json::from_value(params).map_err(|e| e.to_string())?;
        let Some(callback) = callbacks.get(params.callback) else {
            return Err(format!(
                "`callback` {} is not a position in the {} callback(s) given; callback entries \
                 need isb_dataset_open_with_transforms and its array of callbacks",
                params.callback,
                callbacks.len()
            ));
        };
        match &params.identity {
            Some(id) if id.trim().is_empty() => {
                return Err("`identity` is empty: say what the function is".into());
            }
            None if persist => {
                return Err(
                    "a persisted cache needs each callback's `identity` (a name and a \
                            version you change whenever the function's output would): it is \
                            the cache fingerprint of the arrays the callback applies to"
                        .into(),
                );
            }
            _ => {}
        }
        if params.shape.as_ref().is_some_and(|s| s.contains(&0)) {
            return Err("`shape` has an axis of length 0".into());
        }
        Ok(Self {
            callback: Arc::clone(callback),
            params,
        })
    }

    fn output_format(&self, inner: &[u64], dtype: DType) -> (Vec<u64>, DType) {
        (
            self.params.shape.clone().unwrap_or_else(|| inner.to_vec()),
            self.params.dtype.unwrap_or(dtype),
        )
    }
}

impl ChunkTransform for CallbackTransform {
    fn kind(&self) -> &'static str {
        "callback"
    }

    fn identity(&self) -> String {
        // The caller's identity and the declared format; without an identity (no persisted
        // cache) the callback's position stands in.
        let json = serde_json::to_string(&self.params).expect("parameters serialise");
        format!("callback{json}")
    }

    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        // A NULL `apply` is refused when the dataset is opened, before any transform is made.
        Ok(self.output_format(inner_shape, dtype))
    }

    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        let apply = self
            .callback
            .apply
            .ok_or("its `apply` function pointer is NULL")?;
        let Some(_running) = Running::enter() else {
            return Err(
                "callback transforms were shut down (isb_callbacks_shutdown: the host \
                        is exiting)"
                    .into(),
            );
        };
        self.callback.ran_on_this_thread();
        let (inner, dtype) = self.output_format(&chunk.shape[1..], chunk.dtype);
        let mut shape = vec![chunk.shape[0]];
        shape.extend(&inner);
        let in_place = shape == chunk.shape && dtype == chunk.dtype;
        let nbytes = shape.iter().product::<u64>() as usize * dtype.size_bytes();
        let mut out = if in_place {
            Vec::new()
        } else {
            vec![0u8; nbytes]
        };
        let array = CString::new(chunk.array.as_str()).map_err(|e| e.to_string())?;
        let in_dtype = CString::new(chunk.dtype.name()).expect("no NUL");
        let out_dtype = CString::new(dtype.name()).expect("no NUL");
        let input = IsbChunk {
            array: array.as_ptr(),
            index: chunk.index,
            ndim: chunk.shape.len(),
            shape: chunk.shape.as_ptr(),
            dtype: in_dtype.as_ptr(),
            data: chunk.bytes.as_mut_ptr().cast(),
            nbytes: chunk.bytes.len(),
        };
        let output = IsbChunk {
            ndim: shape.len(),
            shape: shape.as_ptr(),
            dtype: out_dtype.as_ptr(),
            data: if in_place {
                input.data
            } else {
                out.as_mut_ptr().cast()
            },
            nbytes,
            ..input
        };
        let mut message = [0 as c_char; 1024];
        // SAFETY: the caller's function, with pointers valid for the call: the chunk's bytes
        // (and the output buffer) of the sizes given, the shapes, NUL-terminated names, and a
        // message buffer of the length given.
        let rc = unsafe {
            apply(
                self.callback.user_data,
                &input,
                &output,
                message.as_mut_ptr(),
                message.len(),
            )
        };
        if rc != 0 {
            let last = message.len() - 1;
            message[last] = 0;
            // SAFETY: NUL-terminated by the line above at the latest.
            let said = unsafe { CStr::from_ptr(message.as_ptr()) }.to_string_lossy();
            return Err(if said.is_empty() {
                format!("the callback returned {rc} without a message")
            } else {
                format!("the callback returned {rc}: {said}")
            });
        }
        if !in_place {
            chunk.bytes = out;
            chunk.shape = shape;
            chunk.dtype = dtype;
        }
        Ok(())
    }
}
