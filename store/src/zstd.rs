//! zstd decode with one decompression context per thread.
//!
//! zarrs' `zstd` codec makes a fresh zstd context for every chunk it decodes. Making one costs
//! about what decoding a small chunk's first block does: on 260 KB chunks it was 5.3 % of the
//! engine's CPU (`ZSTD_createDCtx` in `perf`), and decoding with a kept context ran 8–14 % faster
//! (docs/benchmarks.md, "A zstd context per thread"). [`reuse_contexts`] swaps the codec in an
//! array's chain for [`ZstdKeepingContext`], which decodes the same frames with a context each
//! thread keeps and hands everything else (its name, configuration, encoding) to zarrs' codec.
//! The rest of the chain stays zarrs'.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use zarrs::array::codec::api::{
    ArrayToBytesCodecTraits, BytesToBytesCodecTraits, CodecError, CodecMetadataOptions,
    CodecOptions, CodecTraits, PartialDecoderCapability, PartialEncoderCapability,
    RecommendedConcurrency,
};
use zarrs::array::codec::{
    BytesCodec, BytesCodecConfiguration, CodecChain, ShardingCodec, ShardingCodecConfiguration,
    ZstdCodec,
};
use zarrs::array::{ArrayBytesRaw, BytesRepresentation};
use zarrs::metadata::Configuration;
use zarrs::plugin::{ExtensionName, ZarrVersion};

thread_local! {
    /// This thread's decompression context, made on its first zstd chunk.
    static CONTEXT: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// zarrs' zstd codec, decoding with this thread's context.
#[derive(Debug)]
pub struct ZstdKeepingContext {
    zarrs: Arc<dyn BytesToBytesCodecTraits>,
}

/// `chain` with each zstd codec among its bytes-to-bytes codecs decoding through
/// [`ZstdKeepingContext`], the inner chain of a sharding codec included; `None` when it has no
/// zstd codec (the chain is used as it is).
pub fn reuse_contexts(chain: &CodecChain) -> Option<CodecChain> {
    let is_zstd = |c: &Arc<dyn BytesToBytesCodecTraits>| c.as_any().is::<ZstdCodec>();
    let shards = resharded(chain.array_to_bytes_codec());
    if shards.is_none() && !chain.bytes_to_bytes_codecs().iter().any(is_zstd) {
        return None;
    }
    let bytes_to_bytes = chain
        .bytes_to_bytes_codecs()
        .iter()
        .map(|c| {
            if is_zstd(c) {
                Arc::new(ZstdKeepingContext { zarrs: c.clone() })
                    as Arc<dyn BytesToBytesCodecTraits>
            } else {
                c.clone()
            }
        })
        .collect();
    Some(CodecChain::new(
        chain.array_to_array_codecs().to_vec(),
        shards.unwrap_or_else(|| chain.array_to_bytes_codec().clone()),
        bytes_to_bytes,
    ))
}

/// A sharding codec rebuilt from its configuration with [`reuse_contexts`] applied to its
/// inner chain; `None` for any other codec, or when the inner chain has no zstd codec.
fn resharded(codec: &Arc<dyn ArrayToBytesCodecTraits>) -> Option<Arc<dyn ArrayToBytesCodecTraits>> {
    if !codec.as_any().is::<ShardingCodec>() {
        return None;
    }
    let configuration = codec.configuration(ZarrVersion::V3, &CodecMetadataOptions::default())?;
    let ShardingCodecConfiguration::V1(c) = configuration.to_typed().ok()? else {
        return None;
    };
    let inner = reuse_contexts(&CodecChain::from_metadata(&c.codecs).ok()?)?;
    let index = CodecChain::from_metadata(&c.index_codecs).ok()?;
    Some(Arc::new(ShardingCodec::new(
        c.chunk_shape,
        Arc::new(inner),
        Arc::new(index),
        c.index_location,
    )))
}

/// True when `chain` (after [`reuse_contexts`]) is a chunk's bytes in this machine's byte
/// order under one zstd codec and nothing else: its decoded chunk is then the zstd frames'
/// content byte for byte, and decompressing straight into the destination is the whole decode
/// ([`decompress_into`]).
pub(crate) fn is_plain_zstd(chain: &CodecChain) -> bool {
    let bytes = chain.array_to_bytes_codec();
    let native = bytes.as_any().is::<BytesCodec>()
        && bytes
            .configuration(ZarrVersion::V3, &CodecMetadataOptions::default())
            .and_then(|c| c.to_typed::<BytesCodecConfiguration>().ok())
            .is_some_and(|c| {
                matches!(c, BytesCodecConfiguration::V1(c) if c.endian.is_none_or(|e| e.is_native()))
            });
    native
        && chain.array_to_array_codecs().is_empty()
        && matches!(chain.bytes_to_bytes_codecs(), [c] if c.as_any().is::<ZstdKeepingContext>())
}

/// Runs `f` with this thread's decompression context.
fn with_context<T>(
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    CONTEXT.with(|cell| {
        let mut slot = cell.borrow_mut();
        let context = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        f(context)
    })
}

/// Why frames that did not decompress into `size` bytes failed: they hold more, or are not
/// zstd.
fn too_large_or(encoded: &[u8], size: usize, e: std::io::Error) -> CodecError {
    match zstd::zstd_safe::get_frame_content_size(encoded) {
        Ok(Some(n)) if n > size as u64 => CodecError::Other(format!(
            "its zstd frame holds {n} bytes, more than the {size} of a chunk"
        )),
        _ => e.into(),
    }
}

/// Decompresses the frames of `encoded` into a buffer of `size` bytes with this thread's
/// context: an error when they hold more, or are not zstd.
fn decompress(encoded: &[u8], size: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(size);
    with_context(|c| c.decompress_to_buffer(encoded, &mut out))
        .map(|_| out)
        .map_err(|e| too_large_or(encoded, size, e))
}

/// Decompresses the frames of `encoded` into `out` with this thread's context: an error unless
/// they hold exactly `out.len()` bytes.
pub(crate) fn decompress_into(encoded: &[u8], out: &mut [u8]) -> Result<(), String> {
    let size = out.len();
    match with_context(|c| c.decompress_to_buffer(encoded, out)) {
        Ok(n) if n == size => Ok(()),
        Ok(n) => Err(format!("decoded {n} bytes, expected {size}")),
        Err(e) => Err(too_large_or(encoded, size, e).to_string()),
    }
}

impl ExtensionName for ZstdKeepingContext {
    fn name(&self, version: ZarrVersion) -> Option<Cow<'static, str>> {
        self.zarrs.name(version)
    }
}

impl CodecTraits for ZstdKeepingContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn configuration(
        &self,
        version: ZarrVersion,
        options: &CodecMetadataOptions,
    ) -> Option<Configuration> {
        self.zarrs.configuration(version, options)
    }

    fn partial_decoder_capability(&self) -> PartialDecoderCapability {
        self.zarrs.partial_decoder_capability()
    }

    fn partial_encoder_capability(&self) -> PartialEncoderCapability {
        self.zarrs.partial_encoder_capability()
    }
}

impl BytesToBytesCodecTraits for ZstdKeepingContext {
    fn into_dyn(self: Arc<Self>) -> Arc<dyn BytesToBytesCodecTraits> {
        self as Arc<dyn BytesToBytesCodecTraits>
    }

    fn recommended_concurrency(
        &self,
        decoded_representation: &BytesRepresentation,
    ) -> Result<RecommendedConcurrency, CodecError> {
        self.zarrs.recommended_concurrency(decoded_representation)
    }

    fn encoded_representation(
        &self,
        decoded_representation: &BytesRepresentation,
    ) -> BytesRepresentation {
        self.zarrs.encoded_representation(decoded_representation)
    }

    fn encode<'a>(
        &self,
        decoded_value: ArrayBytesRaw<'a>,
        options: &CodecOptions,
    ) -> Result<ArrayBytesRaw<'a>, CodecError> {
        self.zarrs.encode(decoded_value, options)
    }

    fn decode<'a>(
        &self,
        encoded_value: ArrayBytesRaw<'a>,
        decoded_representation: &BytesRepresentation,
        options: &CodecOptions,
    ) -> Result<ArrayBytesRaw<'a>, CodecError> {
        match decoded_representation.size() {
            // A fixed-size chunk: its decoded size is known, and frames that hold more are
            // corrupt (zarrs finds that one step later, from the chain's output size).
            Some(size) => Ok(Cow::Owned(decompress(&encoded_value, size as usize)?)),
            None => self
                .zarrs
                .decode(encoded_value, decoded_representation, options),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::path::PathBuf;

    use zarrs::array::ArrayBytes;

    use super::*;
    use crate::array::ZarrArray;

    /// A 4 × 3000 float32 array whose codecs are `codecs` (JSON), chunked whole.
    fn array(codecs: &str) -> ZarrArray {
        let meta: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"zarr_format":3,"node_type":"array","shape":[4,3000],"data_type":"float32",
            "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[4,3000]}}}},
            "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
            "fill_value":0.0,"codecs":{codecs}}}"#
        ))
        .unwrap();
        ZarrArray::from_metadata("a", &meta, None, PathBuf::from("a/zarr.json")).unwrap()
    }

    const ZSTD: &str = r#"[{"name":"bytes","configuration":{"endian":"little"}},
        {"name":"zstd","configuration":{"level":3,"checksum":true}}]"#;

    /// A chunk of `a` encoded by zarrs' own chain, and its values.
    fn encoded(a: &ZarrArray) -> (Vec<u8>, Vec<u8>) {
        let values: Vec<u8> = (0..12_000u32)
            .flat_map(|i| ((i % 97) as f32 * 0.5).to_le_bytes())
            .collect();
        let inner = a.zarrs();
        let shape = [NonZeroU64::new(4).unwrap(), NonZeroU64::new(3000).unwrap()];
        let encoded = inner
            .codecs()
            .encode(
                ArrayBytes::new_flen(values.clone()),
                &shape,
                inner.data_type(),
                inner.fill_value(),
                &CodecOptions::default(),
            )
            .unwrap()
            .into_owned();
        (encoded, values)
    }

    fn has_context() -> bool {
        CONTEXT.with(|c| c.borrow().is_some())
    }

    #[test]
    fn zstd_chunks_decode_as_zarrs_does_with_a_context_the_thread_keeps() {
        std::thread::spawn(|| {
            let a = array(ZSTD);
            let chain = reuse_contexts(&a.zarrs().codecs()).expect("a zstd codec to swap");
            let codec = &chain.bytes_to_bytes_codecs()[0];
            assert!(codec.as_any().is::<ZstdKeepingContext>());
            // The same codec to the outside: name and configuration.
            let options = CodecMetadataOptions::default();
            assert_eq!(
                chain.create_metadatas(&options),
                a.zarrs().codecs().create_metadatas(&options)
            );
            let (encoded, values) = encoded(&a);
            assert!(!has_context());
            for _ in 0..3 {
                let chunk = a.decode_chunk_from(&[0, 0], Some(&encoded), PathBuf::new);
                assert_eq!(chunk.unwrap().bytes, values);
                assert!(has_context(), "kept after the first chunk");
            }
            // A truncated frame, and a frame of more bytes than the chunk holds, are errors.
            let e = a.decode_chunk_from(&[0, 0], Some(&encoded[..encoded.len() / 2]), PathBuf::new);
            assert!(e.is_err());
            let big = zstd::bulk::compress(&[7u8; 48_001], 3).unwrap();
            let e = a.decode_chunk_from(&[0, 0], Some(&big), PathBuf::new);
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("`a/c/0/0`") && e.contains("48001 bytes, more than the 48000"),
                "{e}"
            );
            // The context survives an error.
            let chunk = a.decode_chunk_from(&[0, 0], Some(&encoded), PathBuf::new);
            assert_eq!(chunk.unwrap().bytes, values);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_sharded_arrays_inner_zstd_is_swapped_and_other_chains_are_left_alone() {
        let sharded = format!(
            r#"[{{"name":"sharding_indexed","configuration":{{"chunk_shape":[1,3000],
            "codecs":{ZSTD},"index_codecs":[{{"name":"bytes","configuration":{{"endian":"little"}}}},
            {{"name":"crc32c"}}],"index_location":"start"}}}}]"#
        );
        std::thread::spawn(move || {
            let a = array(&sharded);
            let chain = reuse_contexts(&a.zarrs().codecs()).expect("an inner zstd codec");
            let options = CodecMetadataOptions::default();
            assert_eq!(
                chain.create_metadatas(&options),
                a.zarrs().codecs().create_metadatas(&options),
                "index codecs and location kept"
            );
            let (encoded, values) = encoded(&a);
            let chunk = a.decode_chunk_from(&[0, 0], Some(&encoded), PathBuf::new);
            assert_eq!(chunk.unwrap().bytes, values);
            assert!(
                has_context(),
                "the inner chunks went through a kept context"
            );
        })
        .join()
        .unwrap();
        for codecs in [
            r#"[{"name":"bytes","configuration":{"endian":"little"}},{"name":"gzip","configuration":{"level":1}}]"#,
            r#"[{"name":"sharding_indexed","configuration":{"chunk_shape":[1,3000],
                "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],
                "index_codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}}]"#,
        ] {
            assert!(
                reuse_contexts(&array(codecs).zarrs().codecs()).is_none(),
                "{codecs}"
            );
        }
    }

    #[test]
    fn decoding_into_a_buffer_equals_decoding_whole_in_place_or_not() {
        let sharded = format!(
            r#"[{{"name":"sharding_indexed","configuration":{{"chunk_shape":[1,3000],
            "codecs":{ZSTD},"index_codecs":[{{"name":"bytes","configuration":{{"endian":"little"}}}}],
            "index_location":"end"}}}}]"#
        );
        let cases = [
            (ZSTD.to_string(), true),
            (
                r#"[{"name":"bytes","configuration":{"endian":"big"}},{"name":"zstd","configuration":{"level":1,"checksum":false}}]"#.into(),
                false,
            ),
            (
                r#"[{"name":"transpose","configuration":{"order":[1,0]}},
                {"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1,"checksum":false}}]"#.into(),
                false,
            ),
            (
                r#"[{"name":"bytes","configuration":{"endian":"little"}},{"name":"gzip","configuration":{"level":1}}]"#.into(),
                false,
            ),
            (sharded, false),
        ];
        for (codecs, in_place) in cases {
            let a = array(&codecs);
            assert_eq!(a.decodes_in_place(), in_place, "{codecs}");
            let (encoded, _) = encoded(&a);
            let whole = a
                .decode_chunk_from(&[0, 0], Some(&encoded), PathBuf::new)
                .unwrap();
            let mut out = vec![0xAAu8; 48_000];
            a.decode_chunk_into(&[0, 0], Some(&encoded), &mut out, PathBuf::new)
                .unwrap();
            assert_eq!(out, whole.bytes, "{codecs}");
            // A missing chunk is the fill value; a truncated one an error naming its key.
            a.decode_chunk_into(&[0, 0], None, &mut out, PathBuf::new)
                .unwrap();
            assert!(out.iter().all(|&b| b == 0), "{codecs}");
            let e = a
                .decode_chunk_into(
                    &[0, 0],
                    Some(&encoded[..encoded.len() / 2]),
                    &mut out,
                    PathBuf::new,
                )
                .unwrap_err()
                .to_string();
            assert!(e.contains("`a/c/0/0`"), "{codecs}: {e}");
        }
        // Frames of fewer bytes than the chunk are corrupt too, not a chunk with a stale tail.
        let a = array(ZSTD);
        let short = zstd::bulk::compress(&[7u8; 47_996], 3).unwrap();
        let mut out = vec![0u8; 48_000];
        let e = a
            .decode_chunk_into(&[0, 0], Some(&short), &mut out, PathBuf::new)
            .unwrap_err()
            .to_string();
        assert!(e.contains("decoded 47996 bytes, expected 48000"), "{e}");
        let big = zstd::bulk::compress(&[7u8; 48_001], 3).unwrap();
        let e = a
            .decode_chunk_into(&[0, 0], Some(&big), &mut out, PathBuf::new)
            .unwrap_err()
            .to_string();
        assert!(e.contains("48001 bytes, more than the 48000"), "{e}");
    }
}
