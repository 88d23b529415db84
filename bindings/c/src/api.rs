//! The exported functions: geometries, splits, datasets, iterations and batches.

use std::ffi::{CStr, CString, c_char};
use std::sync::Arc;

use insitubatch::transform::ChunkTransforms;
use insitubatch::{
    Batch, DatasetBuilder, InSituDataset, IoBackendChoice, OnBadChunk, Origins, Pass, SampleBound,
    Snap, SplitManifest, StatisticsAccumulator, split_by_chunk, split_by_ranges,
};
use serde::Deserialize;

use crate::callback::{Callback, CallbackTransform, IsbTransformCallback};
use crate::dlpack::{self, DLManagedTensorVersioned};
use crate::status::{IsbError, IsbStatus, boundary, null};

/// Version of this ABI; the Python shim refuses a library whose version differs.
pub const ISB_ABI_VERSION: u32 = 23;

/// A dataset: a store, its variables, a split manifest and a chunk pool. Any thread.
pub struct IsbDataset {
    ds: InSituDataset,
    pid: u32,
}

/// One epoch over one split, used by one thread at a time (a second caller gets an error).
pub struct IsbIter {
    /// Locked by each call, so that two threads using one iteration at once get an error
    /// instead of a data race.
    state: std::sync::Mutex<IterState>,
    pid: u32,
    /// The names of a batch's arrays as C strings (each label's own, a stack's in place of
    /// its labels), made once and shared by every batch.
    labels: Arc<[CString]>,
}

struct IterState {
    pass: Pass,
    failed: Option<String>,
}

impl IsbIter {
    /// The iteration's state, or an error if another thread is inside a call on it.
    fn state(&self) -> Result<std::sync::MutexGuard<'_, IterState>, IsbError> {
        match self.state.try_lock() {
            Ok(st) => Ok(st),
            // A panic inside an earlier call was reported by it; the state is still whole.
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(IsbError::new(
                IsbStatus::IsbInvalidArgument,
                "this iteration is in use by another thread (an IsbIter is used by one thread \
                 at a time; give each thread its own, or serialise the calls)",
            )),
        }
    }
}

/// One batch: immutable; arrays are exported as DLPack tensors that keep it alive.
pub struct IsbBatch {
    batch: Arc<Batch>,
    labels: Arc<[CString]>,
}

fn invalid(message: impl Into<String>) -> IsbError {
    IsbError::new(IsbStatus::IsbInvalidArgument, message)
}

/// A NUL-terminated UTF-8 argument, or an error naming it.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn arg_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, IsbError> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: per the contract, NUL-terminated.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("`{what}` is not valid UTF-8")))
}

/// Hands `s` to the caller through `out_json` (a NULL one is an error naming it).
fn out_string(out_json: *mut *mut c_char, s: String) -> Result<IsbStatus, IsbError> {
    if out_json.is_null() {
        return Err(null("out_json"));
    }
    let c = CString::new(s).map_err(|_| IsbError::new(IsbStatus::IsbInternal, "NUL in output"))?;
    // SAFETY: checked non-NULL; the caller passed a writable `char**`.
    unsafe { *out_json = c.into_raw() };
    Ok(IsbStatus::IsbOk)
}

/// The body of an entry point that takes a store and its parameters as JSON (`what` names them
/// in errors) and answers with a JSON string in `*out_json`.
///
/// # Safety
/// `store` and `params_json` are NULL or NUL-terminated; `out_json` is NULL or writable; `err`
/// is NULL or writable.
unsafe fn store_query<P: serde::de::DeserializeOwned>(
    store: *const c_char,
    params_json: *const c_char,
    what: &str,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
    answer: impl FnOnce(&str, P) -> Result<String, IsbError>,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let store = unsafe { arg_str(store, "store") }?;
        // SAFETY: forwarded contract.
        let params = unsafe { arg_str(params_json, "params_json") }?;
        let p: P = parse_json(params, what)?;
        out_string(out_json, answer(store, p)?)
    })
}

fn same_process(pid: u32) -> Result<(), IsbError> {
    let me = std::process::id();
    if me != pid {
        return Err(IsbError::new(
            IsbStatus::IsbWrongProcess,
            format!(
                "this handle was opened in process {pid}, and this is process {me} (a child after \
                 fork?): its runtime threads do not exist here; open a new dataset in this process"
            ),
        ));
    }
    Ok(())
}

/// The ABI version (`ISB_ABI_VERSION` of the header this library was built with).
#[unsafe(no_mangle)]
pub extern "C" fn isb_abi_version() -> u32 {
    ISB_ABI_VERSION
}

/// Geometries of the data variables of the store at `store` (coordinates and 0-D arrays skipped)
/// as a JSON object keyed by array path: `shape`, `chunks`, `dtype`, `sample_axis`, `n_samples`,
/// `samples_per_chunk`, `inner_shape`. Free `*out_json` with `isb_string_free`.
///
/// # Safety
/// `store` is a NUL-terminated path; `out_json` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_open_geometries(
    store: *const c_char,
    sample_axis: u32,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let store = unsafe { arg_str(store, "store") }?;
        let geoms = insitubatch::geometries(store, None, sample_axis as usize)?;
        out_string(out_json, geometries_json(geoms))
    })
}

/// `json` parsed as `T`; an error names `what` and serde's reason (an unknown key by name), and
/// for a value of the wrong type also the key that holds it.
fn parse_json<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> Result<T, IsbError> {
    serde_json::from_str(json).map_err(|e| match bad_key::<T>(json, &e) {
        Some(key) => invalid(format!("{what}: `{key}`: {e}")),
        None => invalid(format!("{what}: {e}")),
    })
}

/// The top-level key whose value `T` refuses with the message of `e`: each key is tried on its
/// own (serde reports a bad value before it checks for missing keys, and without the position
/// `e` ends with). Only on the error path, once per key.
fn bad_key<T: serde::de::DeserializeOwned>(json: &str, e: &serde_json::Error) -> Option<String> {
    if e.classify() != serde_json::error::Category::Data {
        return None;
    }
    let serde_json::Value::Object(map) = serde_json::from_str(json).ok()? else {
        return None;
    };
    let message = e.to_string();
    map.into_iter().find_map(|(key, value)| {
        let alone = serde_json::Value::Object([(key.clone(), value)].into_iter().collect());
        let refused = serde_json::from_value::<T>(alone)
            .err()
            .is_some_and(|alone| {
                let reason = alone.to_string();
                reason.starts_with("invalid") && message.starts_with(&reason)
            });
        refused.then_some(key)
    })
}

fn geometries_json(
    geoms: std::collections::BTreeMap<String, insitubatch::ArrayGeometry>,
) -> String {
    let mut obj = serde_json::Map::new();
    for (path, g) in geoms {
        obj.insert(path, insitubatch::geometry_json(&g));
    }
    serde_json::Value::Object(obj).to_string()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GeometryParams {
    #[serde(default)]
    sample_axis: usize,
    #[serde(default)]
    storage_options: serde_json::Map<String, serde_json::Value>,
}

/// `isb_open_geometries` with parameters as JSON: `{"sample_axis": 0, "storage_options":
/// {"aws_endpoint": "http://minio:9000", ...}}` (both optional; the options configure an
/// object-store URL as in the dataset config, and are refused for a directory). Free
/// `*out_json` with `isb_string_free`. (ABI 4)
///
/// # Safety
/// `store` and `params_json` are NUL-terminated; `out_json` is writable; `err` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_open_geometries_with(
    store: *const c_char,
    params_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    let answer = |store: &str, p: GeometryParams| {
        let options = storage_options(p.storage_options)?;
        let geoms = insitubatch::geometries_with(store, None, p.sample_axis, &options)?;
        Ok(geometries_json(geoms))
    };
    // SAFETY: forwarded contract.
    unsafe {
        store_query(
            store,
            params_json,
            "geometry parameters",
            out_json,
            err,
            answer,
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CoordinateParams {
    array: String,
    bounds: std::collections::BTreeMap<String, (f64, f64)>,
    #[serde(default)]
    periodic: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    sample_axis: usize,
    #[serde(default)]
    storage_options: serde_json::Map<String, serde_json::Value>,
}

/// The field region of an array given in coordinate values (ABI 13). `params_json`:
/// `{"array": "t2m", "bounds": {"latitude": [72, 35], "longitude": [-25, 45]}, "periodic":
/// {"longitude": 360}, "sample_axis": 0, "storage_options": {...}}`: for each named dimension,
/// the run of indices whose values in its 1-D coordinate array (the array of that name beside
/// `array`) lie between the two ends, both included; a periodic dimension's range runs upward
/// from the first end to the second, across the seam if it must. `*out_json` gets `{"region":
/// [[start, end], ...], "wrap": bool}`, one half-open range per field axis in physical order
/// (whole where no bounds were given), ready for a view's `region` and `wrap`. Free it with
/// `isb_string_free`.
///
/// # Safety
/// `store` and `params_json` are NUL-terminated; `out_json` is writable; `err` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_coordinate_region(
    store: *const c_char,
    params_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    let answer = |store: &str, p: CoordinateParams| {
        if let Some(dim) = p.periodic.keys().find(|d| !p.bounds.contains_key(*d)) {
            return Err(invalid(format!(
                "coordinate region parameters: `periodic` names `{dim}`, which `bounds` does not \
                 give a range for"
            )));
        }
        let bounds: Vec<insitubatch::CoordinateBounds> = p
            .bounds
            .iter()
            .map(|(dim, &(start, stop))| insitubatch::CoordinateBounds {
                dim: dim.clone(),
                start,
                stop,
                period: p.periodic.get(dim).copied(),
            })
            .collect();
        let options = storage_options(p.storage_options)?;
        let r = insitubatch::coordinate_region(store, &p.array, p.sample_axis, &bounds, &options)?;
        Ok(serde_json::json!({"region": r.region, "wrap": r.wrap}).to_string())
    };
    let what = "coordinate region parameters";
    // SAFETY: forwarded contract.
    unsafe { store_query(store, params_json, what, out_json, err, answer) }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CoordinateValuesParams {
    array: String,
    #[serde(default)]
    dimension: Option<String>,
    #[serde(default)]
    sample_axis: usize,
    #[serde(default)]
    storage_options: serde_json::Map<String, serde_json::Value>,
}

/// The values of one dimension's coordinate array (ABI 14). `params_json`: `{"array": "t2m",
/// "dimension": "time", "sample_axis": 0, "storage_options": {...}}`, `dimension` defaulting
/// to the sample axis's: the 1-D array of that name beside `array`, read whole. `*out_json`
/// gets `{"dimension", "path", "dtype", "values": [...], "attributes": {...}}`: one value per
/// index, integers exactly (NaN or an infinity of a float coordinate as null), and the
/// coordinate array's attributes, whose `units` and `calendar` say what a time value means
/// (`"hours since 1900-01-01"`). With a batch's sample indices they give each sample's time.
/// Free it with `isb_string_free`.
///
/// # Safety
/// `store` and `params_json` are NUL-terminated; `out_json` is writable; `err` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_coordinate_values(
    store: *const c_char,
    params_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    let answer = |store: &str, p: CoordinateValuesParams| {
        let options = storage_options(p.storage_options)?;
        let dim = p.dimension.as_deref();
        let v = insitubatch::coordinate_values(store, &p.array, dim, p.sample_axis, &options)?;
        Ok(v.to_json().to_string())
    };
    let what = "coordinate values parameters";
    // SAFETY: forwarded contract.
    unsafe { store_query(store, params_json, what, out_json, err, answer) }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitParams {
    #[serde(default)]
    fractions: Option<Vec<f64>>,
    /// ABI 15: each split's range, `{"train": [0, 8760], "val": ["2016-01-01", "2017-01-01"]}`.
    #[serde(default)]
    ranges: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    snap: Option<String>,
    #[serde(default)]
    seed: u64,
    #[serde(default = "yes")]
    contiguous: bool,
    #[serde(default)]
    sample_range: Option<(u64, u64)>,
    #[serde(default)]
    sample_axis: usize,
    #[serde(default)]
    storage_options: serde_json::Map<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// Splits the sample-axis chunks of `array` (NULL: the first data variable) of `store` by
/// `params_json` — `{"fractions": [0.8, 0.1, 0.1], "seed": 0, "contiguous": true,
/// "sample_range": [start, stop], "sample_axis": 0, "storage_options": {...}}` (the options
/// for an object-store URL, ABI 4) — and returns the manifest JSON.
///
/// Instead of `fractions` (ABI 15), `"ranges": {"train": [0, 8760], "val": ["2016-01-01",
/// "2017-01-01"]}` gives each split a half-open range whose ends are sample indices or dates
/// on the array's time coordinate, and `"snap"` (`"exact"`, the default, `"inward"` or
/// `"outward"`) says what a bound inside a chunk does (`split_by_ranges`).
///
/// # Safety
/// `store` and `params_json` are NUL-terminated; `array` is NULL or NUL-terminated; `out_json`
/// is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_split_by_chunk(
    store: *const c_char,
    array: *const c_char,
    params_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let store = unsafe { arg_str(store, "store") }?;
        // SAFETY: forwarded contract.
        let params = unsafe { arg_str(params_json, "params_json") }?;
        let p: SplitParams = parse_json(params, "split parameters")?;
        let names = if array.is_null() {
            None
        } else {
            // SAFETY: forwarded contract.
            Some(vec![unsafe { arg_str(array, "array") }?.to_string()])
        };
        let options = storage_options(p.storage_options)?;
        let geoms = insitubatch::geometries_with(store, names.as_deref(), p.sample_axis, &options)?;
        let geom = geoms
            .values()
            .next()
            .ok_or_else(|| invalid("the store has no data variables"))?;
        let m = match (p.fractions, p.ranges) {
            (Some(fractions), None) if p.snap.is_none() => {
                split_by_chunk(geom, &fractions, p.seed, p.contiguous, p.sample_range)?
            }
            (None, Some(ranges)) if p.sample_range.is_none() && p.seed == 0 && p.contiguous => {
                let snap = Snap::parse(p.snap.as_deref().unwrap_or("exact"))?;
                let ranges = split_ranges(ranges)?;
                let ranges = insitubatch::sample_ranges(store, geom, &ranges, &options)?;
                let ranges: Vec<(&str, std::ops::Range<u64>)> = ranges
                    .iter()
                    .map(|(n, r)| (n.as_str(), r.clone()))
                    .collect();
                split_by_ranges(geom, &ranges, snap)?
            }
            (None, None) => {
                return Err(invalid(
                    "give `fractions` (of the chunks) or `ranges` (each split's samples)",
                ));
            }
            (Some(_), None) => return Err(invalid("`snap` goes with `ranges`, not `fractions`")),
            _ => {
                return Err(invalid(
                    "`ranges` replaces `fractions`, `seed`, `contiguous` and `sample_range`; \
                     give one way of splitting",
                ));
            }
        };
        out_string(out_json, m.to_json())
    })
}

/// The split parameters' `ranges`: each split's two ends, sample indices or dates.
fn split_ranges(
    ranges: serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<(String, SampleBound, SampleBound)>, insitubatch::EngineError> {
    let bound = |v: &serde_json::Value| match v {
        serde_json::Value::String(t) => Some(SampleBound::Time(t.clone())),
        v => v.as_u64().map(SampleBound::Index),
    };
    ranges
        .into_iter()
        .map(|(name, v)| {
            let ends = v.as_array().filter(|a| a.len() == 2);
            match ends.and_then(|a| Some((bound(&a[0])?, bound(&a[1])?))) {
                Some((a, b)) => Ok((name, a, b)),
                None => Err(insitubatch::EngineError::arg(
                    "ranges",
                    format!("{name}: {v}"),
                    "each split's range is [start, stop], each end a sample index (an integer \
                     >= 0) or a date (\"2016-01-01\")",
                )),
            }
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum VarConfig {
    Path(String),
    View {
        label: String,
        path: String,
        #[serde(default)]
        offset: i64,
        #[serde(default)]
        region: Option<Vec<(i64, i64)>>,
        #[serde(default)]
        wrap: bool,
        /// ABI 16: a static field (the array whole in every row).
        #[serde(default, rename = "static")]
        is_static: bool,
        /// ABI 17: the sample read at each anchor (an indexed variable).
        #[serde(default)]
        index: Option<Vec<u64>>,
    },
}

/// A view's region with a negative bound and no `wrap`, refused naming the view.
fn negative_bound(label: &str, region: &[(i64, i64)]) -> insitubatch::EngineError {
    insitubatch::EngineError::arg(
        "variables",
        label,
        format!(
            "the region {region:?} has a negative bound; a range across the end of a periodic \
             axis needs \"wrap\": true in the view"
        ),
    )
}

/// One entry of the config's `variables`.
fn var_config(v: serde_json::Value) -> Result<VarConfig, insitubatch::EngineError> {
    serde_json::from_value(v.clone()).map_err(|_| {
        insitubatch::EngineError::arg(
            "variables",
            v,
            "each entry is an array path (a string) or an object {\"label\": ..., \"path\": ..., \
             \"offset\": <integer>, \"region\": [[start, end], ...] (optional, one pair per field \
             axis), \"wrap\": <bool> (optional: ranges may wrap around the end of an axis), \
             \"static\": <bool> (optional: the array whole in every row), \"index\": [<integer>, \
             ...] (optional: the sample read at each anchor)}",
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DatasetConfig {
    store: String,
    /// Checked one by one (`var_config`), so that a bad entry gets a message naming it.
    #[serde(default)]
    variables: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    sample_axis: usize,
    #[serde(default)]
    manifest: Option<serde_json::Value>,
    batch_size: Option<usize>,
    block_chunks: Option<usize>,
    fast_first_batch: Option<bool>,
    /// ABI 21: start train's next epoch once this one has loaded every chunk it reads.
    prefetch_next_epoch: Option<bool>,
    /// ABI 15: every `sample_stride`-th sample from `sample_phase`.
    sample_stride: Option<u64>,
    sample_phase: Option<u64>,
    max_inflight: Option<usize>,
    prefetch_depth: Option<usize>,
    seed: Option<u64>,
    shuffle: Option<bool>,
    cache_budget_bytes: Option<u64>,
    memory_limit_bytes: Option<u64>,
    on_bad_chunk: Option<String>,
    executor_threads: Option<usize>,
    io_backend: Option<String>,
    cache_dir: Option<String>,
    persist: Option<bool>,
    reset_stale_cache: Option<bool>,
    readonly_cache: Option<bool>,
    cache_direct_io: Option<bool>,
    rank: Option<usize>,
    world_size: Option<usize>,
    even_train: Option<bool>,
    /// `true`/`false` for every split, or a list of split names.
    #[serde(default)]
    drop_last: Option<serde_json::Value>,
    /// Object-store options (strings, numbers or booleans by key); checked by `storage_options`.
    #[serde(default)]
    storage_options: serde_json::Map<String, serde_json::Value>,
    /// The built-in chunk transforms, as a JSON list (checked by the builder).
    #[serde(default)]
    chunk_transforms: Option<serde_json::Value>,
    /// Labels stacked as channels: `{"name": ["label", ...], ...}` (checked by `stacks`).
    #[serde(default)]
    stacks: Option<serde_json::Value>,
    /// ABI 16: stores mounted as groups, `{"targets": "path"}` (checked by `mounts`).
    #[serde(default)]
    mounts: Option<serde_json::Value>,
    /// ABI 19: a patch cut from every row, `[64, 64]` or `{"shape": [64, 64], "wrap": [false,
    /// true]}`; ABI 20: with `"per_sample": 4` or `"grid": true | [32, 32]` (checked by
    /// `patch`).
    #[serde(default)]
    patch: Option<serde_json::Value>,
}

/// One store of the config's `mounts`: its location, its own object-store options, and where
/// it sits on the root's sample axis.
struct MountConfig {
    name: String,
    store: String,
    storage_options: Vec<(String, String)>,
    align: Option<insitubatch::MountAlignment>,
}

/// The config's `mounts`: an object mapping each mount's name to its store's location, or to
/// `{"store": location, "storage_options": {...}, "align": "time" or k}`; anything else is
/// refused saying what it takes.
fn mounts(v: serde_json::Value) -> Result<Vec<MountConfig>, insitubatch::EngineError> {
    let bad = |v: &serde_json::Value| {
        insitubatch::EngineError::arg(
            "mounts",
            v,
            "is an object mapping each mount's name to a store location (a path or URL), or to \
             {\"store\": location, \"storage_options\": {...}, \"align\": ...}, such as \
             {\"targets\": \"/data/targets.zarr\"}; `align` (ABI 17) is the name of a \
             coordinate both stores have (\"time\"), {\"containing\": \"time\"} (every \
             anchor reads the sample before its time), {\"nearest\": \"time\"} (ABI 18: the \
             sample nearest its time), or the root's sample index where the mounted store \
             starts (an integer, negative when it starts earlier)",
        )
    };
    let serde_json::Value::Object(map) = &v else {
        return Err(bad(&v));
    };
    map.iter()
        .map(|(name, entry)| {
            let mut align = None;
            let (store, options) = match entry {
                serde_json::Value::String(s) => (s.clone(), serde_json::Map::new()),
                serde_json::Value::Object(o) => {
                    if o.keys()
                        .any(|k| !["store", "storage_options", "align"].contains(&k.as_str()))
                    {
                        return Err(bad(entry));
                    }
                    align = match o.get("align") {
                        None => None,
                        Some(serde_json::Value::String(dim)) if !dim.is_empty() => {
                            Some(insitubatch::MountAlignment::Coordinate(dim.clone()))
                        }
                        Some(serde_json::Value::Object(c)) if c.len() == 1 => {
                            match c.iter().next() {
                                Some((how, serde_json::Value::String(dim))) if !dim.is_empty() => {
                                    match how.as_str() {
                                        "containing" => Some(
                                            insitubatch::MountAlignment::Containing(dim.clone()),
                                        ),
                                        "nearest" => {
                                            Some(insitubatch::MountAlignment::Nearest(dim.clone()))
                                        }
                                        _ => return Err(bad(entry)),
                                    }
                                }
                                _ => return Err(bad(entry)),
                            }
                        }
                        Some(n) => match n.as_i64() {
                            Some(k) => Some(insitubatch::MountAlignment::Samples(k)),
                            None => return Err(bad(entry)),
                        },
                    };
                    let store = o
                        .get("store")
                        .and_then(|s| s.as_str())
                        .ok_or_else(|| bad(entry))?;
                    let options = match o.get("storage_options") {
                        None => serde_json::Map::new(),
                        Some(serde_json::Value::Object(m)) => m.clone(),
                        Some(_) => return Err(bad(entry)),
                    };
                    (store.to_string(), options)
                }
                _ => return Err(bad(entry)),
            };
            Ok(MountConfig {
                name: name.clone(),
                store,
                storage_options: storage_options(options)?,
                align,
            })
        })
        .collect()
}

/// The config's `patch`, read onto the builder: a list of extents (no axis periodic), or
/// `{"shape": [...], "wrap": [...], "per_sample": n, "grid": true | [...]}` (all but `shape`
/// optional); anything else is refused saying what it takes.
fn patch(
    b: DatasetBuilder,
    v: serde_json::Value,
) -> Result<DatasetBuilder, insitubatch::EngineError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Placed {
        shape: Vec<u64>,
        #[serde(default)]
        wrap: Option<Vec<bool>>,
        #[serde(default)]
        per_sample: Option<u64>,
        #[serde(default)]
        grid: Option<Grid>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Grid {
        Tiles(bool),
        Stride(Vec<u64>),
    }
    let bad = |v: &serde_json::Value| {
        insitubatch::EngineError::arg(
            "patch",
            v,
            "is a list of extents, one per patched axis (the samples' last axes), such as [64, \
             64], or {\"shape\": [64, 64], \"wrap\": [false, true], \"per_sample\": 4} where a \
             `wrap` flag makes its axis periodic and `per_sample` cuts that many patches from \
             each sample, or with \"grid\": true (or a stride, [32, 32]) tiling each field",
        )
    };
    if let Ok(shape) = serde_json::from_value::<Vec<u64>>(v.clone()) {
        return Ok(b.patch(shape));
    }
    let p: Placed = serde_json::from_value(v.clone()).map_err(|_| bad(&v))?;
    if p.per_sample.is_some() && !matches!(p.grid, None | Some(Grid::Tiles(false))) {
        return Err(insitubatch::EngineError::arg(
            "patch",
            &v,
            "has both `per_sample` and `grid`: patches are drawn at random (`per_sample` of \
             them) or tile each field on a grid; give one",
        ));
    }
    let wrap = p.wrap.unwrap_or_else(|| vec![false; p.shape.len()]);
    let mut b = b.patch_wrapping(p.shape.clone(), wrap);
    if let Some(n) = p.per_sample {
        b = b.patches_per_sample(n);
    }
    match p.grid {
        Some(Grid::Tiles(true)) => b = b.patch_grid(p.shape),
        Some(Grid::Stride(stride)) => b = b.patch_grid(stride),
        Some(Grid::Tiles(false)) | None => {}
    }
    Ok(b)
}

/// The config's `stacks`: an object mapping each stacked array's name to its labels, by
/// channel; anything else is refused saying what it takes.
fn stacks(v: serde_json::Value) -> Result<Vec<(String, Vec<String>)>, insitubatch::EngineError> {
    let bad = |v: &serde_json::Value| {
        insitubatch::EngineError::arg(
            "stacks",
            v,
            "is an object mapping each stacked array's name to a list of labels, its channels \
             in order, such as {\"x\": [\"t2m\", \"u10\"]}",
        )
    };
    let serde_json::Value::Object(map) = &v else {
        return Err(bad(&v));
    };
    map.iter()
        .map(|(name, labels)| {
            let list = labels.as_array().ok_or_else(|| bad(&v))?;
            let labels = list
                .iter()
                .map(|l| l.as_str().map(str::to_string).ok_or_else(|| bad(&v)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((name.clone(), labels))
        })
        .collect()
}

/// The config's `storage_options` as key/value strings: numbers and booleans are written out
/// (`{"aws_allow_http": true}` as `"true"`), anything else is refused naming the key.
fn storage_options(
    map: serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<(String, String)>, insitubatch::EngineError> {
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            serde_json::Value::Bool(_) | serde_json::Value::Number(_) => Ok((k, v.to_string())),
            other => Err(insitubatch::EngineError::arg(
                "storage_options",
                format!("{k}: {other}"),
                "each option's value is a string, a number or a boolean",
            )),
        })
        .collect()
}

/// The config's `chunk_transforms`: built-ins, and `callback` entries made from `callbacks`.
fn chunk_transforms(
    list: &serde_json::Value,
    callbacks: &[Arc<Callback>],
    persist: bool,
) -> Result<ChunkTransforms, insitubatch::EngineError> {
    let mut out = ChunkTransforms::default();
    out.extend_from_json_with(&list.to_string(), &["callback"], |_, params| {
        let t = CallbackTransform::from_json(params, callbacks, persist)?;
        Ok(Arc::new(t) as Arc<dyn insitubatch::ChunkTransform>)
    })?;
    Ok(out)
}

fn open_dataset(json: &str, callbacks: &[Arc<Callback>]) -> Result<InSituDataset, IsbError> {
    let c: DatasetConfig = parse_json(json, "dataset config")?;
    let mut b = InSituDataset::builder(&c.store).sample_axis(c.sample_axis);
    if c.variables.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(insitubatch::EngineError::arg(
            "variables",
            "[]",
            "list at least one array path or {\"label\", \"path\", \"offset\"} view, or omit \
             `variables` for every data variable",
        )
        .into());
    }
    for v in c.variables.unwrap_or_default() {
        let mut view = var_config(v)?;
        if let VarConfig::View {
            label,
            index: index @ Some(_),
            ..
        } = &mut view
        {
            b = b.index(label.clone(), index.take().unwrap_or_default());
        }
        b = match view {
            VarConfig::Path(p) => b.variable(p.clone(), p),
            VarConfig::View {
                label,
                path,
                offset,
                region,
                wrap,
                is_static: true,
                ..
            } => {
                if offset != 0 {
                    return Err(insitubatch::EngineError::arg(
                        "variables",
                        &label,
                        "a static field has no sample axis to shift along; leave out its offset",
                    )
                    .into());
                }
                match region {
                    None => b.static_variable(label, path),
                    Some(r) if wrap || r.iter().all(|&(lo, _)| lo >= 0) => {
                        b.cropped_static(label, path, &r)
                    }
                    Some(r) => return Err(negative_bound(&label, &r).into()),
                }
            }
            VarConfig::View {
                label,
                path,
                offset,
                region: None,
                ..
            } => b.window(label, path, offset),
            VarConfig::View {
                label,
                path,
                offset,
                region: Some(region),
                wrap: true,
                ..
            } => b.cropped_window_wrapping(label, path, offset, &region),
            VarConfig::View {
                label,
                path,
                offset,
                region: Some(region),
                wrap: false,
                ..
            } => {
                let Ok(plain) = region
                    .iter()
                    .map(|&(lo, hi)| Ok((u64::try_from(lo)?, u64::try_from(hi)?)))
                    .collect::<Result<Vec<(u64, u64)>, std::num::TryFromIntError>>()
                else {
                    return Err(negative_bound(&label, &region).into());
                };
                b.cropped_window(label, path, offset, &plain)
            }
        };
    }
    if let Some(m) = c.manifest {
        let m = SplitManifest::from_json(&m.to_string())?;
        b = b.manifest(m);
    }
    if let Some(n) = c.batch_size {
        b = b.batch_size(n);
    }
    if let Some(n) = c.block_chunks {
        b = b.block_chunks(n);
    }
    if let Some(yes) = c.fast_first_batch {
        b = b.fast_first_batch(yes);
    }
    if let Some(yes) = c.prefetch_next_epoch {
        b = b.prefetch_next_epoch(yes);
    }
    if c.sample_stride.is_some() || c.sample_phase.is_some() {
        b = b.sample_stride(c.sample_stride.unwrap_or(1), c.sample_phase.unwrap_or(0));
    }
    if let Some(n) = c.max_inflight {
        b = b.max_inflight(n);
    }
    if let Some(n) = c.prefetch_depth {
        b = b.prefetch_depth(n);
    }
    if let Some(n) = c.seed {
        b = b.seed(n);
    }
    if let Some(s) = c.shuffle {
        b = b.shuffle(s);
    }
    if let Some(n) = c.cache_budget_bytes {
        b = b.cache_budget_bytes(n);
    }
    if let Some(n) = c.memory_limit_bytes {
        b = b.memory_limit_bytes(n);
    }
    if let Some(p) = c.on_bad_chunk {
        b = b.on_bad_chunk(p.parse::<OnBadChunk>()?);
    }
    if let Some(d) = c.cache_dir {
        b = b.cache_dir(d);
    }
    b = b
        .persist(c.persist.unwrap_or(false))
        .reset_stale_cache(c.reset_stale_cache.unwrap_or(false))
        .readonly_cache(c.readonly_cache.unwrap_or(false))
        .cache_direct_io(c.cache_direct_io.unwrap_or(true));
    if c.rank.is_some() || c.world_size.is_some() {
        b = b.shard(c.rank.unwrap_or(0), c.world_size.unwrap_or(1));
    }
    b = b.even_train(c.even_train.unwrap_or(true));
    b = match c.drop_last {
        None | Some(serde_json::Value::Bool(false)) => b,
        Some(serde_json::Value::Bool(true)) => b.drop_last(true),
        Some(serde_json::Value::Array(list)) => {
            let names: Option<Vec<&str>> = list.iter().map(|n| n.as_str()).collect();
            let Some(names) = names else {
                return Err(insitubatch::EngineError::arg(
                    "drop_last",
                    serde_json::Value::Array(list.clone()),
                    "a list of drop_last holds split names (strings)",
                )
                .into());
            };
            b.drop_last_splits(&names)
        }
        Some(other) => {
            return Err(insitubatch::EngineError::arg(
                "drop_last",
                other,
                "is true, false or a list of split names such as [\"train\"]",
            )
            .into());
        }
    };
    for (k, v) in storage_options(c.storage_options)? {
        b = b.storage_option(k, v);
    }
    if let Some(t) = &c.chunk_transforms {
        b = b.chunk_transforms(&chunk_transforms(t, callbacks, c.persist == Some(true))?);
    }
    if let Some(v) = c.stacks {
        for (name, labels) in stacks(v)? {
            b = b.stack(name, labels);
        }
    }
    if let Some(v) = c.patch {
        b = patch(b, v)?;
    }
    if let Some(v) = c.mounts {
        for m in mounts(v)? {
            if let Some(align) = m.align {
                b = b.align_mount(&m.name, align);
            }
            b = b.mount_with(m.name, m.store, &m.storage_options);
        }
    }
    if let Some(n) = c.executor_threads {
        if n == 0 {
            return Err(invalid(
                "invalid argument `executor_threads` = 0: must be at least 1",
            ));
        }
        b = b.executor_threads(n);
    }
    if let Some(io) = c.io_backend {
        let choice = match io.as_str() {
            "auto" => IoBackendChoice::Auto,
            "uring" => IoBackendChoice::Uring,
            "threads" => IoBackendChoice::Threads,
            other => {
                return Err(invalid(format!(
                    "invalid argument `io_backend` = {other:?}: use \"auto\", \"uring\" or \"threads\""
                )));
            }
        };
        b = b.io_backend(choice);
    }
    Ok(b.build()?)
}

/// Opens a dataset from a JSON config: `store` (required), `variables` (array paths, or
/// `{"label", "path", "offset", "region", "wrap"}` views, `region` optional (ABI 8): `[[start,
/// end], ...]`, one half-open range per field axis in physical order, so that only the stored
/// chunks it touches are read; `wrap` (ABI 9, default false) lets a range run across the end of
/// a periodic axis, as `start < 0` or `end` past the axis length; `"static": true` (ABI 16)
/// makes the view a static field, the array whole (or its region, one range per axis of the
/// array) in every row, read once a pass, for orography or a land-sea mask beside sampled
/// variables (no offset; a dataset needs one sampled variable); `"index": [...]` (ABI 17)
/// makes the view read sample `index[anchor]` of its array at each anchor (one entry per
/// anchor: a climatology read at each sample's day of year; no offset, not static); default
/// every data variable), `sample_axis`, `manifest`
/// (a split manifest object; default every chunk in train), `batch_size`, `block_chunks`,
/// `fast_first_batch` (ABI 10, default false: each shuffled epoch's blocks ramp up from the
/// chunks of one batch, doubling up to `block_chunks`, so the first batch waits for those
/// alone; its first batches mix fewer chunks), `prefetch_next_epoch` (ABI 21, default false:
/// once a train iteration has loaded every chunk it reads, train's iteration at the next epoch
/// starts in the background and `isb_iter_start` hands it over when train is asked for at that
/// epoch), `sample_stride` and `sample_phase` (ABI 15,
/// default 1 and 0: draw every `sample_stride`-th sample from `sample_phase`, in every split;
/// chunks are still read whole, and one with no sample on the stride is not read),
/// `max_inflight`, `prefetch_depth`, `seed`,
/// `shuffle`, `cache_budget_bytes`,
/// `memory_limit_bytes` (the memory the library may hold in the process when an iteration of
/// this dataset starts; default all the process may use), `on_bad_chunk` (`"raise"` or
/// `"nan"`), `executor_threads`, `io_backend` (`"auto"`, `"uring"`, `"threads"`),
/// the NVMe tier: `cache_dir` (a directory on local NVMe), `persist`, `reset_stale_cache`,
/// `readonly_cache`, `cache_direct_io` (default true), and data-parallel ranks: `rank` and
/// `world_size` (default 0 and 1; each rank reads its share of every split, and `train` is
/// evened out so every rank takes the same number of steps unless `even_train` is false),
/// `drop_last` (default false: leave out an epoch's last batch when it would be short, so
/// every batch has `batch_size` rows; a split smaller than one batch is then an error; `true`
/// for every split, or (ABI 9) a list of split names such as `["train"]`),
/// `storage_options` (object-store configuration by key), `chunk_transforms` (a list of
/// built-in transforms such as `{"type": "affine", "offset": -273.15, "applies": ["t2m"]}`)
/// and `stacks` (ABI 14: `{"x": ["t2m", "u10"]}` stacks those labels as the channels of one
/// batch array `x`, shaped `(batch, 2, *sample_inner)`, written in place by the library; the
/// labels need one sample shape and dtype, and have no arrays of their own), and `mounts`
/// (ABI 16: `{"targets": "/data/targets.zarr"}` mounts that store as the group `targets`, so
/// its array `tp` is the variable path `"targets/tp"`; a value may also be `{"store":
/// location, "storage_options": {...}}`, the options that store's alone; for variables from
/// two stores on one sample axis, whose lengths along it must be equal unless the entry has
/// `"align"` (ABI 17): `"time"` matches the two stores' `time` coordinates, `{"containing":
/// "time"}` reads at every anchor the sample before its time, `{"nearest": "time"}` (ABI 18)
/// the sample nearest it, an integer `k` says the mounted store starts at the root's sample
/// `k`; see `align_mount`), and `patch` (ABI 19: `[64, 64]` cuts a window of that shape from
/// the last axes of every sample, at an origin drawn per row and shared by every label of the
/// row, so batch arrays are `(batch, *leading axes, 64, 64)`; origins move every epoch in
/// `train` and stay in the other splits; `isb_batch_patch_origins` says where each row was
/// cut; `{"shape": [64, 64], "wrap": [false, true]}` makes the second patched axis periodic,
/// so that a window may run across its end; ABI 20: `"per_sample": 4` in that object cuts four
/// patches from every sample, each a row of its own, and `"grid": true` tiles every field
/// with patches instead, `"grid": [32, 32]` at that stride, overlapping).
/// An unknown key is an error naming it. Free `*out` with `isb_dataset_free`.
///
/// # Safety
/// `config_json` is NUL-terminated; `out` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_open(
    config_json: *const c_char,
    out: *mut *mut IsbDataset,
    err: *mut *mut IsbError,
) -> IsbStatus {
    // SAFETY: forwarded contract; no callbacks.
    unsafe { isb_dataset_open_with_transforms(config_json, std::ptr::null(), 0, out, err) }
}

/// `isb_dataset_open` with chunk transforms written as C functions: `callbacks` is an array of
/// `n_callbacks`, and a config entry `{"type": "callback", "callback": i}` runs the `i`-th on
/// every chunk of the arrays in its scope, in list order with the built-ins. An entry may also
/// give `applies`, `shape` (the inner shape of a sample afterwards; default unchanged), `dtype`
/// (default unchanged) and `identity` (what the function is: the cache fingerprint; required
/// with `persist`). The library owns every `user_data` from this call on, whatever it returns:
/// each callback's `release` runs once, when the dataset and everything using it are gone, or
/// before this call returns if it fails. Callbacks run on the library's threads, several at
/// once; one that returns non-zero fails the pass with `ISB_TRANSFORM` and its message.
///
/// # Safety
/// As `isb_dataset_open`; `callbacks` points to `n_callbacks` entries (or is NULL when
/// `n_callbacks` is 0), each `apply` is thread-safe and valid until its `release` runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_open_with_transforms(
    config_json: *const c_char,
    callbacks: *const IsbTransformCallback,
    n_callbacks: usize,
    out: *mut *mut IsbDataset,
    err: *mut *mut IsbError,
) -> IsbStatus {
    // Owned first, so that `release` runs whatever happens below.
    let owned: Vec<Arc<Callback>> = if callbacks.is_null() || n_callbacks == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract, `n_callbacks` readable entries.
        unsafe { std::slice::from_raw_parts(callbacks, n_callbacks) }
            .iter()
            .map(Callback::new)
            .collect()
    };
    boundary(err, || {
        if callbacks.is_null() && n_callbacks > 0 {
            return Err(null("callbacks"));
        }
        if let Some(i) = owned.iter().position(|c| !c.has_apply()) {
            return Err(invalid(format!(
                "callbacks[{i}].apply is NULL: each callback needs its function"
            )));
        }
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: forwarded contract.
        let json = unsafe { arg_str(config_json, "config_json") }?;
        let ds = open_dataset(json, &owned)?;
        let handle = Box::new(IsbDataset {
            ds,
            pid: std::process::id(),
        });
        // SAFETY: checked non-NULL.
        unsafe { *out = Box::into_raw(handle) };
        Ok(IsbStatus::IsbOk)
    })
}

/// Stops every callback transform in the process for good, waiting up to `timeout_ms` for
/// those running to return: afterwards a chunk that needs one fails its pass with
/// `ISB_TRANSFORM`, and no `release` is called. For a host about to tear down what its
/// callbacks need (the Python shim calls it at interpreter exit). `ISB_TIMED_OUT` when some
/// were still running at the deadline.
///
/// # Safety
/// `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_callbacks_shutdown(
    timeout_ms: u64,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        if crate::callback::shut_down(std::time::Duration::from_millis(timeout_ms)) {
            Ok(IsbStatus::IsbOk)
        } else {
            Err(IsbError::new(
                IsbStatus::IsbTimedOut,
                format!("callback transforms were still running after {timeout_ms} ms"),
            ))
        }
    })
}

/// Closes a dataset: stops its runtime once every iteration and exported tensor is released.
/// NULL is accepted. In a child after fork the handle is forgotten without touching the runtime.
///
/// # Safety
/// `ds` is NULL or a dataset from `isb_dataset_open` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_free(ds: *mut IsbDataset) {
    if ds.is_null() {
        return;
    }
    // SAFETY: per the contract, it came from Box::into_raw.
    let handle = unsafe { Box::from_raw(ds) };
    if handle.pid != std::process::id() {
        // The runtime's threads exist only in the parent; joining them here would hang.
        std::mem::forget(handle);
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(handle)));
}

/// # Safety
/// `p` is NULL or a live handle.
unsafe fn dataset<'a>(p: *const IsbDataset) -> Result<&'a IsbDataset, IsbError> {
    // SAFETY: per the contract.
    let d = unsafe { p.as_ref() }.ok_or_else(|| null("ds"))?;
    same_process(d.pid)?;
    Ok(d)
}

/// Sets the epoch the next iteration draws.
///
/// # Safety
/// `ds` is NULL or a live dataset; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_set_epoch(
    ds: *const IsbDataset,
    epoch: u64,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        unsafe { dataset(ds) }?.ds.set_epoch(epoch);
        Ok(IsbStatus::IsbOk)
    })
}

/// What one epoch of `split` yields: `*samples` (every valid anchor once) and `*batches`
/// (⌈samples / batch_size⌉, every batch full but the last). Either out-pointer may be NULL.
/// The same for every epoch; errors as `isb_iter_start` would for an unknown or empty split.
///
/// # Safety
/// `ds` is NULL or a live dataset; `split` is NUL-terminated; `samples` and `batches` are NULL
/// or writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_split_len(
    ds: *const IsbDataset,
    split: *const c_char,
    samples: *mut u64,
    batches: *mut u64,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let d = unsafe { dataset(ds) }?;
        // SAFETY: forwarded contract.
        let split = unsafe { arg_str(split, "split") }?;
        let n = d.ds.split_samples(split)?;
        // SAFETY: each is NULL or writable, per the contract.
        unsafe {
            if let Some(out) = samples.as_mut() {
                *out = n;
            }
            if let Some(out) = batches.as_mut() {
                *out = n.div_ceil(d.ds.batch_size() as u64);
            }
        }
        Ok(IsbStatus::IsbOk)
    })
}

/// The order the current epoch of `split` draws, planned without reading anything (ABI 11):
/// `samples` receives the sample indices in the order the batches emit them (`*n_samples` of
/// them, as many as `isb_dataset_split_len` counts), and `block_ends` the shuffle blocks, each
/// as the index into that order where it ends (`*n_blocks` of them, ascending, the last one
/// `*n_samples`; a batch draws from the blocks its rows fall in). A sequential split's order is
/// its samples in index order. Call with `samples` and `block_ends` NULL to learn the lengths,
/// then with arrays at least that long: an array shorter than its length is
/// `ISB_INVALID_ARGUMENT` naming it, and then nothing is written to either. The length
/// out-pointers may be NULL. Errors as `isb_iter_start` would for an unknown or empty split.
///
/// # Safety
/// `ds` is NULL or a live dataset; `split` is NUL-terminated; `samples` is NULL or writable for
/// `samples_cap` values and `block_ends` for `block_ends_cap`; `n_samples`, `n_blocks` and
/// `err` are NULL or writable.
#[allow(clippy::too_many_arguments)] // two (array, capacity, length) triples: the C idiom
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_order(
    ds: *const IsbDataset,
    split: *const c_char,
    samples: *mut u64,
    samples_cap: usize,
    n_samples: *mut usize,
    block_ends: *mut u64,
    block_ends_cap: usize,
    n_blocks: *mut usize,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let d = unsafe { dataset(ds) }?;
        // SAFETY: forwarded contract.
        let split = unsafe { arg_str(split, "split") }?;
        let order = d.ds.order(split)?;
        order.check_nonempty(split)?;
        let (n, nb) = (order.rows.len(), order.blocks.len());
        // SAFETY: each is NULL or writable, per the contract.
        unsafe {
            if let Some(out) = n_samples.as_mut() {
                *out = n;
            }
            if let Some(out) = n_blocks.as_mut() {
                *out = nb;
            }
        }
        for (name, ptr, cap, len) in [
            ("samples", samples, samples_cap, n),
            ("block_ends", block_ends, block_ends_cap, nb),
        ] {
            if !ptr.is_null() && cap < len {
                return Err(invalid(format!(
                    "`{name}` holds {cap} values and the order of split `{split}` needs {len}: \
                     call with `{name}` NULL to learn the length, then pass an array that long"
                )));
            }
        }
        // Written straight into the caller's arrays (a length query writes nothing).
        if !samples.is_null() {
            // SAFETY: non-NULL, writable for `samples_cap` ≥ `n` values per the contract.
            let out = unsafe { std::slice::from_raw_parts_mut(samples, n) };
            for (i, o) in out.iter_mut().enumerate() {
                *o = order.anchor(i);
            }
        }
        if !block_ends.is_null() {
            // SAFETY: non-NULL, writable for `block_ends_cap` ≥ `nb` values per the contract.
            let out = unsafe { std::slice::from_raw_parts_mut(block_ends, nb) };
            for (o, b) in out.iter_mut().zip(&order.blocks) {
                *o = b.end as u64;
            }
        }
        Ok(IsbStatus::IsbOk)
    })
}

/// The memory an iteration over `split` would hold at its peak, counted from its plan without
/// reading anything, as JSON: `total_bytes` (what `isb_iter_start` checks against this
/// process's memory limit, so the figure to size a job by) and its parts `working_set_bytes`,
/// `pool_bytes`, `cache_budget_bytes` (`null` unless a budget above the working set sizes the
/// pool), `batch_bytes`, `batches` (of which `rows_batches` are filled ahead of the gather by
/// chunks decoded straight into batch rows), `read_bytes`, `overhead_bytes`, and `others_bytes`, what
/// the `other_passes` iterations running in this process as it asks hold beside this one; the
/// limit `limit_bytes` and `limit_source` (`machine`, `cgroup`, `ulimit -v`, or
/// `memory_limit_bytes` when the config's is lower; `null` when nothing says) and `fits`; `process_rss_bytes`, this process's resident memory as it asks
/// (before any pass: the host a job's memory holds beside the total). Errors as
/// `isb_iter_start` would for an unknown or empty split.
///
/// # Safety
/// `ds` is NULL or a live dataset; `split` is NUL-terminated; `out_json` is writable; `err` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_memory_json(
    ds: *const IsbDataset,
    split: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let d = unsafe { dataset(ds) }?;
        // SAFETY: forwarded contract.
        let split = unsafe { arg_str(split, "split") }?;
        let need = d.ds.memory_need(split)?;
        out_string(out_json, insitubatch::memory_need_json(&need).to_string())
    })
}

/// Statistics of a dataset's batch arrays, accumulated batch by batch (ABI 15). Any thread.
pub struct IsbStatistics {
    acc: std::sync::Mutex<StatisticsAccumulator>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatisticsParams {
    #[serde(default)]
    axis: Option<usize>,
    #[serde(default)]
    quantiles: Vec<f64>,
}

/// A statistics accumulator for the batch arrays of `ds` (each label's, each stack's), per
/// `params_json` — `{"axis": k}`: one entry per index along inner axis `k` of the rows (0 the
/// first after the sample axis: per level, or a stack's channels), or `{}` (or `"axis": null`)
/// for one entry over whole samples; `"quantiles": [0.01, 0.99]` keeps the quantiles at those
/// probabilities too (ABI 23; each in `[0, 1]`, at most 64). Feed it batches with
/// `isb_statistics_add` and read it with `isb_statistics_json`; free it with
/// `isb_statistics_free`. A complex array, an axis the rows lack, or a probability out of range
/// is `ISB_INVALID_ARGUMENT` (ABI 15).
///
/// # Safety
/// `ds` is NULL or a live dataset; `params_json` is NUL-terminated; `out` is writable; `err`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_statistics_new(
    ds: *const IsbDataset,
    params_json: *const c_char,
    out: *mut *mut IsbStatistics,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let d = unsafe { dataset(ds) }?;
        // SAFETY: forwarded contract.
        let params = unsafe { arg_str(params_json, "params_json") }?;
        let p: StatisticsParams = parse_json(params, "statistics parameters")?;
        if out.is_null() {
            return Err(null("out"));
        }
        let acc = StatisticsAccumulator::new(&d.ds, p.axis)?.with_quantiles(&p.quantiles)?;
        let handle = Box::new(IsbStatistics {
            acc: std::sync::Mutex::new(acc),
        });
        // SAFETY: checked non-NULL.
        unsafe { *out = Box::into_raw(handle) };
        Ok(IsbStatus::IsbOk)
    })
}

/// The statistics accumulator of `s`, locked.
///
/// # Safety
/// `s` is NULL or a live accumulator.
unsafe fn statistics<'a>(
    s: *const IsbStatistics,
) -> Result<std::sync::MutexGuard<'a, StatisticsAccumulator>, IsbError> {
    // SAFETY: per the contract.
    let s = unsafe { s.as_ref() }.ok_or_else(|| null("stats"))?;
    // A panic while adding leaves the moments as they were before that batch's arrays.
    Ok(s.acc
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// Adds every row of batch `b` to `stats` (ABI 15). A batch of another dataset, whose arrays
/// differ, is `ISB_INVALID_ARGUMENT` naming the array, and adds nothing.
///
/// # Safety
/// `stats` is NULL or a live accumulator; `b` is NULL or a live batch; `err` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_statistics_add(
    stats: *const IsbStatistics,
    b: *const IsbBatch,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let batch = &unsafe { batch(b) }?.batch;
        // SAFETY: forwarded contract.
        unsafe { statistics(stats) }?.add(batch)?;
        Ok(IsbStatus::IsbOk)
    })
}

/// The statistics so far as JSON, an object by batch array name, each `{"axis", "count",
/// "nan_count", "mean", "std", "min", "max"}`: lists of one value per index along the axis
/// (one value without an axis); `std` is the population standard deviation (numpy's
/// `ddof=0`); NaN values are left out and counted in `nan_count`; an index without values has
/// null mean, std, min and max (ABI 15). With quantiles asked for, also `"quantiles"` (the
/// probabilities) and `"quantile_values"` (per index, one value per probability, numpy's
/// default within 1/256 of the value; ABI 23). Free `*out_json` with `isb_string_free`.
///
/// # Safety
/// `stats` is NULL or a live accumulator; `out_json` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_statistics_json(
    stats: *const IsbStatistics,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let json = unsafe { statistics(stats) }?.to_json().to_string();
        out_string(out_json, json)
    })
}

/// Frees a statistics accumulator. NULL is accepted (ABI 15).
///
/// # Safety
/// `stats` is NULL or an accumulator from `isb_statistics_new` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_statistics_free(stats: *mut IsbStatistics) {
    if !stats.is_null() {
        // SAFETY: per the contract, it came from Box::into_raw.
        let _ = std::panic::catch_unwind(|| drop(unsafe { Box::from_raw(stats) }));
    }
}

/// Dataset facts and pool counters as JSON: `epoch`, `batch_size`, `io_backend`, `variables`
/// (label, path, offset, placement and indexed (ABI 17), region, shape, dtype, sample_shape),
/// `arrays` (ABI
/// 14: what each batch holds, in order: name, labels, shape of a row, dtype, stacked),
/// `manifest`, `anchor_range` (ABI 17: `[start, end)`, the anchors every variable reads inside
/// its array), `pool` (budget, resident and peak bytes,
/// evictions, hits, misses, revived), `cache` (`null` without `cache_dir`; else dir, persist,
/// readonly, direct_io, cached_chunks, writes, write_bytes, write_errors, writes_skipped, revived,
/// rejected),
/// `warnings` (every dataset warning so far, each also printed to stderr once) and
/// `prefetched_epoch` (ABI 22: the epoch of the train iteration `prefetch_next_epoch` started
/// early that waits to be asked for; `null` while there is none, while it is still starting,
/// and once it could not start, when a warning says why).
///
/// # Safety
/// `ds` is NULL or a live dataset; `out_json` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dataset_stats_json(
    ds: *const IsbDataset,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let d = &unsafe { dataset(ds) }?.ds;
        let p = d.pool_stats();
        let vars: Vec<serde_json::Value> = d
            .variables()
            .iter()
            .map(|v| {
                let mut g = insitubatch::geometry_json(&v.geom);
                g["label"] = v.label.clone().into();
                g["path"] = v.geom.path.clone().into();
                g["offset"] = v.geom.offset.into();
                // ABI 17: where the variable's store sits against the anchors (a store mounted
                // with an alignment): the sample a row reads is (anchor * mul + add) / div +
                // offset; {1, 0, 1} for the anchors' own store.
                // ABI 17: read through an index (one sample per anchor), not the placement.
                g["indexed"] = v.index.is_some().into();
                g["placement"] = serde_json::json!({
                    "mul": v.placement.mul,
                    "add": v.placement.add,
                    "div": v.placement.div,
                    "containing": v.placement.containing,
                });
                // A sample as batches hold it (after the array's chunk transforms).
                g["sample_shape"] = v.sample_inner.clone().into();
                g["sample_dtype"] = v.sample_dtype.name().into();
                g
            })
            .collect();
        let arrays: Vec<serde_json::Value> = d
            .batch_arrays()
            .iter()
            .map(|a| {
                serde_json::json!({
                    "name": a.name,
                    "labels": a.labels,
                    "shape": a.row_shape,
                    "dtype": a.dtype.name(),
                    "stacked": a.stacked,
                })
            })
            .collect();
        let manifest: serde_json::Value =
            serde_json::from_str(&d.manifest().to_json()).unwrap_or_default();
        let v = serde_json::json!({
            "epoch": d.epoch(),
            "batch_size": d.batch_size(),
            "sample_stride": d.sample_stride().every,
            "sample_phase": d.sample_stride().phase,
            "io_backend": d.io_backend().to_string(),
            "variables": vars,
            "arrays": arrays,
            "manifest": manifest,
            "anchor_range": [d.anchor_range().start, d.anchor_range().end],
            "patch": d.patch().map(|p| &p.shape),
            "patch_wrap": d.patch().map(|p| &p.wrap),
            "patches_per_sample": d.patches_per_sample(),
            "patch_grid": d.patch().and_then(|p| match &p.origins {
                Origins::Grid(stride) => Some(stride),
                Origins::Random(_) => None,
            }),
            "pool": {
                "budget_bytes": p.budget_bytes,
                "resident_bytes": p.resident_bytes,
                "peak_resident_bytes": p.peak_resident_bytes,
                "resident_slots": p.resident_slots,
                "pinned_slots": p.pinned_slots,
                "evictions": p.evictions,
                "hits": p.hits,
                "misses": p.misses,
                "revived": p.revived,
            },
            "cache": d.cache_tier().map(|t| {
                let st = t.stats();
                serde_json::json!({
                    "dir": t.dir().display().to_string(),
                    "persist": t.persist(),
                    "readonly": t.readonly(),
                    "direct_io": t.direct_io(),
                    "cached_chunks": t.cached_chunks(),
                    "writes": st.writes,
                    "write_bytes": st.write_bytes,
                    "write_errors": st.write_errors,
                    "writes_skipped": st.writes_skipped,
                    "revived": st.revived,
                    "rejected": st.rejected,
                })
            }),
            "warnings": d.warnings(),
            "prefetched_epoch": d.prefetched_epoch(),
        });
        out_string(out_json, v.to_string())
    })
}

/// Starts an iteration over `split` (`train`, `val`, `test` or `all`) at the current epoch.
/// Free `*out` with `isb_iter_free` (which stops it early if needed).
///
/// # Safety
/// `ds` is NULL or a live dataset; `split` is NUL-terminated; `out` is writable; `err` is NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_start(
    ds: *const IsbDataset,
    split: *const c_char,
    out: *mut *mut IsbIter,
    err: *mut *mut IsbError,
) -> IsbStatus {
    // SAFETY: forwarded contract.
    unsafe { isb_iter_start_at(ds, split, 0, out, err) }
}

/// Resumes the current epoch of `split` at batch `start_batch`, as `isb_iter_start` starts it
/// at 0: the batches are batches `start_batch..` of a whole epoch (the same samples in the same
/// order), and chunks only earlier batches draw from are not read. For a job restarted from a
/// checkpoint that saved (epoch, batches done). `start_batch` equal to the epoch's batch count
/// (`isb_dataset_split_len`) yields none; beyond it is `ISB_INVALID_ARGUMENT` naming
/// `start_batch` (ABI 7).
///
/// # Safety
/// As `isb_iter_start`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_start_at(
    ds: *const IsbDataset,
    split: *const c_char,
    start_batch: u64,
    out: *mut *mut IsbIter,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: forwarded contract.
        let d = unsafe { dataset(ds) }?;
        // SAFETY: forwarded contract.
        let split = unsafe { arg_str(split, "split") }?;
        let pass = d.ds.iter_from(split, start_batch)?;
        let labels =
            d.ds.batch_arrays()
                .iter()
                .map(|a| CString::new(a.name.as_str()).unwrap_or_default())
                .collect();
        let it = Box::new(IsbIter {
            state: std::sync::Mutex::new(IterState { pass, failed: None }),
            pid: d.pid,
            labels,
        });
        // SAFETY: checked non-NULL.
        unsafe { *out = Box::into_raw(it) };
        Ok(IsbStatus::IsbOk)
    })
}

/// The next batch into `*out` (`ISB_OK`), or `ISB_END_OF_EPOCH` with `*out` set to NULL. After
/// an error every later call returns the same error again. Free batches with `isb_batch_free`.
/// Waits for as long as the batch takes; `isb_iter_next_timeout` bounds the wait.
///
/// # Safety
/// `it` is NULL or a live iteration (a call while another thread is inside one on the same
/// iteration returns `ISB_INVALID_ARGUMENT`); `out` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_next(
    it: *mut IsbIter,
    out: *mut *mut IsbBatch,
    err: *mut *mut IsbError,
) -> IsbStatus {
    // SAFETY: forwarded contract.
    unsafe { next_batch(it, None, out, err) }
}

/// `isb_iter_next` waiting at most `timeout_ms` milliseconds: `ISB_TIMED_OUT` with `*out` set
/// to NULL when no batch came in time. The iteration goes on and nothing is lost; call again.
/// A host that must notice something while it waits (a signal, a shutdown request) loops on
/// this; the Python shim does, so that Ctrl-C interrupts a wait for a batch.
///
/// # Safety
/// As `isb_iter_next`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_next_timeout(
    it: *mut IsbIter,
    timeout_ms: u64,
    out: *mut *mut IsbBatch,
    err: *mut *mut IsbError,
) -> IsbStatus {
    let timeout = std::time::Duration::from_millis(timeout_ms);
    // SAFETY: forwarded contract.
    unsafe { next_batch(it, Some(timeout), out, err) }
}

/// # Safety
/// As `isb_iter_next`.
unsafe fn next_batch(
    it: *mut IsbIter,
    timeout: Option<std::time::Duration>,
    out: *mut *mut IsbBatch,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: per the contract (a shared reference: calls from two threads meet at the
        // lock).
        let it = unsafe { it.as_ref() }.ok_or_else(|| null("it"))?;
        same_process(it.pid)?;
        let mut st = it.state()?;
        if let Some(m) = &st.failed {
            return Err(IsbError::new(
                IsbStatus::IsbCancelled,
                format!("this iteration failed earlier and is over: {m}"),
            ));
        }
        let next = match timeout {
            None => st.pass.next(),
            Some(t) => match st.pass.next_timeout(t) {
                Ok(next) => next,
                Err(insitubatch::TimedOut) => return Ok(IsbStatus::IsbTimedOut),
            },
        };
        match next {
            None => Ok(IsbStatus::IsbEndOfEpoch),
            Some(Err(e)) => {
                st.failed = Some(e.to_string());
                Err(e.into())
            }
            Some(Ok(batch)) => {
                let b = Box::new(IsbBatch {
                    batch: Arc::new(batch),
                    labels: Arc::clone(&it.labels),
                });
                // SAFETY: checked non-NULL.
                unsafe { *out = Box::into_raw(b) };
                Ok(IsbStatus::IsbOk)
            }
        }
    })
}

/// The iteration's report as JSON (hits, misses, bytes, TTFB, latency percentiles, bad chunks…).
/// `ISB_INVALID_ARGUMENT` while another thread is inside a call on the same iteration.
///
/// # Safety
/// `it` is NULL or a live iteration; `out_json` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_stats_json(
    it: *const IsbIter,
    out_json: *mut *mut c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: per the contract.
        let it = unsafe { it.as_ref() }.ok_or_else(|| null("it"))?;
        same_process(it.pid)?;
        let s = serde_json::to_string(&it.state()?.pass.stats())
            .map_err(|e| IsbError::new(IsbStatus::IsbInternal, e.to_string()))?;
        out_string(out_json, s)
    })
}

/// Stops and frees an iteration (early exit frees everything it held). NULL is accepted.
///
/// # Safety
/// `it` is NULL or an iteration not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_iter_free(it: *mut IsbIter) {
    if it.is_null() {
        return;
    }
    // SAFETY: per the contract, it came from Box::into_raw.
    let it = unsafe { Box::from_raw(it) };
    if it.pid != std::process::id() {
        std::mem::forget(it);
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(it)));
}

/// # Safety
/// `b` is NULL or a live batch.
unsafe fn batch<'a>(b: *const IsbBatch) -> Result<&'a IsbBatch, IsbError> {
    // SAFETY: per the contract.
    unsafe { b.as_ref() }.ok_or_else(|| null("b"))
}

/// Rows in the batch.
///
/// # Safety
/// `b` is NULL or a live batch; `out` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_len(
    b: *const IsbBatch,
    out: *mut usize,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let n = unsafe { batch(b) }?.batch.len();
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = n };
        Ok(IsbStatus::IsbOk)
    })
}

/// The epoch the batch was drawn in and its position in that epoch (ABI 12). The position
/// counts from the epoch's first batch also in an iteration resumed with `isb_iter_start_at`,
/// so a checkpoint that saves `(*epoch, *index + 1)` resumes right after this batch with
/// `isb_dataset_set_epoch` and `isb_iter_start_at`.
///
/// # Safety
/// `b` is NULL or a live batch; `epoch` and `index` are writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_position(
    b: *const IsbBatch,
    epoch: *mut u64,
    index: *mut u64,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let batch = &unsafe { batch(b) }?.batch;
        if epoch.is_null() {
            return Err(null("epoch"));
        }
        if index.is_null() {
            return Err(null("index"));
        }
        // SAFETY: both checked non-NULL.
        unsafe {
            *epoch = batch.epoch();
            *index = batch.index() as u64;
        }
        Ok(IsbStatus::IsbOk)
    })
}

/// The anchor (sample index on the reference grid) of each row: `*len` values at `*out`, valid
/// while the batch lives.
///
/// # Safety
/// `b` is NULL or a live batch; `out` and `len` are writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_sample_indices(
    b: *const IsbBatch,
    out: *mut *const u64,
    len: *mut usize,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let s = unsafe { batch(b) }?.batch.sample_indices();
        // SAFETY: forwarded contract.
        unsafe { hand_out(Some(s), out, len) }
    })
}

/// Points `*out` at `values` and sets `*len` to their count (NULL and 0 for none), after
/// checking both out-parameters.
///
/// # Safety
/// `out` and `len` are NULL or writable.
unsafe fn hand_out(
    values: Option<&[u64]>,
    out: *mut *const u64,
    len: *mut usize,
) -> Result<IsbStatus, IsbError> {
    if out.is_null() {
        return Err(null("out"));
    }
    if len.is_null() {
        return Err(null("len"));
    }
    // SAFETY: checked non-NULL; writable by the caller's contract.
    unsafe {
        *out = values.map_or(std::ptr::null(), <[u64]>::as_ptr);
        *len = values.map_or(0, <[u64]>::len);
    }
    Ok(IsbStatus::IsbOk)
}

/// Where each row's patch was cut (a dataset with `patch`, ABI 19): `*len` values at `*out`,
/// row-major, one index per patched axis per row (`*len` = rows × patched axes), valid while
/// the batch lives. Without a patch, `*out` is NULL and `*len` 0.
///
/// # Safety
/// `b` is NULL or a live batch; `out` and `len` are writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_patch_origins(
    b: *const IsbBatch,
    out: *mut *const u64,
    len: *mut usize,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let origins = unsafe { batch(b) }?.batch.patch_origins();
        // SAFETY: forwarded contract.
        unsafe { hand_out(origins, out, len) }
    })
}

/// Number of arrays in the batch: each label's own, and one per stack (`stacks`) in place of
/// its labels.
///
/// # Safety
/// `b` is NULL or a live batch; `out` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_label_count(
    b: *const IsbBatch,
    out: *mut usize,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let n = unsafe { batch(b) }?.labels.len();
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = n };
        Ok(IsbStatus::IsbOk)
    })
}

/// The name of array `index` (declaration order; a label, or a stack's name in the place of
/// its first label), valid while the batch lives.
///
/// # Safety
/// `b` is NULL or a live batch; `out` is writable; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_label(
    b: *const IsbBatch,
    index: usize,
    out: *mut *const c_char,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let bt = unsafe { batch(b) }?;
        let l = bt.labels.get(index).ok_or_else(|| {
            invalid(format!(
                "label index {index} is out of range: the batch has {} labels",
                bt.labels.len()
            ))
        })?;
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: checked non-NULL.
        unsafe { *out = l.as_ptr() };
        Ok(IsbStatus::IsbOk)
    })
}

/// Exports the array `label` (a label, or a stack's name), shaped `(batch, *sample_inner)`, or
/// `(batch, channels, *sample_inner)` for a stack, C-contiguous, on the CPU, as a
/// DLPack 1.x tensor that aliases the batch buffer (no copy) and keeps it alive until its
/// deleter is called, even after `isb_batch_free` or `isb_dataset_free`.
///
/// # Safety
/// `b` is NULL or a live batch; `label` is NUL-terminated; `out` is writable; `err` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_export(
    b: *const IsbBatch,
    label: *const c_char,
    out: *mut *mut DLManagedTensorVersioned,
    err: *mut *mut IsbError,
) -> IsbStatus {
    boundary(err, || {
        // SAFETY: forwarded contract.
        let bt = unsafe { batch(b) }?;
        // SAFETY: forwarded contract.
        let label = unsafe { arg_str(label, "label") }?;
        if out.is_null() {
            return Err(null("out"));
        }
        let t = dlpack::export(&bt.batch, label).ok_or_else(|| {
            invalid(format!(
                "no array `{label}` in this batch; it has [{}]",
                bt.batch.names().join(", ")
            ))
        })?;
        // SAFETY: checked non-NULL.
        unsafe { *out = t };
        Ok(IsbStatus::IsbOk)
    })
}

/// Frees a batch handle; exported tensors stay valid. NULL is accepted.
///
/// # Safety
/// `b` is NULL or a batch not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_batch_free(b: *mut IsbBatch) {
    if !b.is_null() {
        // SAFETY: per the contract, it came from Box::into_raw.
        let b = unsafe { Box::from_raw(b) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(b)));
    }
}
