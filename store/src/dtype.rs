//! The element types we can decode and hand out as dense arrays.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A fixed-size numeric (or boolean) element type, stored native-endian after decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum DType {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Float16,
    Float32,
    Float64,
    Complex64,
    Complex128,
}

impl DType {
    /// Parses the Zarr v3 data type name (`float32`, `uint8`, ...).
    pub fn from_zarr_name(name: &str) -> Option<Self> {
        Some(match name {
            "bool" => DType::Bool,
            "int8" => DType::Int8,
            "int16" => DType::Int16,
            "int32" => DType::Int32,
            "int64" => DType::Int64,
            "uint8" => DType::Uint8,
            "uint16" => DType::Uint16,
            "uint32" => DType::Uint32,
            "uint64" => DType::Uint64,
            "float16" => DType::Float16,
            "float32" => DType::Float32,
            "float64" => DType::Float64,
            "complex64" => DType::Complex64,
            "complex128" => DType::Complex128,
            _ => return None,
        })
    }

    /// The name numpy and Zarr v3 use.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Uint8 => "uint8",
            DType::Uint16 => "uint16",
            DType::Uint32 => "uint32",
            DType::Uint64 => "uint64",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
        }
    }

    /// The numpy array-protocol type string of the decoded (native-endian) data, as `.npy`
    /// headers and `__array_interface__` spell it: `<f4`, `|u1`, `<c16`.
    pub fn npy_descr(self) -> String {
        let kind = match self {
            DType::Bool => 'b',
            DType::Int8 | DType::Int16 | DType::Int32 | DType::Int64 => 'i',
            DType::Uint8 | DType::Uint16 | DType::Uint32 | DType::Uint64 => 'u',
            DType::Float16 | DType::Float32 | DType::Float64 => 'f',
            DType::Complex64 | DType::Complex128 => 'c',
        };
        let order = match self.size_bytes() {
            1 => '|',
            _ if cfg!(target_endian = "little") => '<',
            _ => '>',
        };
        format!("{order}{kind}{}", self.size_bytes())
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::Int8 | DType::Uint8 => 1,
            DType::Int16 | DType::Uint16 | DType::Float16 => 2,
            DType::Int32 | DType::Uint32 | DType::Float32 => 4,
            DType::Int64 | DType::Uint64 | DType::Float64 | DType::Complex64 => 8,
            DType::Complex128 => 16,
        }
    }

    /// True for floating-point (and complex) types, which have NaN.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float16 | DType::Float32 | DType::Float64 | DType::Complex64 | DType::Complex128
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in [
            DType::Bool,
            DType::Uint8,
            DType::Int16,
            DType::Float32,
            DType::Float64,
            DType::Complex128,
        ] {
            assert_eq!(DType::from_zarr_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_zarr_name("string"), None);
        assert_eq!(DType::Float64.size_bytes(), 8);
        assert_eq!(DType::Uint8.npy_descr(), "|u1");
        assert_eq!(DType::Float32.npy_descr(), "<f4");
        assert_eq!(DType::Complex128.npy_descr(), "<c16");
        assert!(!DType::Int16.is_float());
    }
}
