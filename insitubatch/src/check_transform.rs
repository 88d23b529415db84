//! `insitubatch check-transform`: runs chunk transforms on one real chunk of a store while you
//! write them, and shows what the cache will hold, what the transforms did to the values, what
//! they cost per chunk and the fingerprint a persisted cache will carry.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::{DType, EngineError, InSituDataset, split_by_chunk};
use insitubatch_actors::ChunkTransforms;

/// Reads a `--chunk-transforms` argument: a JSON list (or one object), or `@FILE` holding one.
pub fn transforms_arg(arg: &str) -> Result<String, EngineError> {
    let text = match arg.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).map_err(|e| {
            EngineError::arg(
                "chunk_transforms",
                arg,
                format!("cannot read the file {file}: {e}"),
            )
        })?,
        None => arg.to_string(),
    };
    // One object is a list of one.
    Ok(match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v @ serde_json::Value::Object(_)) => serde_json::Value::Array(vec![v]).to_string(),
        _ => text,
    })
}

/// Value summary of a chunk's samples.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Smallest value (NaN excluded; null when every value is NaN).
    pub min: Option<f64>,
    /// Largest value.
    pub max: Option<f64>,
    /// Mean of the values that are not NaN.
    pub mean: Option<f64>,
    /// Values that are NaN.
    pub nan: u64,
}

impl Summary {
    fn of(bytes: &[u8], dtype: DType) -> Self {
        // Every real type as f64 (what a summary needs); nothing for float16 and complex.
        let values = crate::coords::numbers(dtype, bytes).unwrap_or_default();
        let finite: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        let n = finite.len();
        Self {
            min: finite.iter().copied().reduce(f64::min),
            max: finite.iter().copied().reduce(f64::max),
            mean: (n > 0).then(|| finite.iter().sum::<f64>() / n as f64),
            nan: (values.len() - n) as u64,
        }
    }
}

/// What `check-transform` found.
#[derive(Clone, Debug, Serialize)]
pub struct TransformReport {
    /// The array.
    pub array: String,
    /// Element type as stored.
    pub dtype: String,
    /// Element type after the transforms.
    pub dtype_after: String,
    /// The chunk checked (its index along the sample axis) and the samples it holds.
    pub chunk: u64,
    /// First and one-past-last sample of the chunk.
    pub samples: (u64, u64),
    /// A decoded chunk, sample-first: `[samples_per_chunk, *inner]`.
    pub chunk_shape: Vec<u64>,
    /// The slot a chunk occupies in the pool and the cache, after the transforms.
    pub slot_shape: Vec<u64>,
    /// Its bytes (what the budget and each cache file hold per chunk).
    pub slot_bytes: u64,
    /// The array's transforms in order, each by its full identity.
    pub transforms: Vec<String>,
    /// The array's cache fingerprint with these transforms.
    pub fingerprint: String,
    /// The chunk's values as decoded.
    pub before: Summary,
    /// After the transforms.
    pub after: Summary,
    /// Median time to transform one chunk, in microseconds.
    pub apply_us_median: f64,
    /// That as decoded megabytes (of the chunk before the transforms) per second.
    pub apply_mb_s: f64,
}

impl TransformReport {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
        let mut out = format!(
            "array `{}`: chunk {} (samples {}..{}), decoded {:?} {}; after the transforms {:?} \
             {} = {} per chunk in the pool and the cache\n",
            self.array,
            self.chunk,
            self.samples.0,
            self.samples.1,
            self.chunk_shape,
            self.dtype,
            self.slot_shape,
            self.dtype_after,
            crate::inspect::human_bytes(self.slot_bytes),
        );
        out.push_str("transforms, in order:\n");
        for (i, t) in self.transforms.iter().enumerate() {
            // Coordinates or per-level statistics can run to thousands of numbers; JSON output
            // has them all.
            let shown: String = t.chars().take(160).collect();
            let more = t.chars().count().saturating_sub(160);
            let tail = if more > 0 {
                format!(" ... ({more} more characters; --json has them)")
            } else {
                String::new()
            };
            out.push_str(&format!("  [{i}] {shown}{tail}\n"));
        }
        out.push_str(&format!("cache fingerprint: {}\n", self.fingerprint));
        out.push_str(&format!(
            "{:<8} {:>16} {:>16} {:>16} {:>10}\n",
            "", "min", "max", "mean", "NaN"
        ));
        for (name, s) in [("decoded", &self.before), ("after", &self.after)] {
            out.push_str(&format!(
                "{:<8} {:>16} {:>16} {:>16} {:>10}\n",
                name,
                num(s.min),
                num(s.max),
                num(s.mean),
                s.nan
            ));
        }
        out.push_str(&format!(
            "apply: {:.1} us per chunk ({:.0} MB/s), the median of the repeats\n",
            self.apply_us_median, self.apply_mb_s
        ));
        out
    }
}

/// Reads chunk `chunk` of `var` (decoded, assembled sample-first), runs the transforms on it
/// `repeat` times, checks that the engine's own pass delivers the same values, and reports.
/// `storage_options` configure an object store (empty for a directory).
pub fn check_transform(
    root: &Path,
    var: &str,
    sample_axis: usize,
    transforms_json: &str,
    chunk: u64,
    repeat: usize,
    storage_options: &[(String, String)],
) -> Result<TransformReport, EngineError> {
    let mut transforms = ChunkTransforms::default();
    transforms.extend_from_json(transforms_json)?;
    // The arrays the scopes name are checked too (each must exist and suit its transforms).
    let mut paths = vec![var.to_string()];
    paths.extend(transforms.scoped_paths().into_iter().filter(|p| p != var));
    let geoms = crate::geometries_with(root, Some(&paths), sample_axis, storage_options)?;
    let geom = geoms[var].clone();
    let n_chunks = geom.n_sample_chunks();
    if chunk >= n_chunks {
        return Err(EngineError::arg(
            "chunk",
            chunk,
            format!("`{var}` has {n_chunks} chunks along its sample axis (0..{n_chunks})"),
        ));
    }
    let spc = geom.samples_per_chunk();
    let samples = (chunk * spc, ((chunk + 1) * spc).min(geom.n_samples()));
    let arrays = geoms
        .iter()
        .map(|(p, g)| (p.clone(), (g.inner_shape(), g.dtype)))
        .collect();
    let pipeline = transforms
        .pipelines(&arrays)?
        .remove(var)
        .expect("pipelines covers every array it was given");
    if pipeline.is_empty() {
        return Err(EngineError::arg(
            "chunk_transforms",
            transforms_json,
            format!("no transform applies to `{var}`: check the `applies` scopes"),
        ));
    }
    // The chunk's samples as the engine delivers them, without and with the transforms: one
    // chunk in train, one sequential batch of it.
    let manifest = split_by_chunk(&geom, &[1.0], 0, true, Some(samples))?;
    let only_var = transforms.restricted_to(var);
    let one_batch = |transforms: Option<&ChunkTransforms>| -> Result<Vec<u8>, EngineError> {
        let mut b = InSituDataset::builder(root)
            .variable(var, var)
            .storage_options(storage_options)
            .sample_axis(sample_axis)
            .manifest(manifest.clone())
            .batch_size(spc as usize)
            .shuffle(false);
        if let Some(t) = transforms {
            b = b.chunk_transforms(t);
        }
        let ds = b.build()?;
        let batch = ds.train()?.next().expect("one chunk gives one batch")?;
        Ok(batch.array(var).expect("the label").bytes().to_vec())
    };
    let decoded = one_batch(None)?;
    let from_engine = one_batch(Some(&only_var))?;
    // The chunk is full-size; a short last chunk is padded here as in the pool.
    let mut chunk_shape = vec![spc];
    chunk_shape.extend(geom.inner_shape());
    let chunk_bytes = chunk_shape.iter().product::<u64>() as usize * geom.dtype.size_bytes();
    let mut padded = decoded.clone();
    padded.resize(chunk_bytes, 0);
    let mut slot_shape = vec![spc];
    slot_shape.extend(pipeline.output_inner());
    let slot_bytes =
        slot_shape.iter().product::<u64>() * pipeline.output_dtype().size_bytes() as u64;
    let mut times = Vec::with_capacity(repeat.max(1));
    let mut out = Vec::new();
    for _ in 0..repeat.max(1) {
        let input = padded.clone();
        let t = Instant::now();
        out = pipeline
            .apply(&geom.path, chunk, &chunk_shape, geom.dtype, input)
            .map_err(EngineError::Transform)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let rows = (samples.1 - samples.0) as usize;
    out.truncate(rows * (slot_bytes / spc) as usize);
    if out != from_engine {
        return Err(EngineError::Runtime(format!(
            "the transforms gave other values on `{var}` chunk {chunk} when run here than in the \
             engine's pass; this is a bug, please report it"
        )));
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let ids = pipeline.identities();
    Ok(TransformReport {
        array: var.to_string(),
        dtype: geom.dtype.name().to_string(),
        dtype_after: pipeline.output_dtype().name().to_string(),
        chunk,
        samples,
        chunk_shape,
        slot_shape,
        slot_bytes,
        fingerprint: insitubatch_pool::disk::fingerprint(
            &ids.iter().map(String::as_str).collect::<Vec<_>>(),
        ),
        transforms: ids,
        before: Summary::of(&decoded, geom.dtype),
        after: Summary::of(&out, pipeline.output_dtype()),
        apply_us_median: median * 1e6,
        apply_mb_s: chunk_bytes as f64 / median.max(1e-9) / 1e6,
    })
}
