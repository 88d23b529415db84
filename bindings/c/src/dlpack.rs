//! DLPack 1.x: the `DLManagedTensorVersioned` a batch array is exported as.
//!
//! Layout follows `dlpack.h` (v1.0). The manager context owns a reference to the batch, so the
//! buffer lives until the consumer calls the deleter, whatever happens to the batch handle or the
//! dataset in between. The deleter only drops that reference: it never blocks and may run on any
//! thread.

use std::ffi::c_void;
use std::sync::Arc;

use insitubatch::{Batch, DType};

/// DLPack version of the exported structs.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// DLPack minor version.
pub const DLPACK_MINOR_VERSION: u32 = 0;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDevice {
    /// `kDLCPU` = 1.
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDataType {
    /// `kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLComplex` 5, `kDLBool` 6.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Start of the data (256-byte aligned: batch buffers are page aligned).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// NULL: C-contiguous.
    pub strides: *mut i64,
    /// 0.
    pub byte_offset: u64,
}

/// `DLManagedTensorVersioned` (DLPack 1.0).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of this struct.
    pub version: DLPackVersion,
    /// Owned by the producer; the consumer passes it back through `deleter`.
    pub manager_ctx: *mut c_void,
    /// Call once when done with the tensor; frees it.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// Bit 0 read-only, bit 1 is-copied. 0: writable, not a copy.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The allocation behind one exported tensor: the struct the consumer sees comes first, so the
/// pointer to it is the pointer to the whole context.
#[repr(C)]
struct Export {
    tensor: DLManagedTensorVersioned,
    shape: Vec<i64>,
    batch: Arc<Batch>,
}

fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::Bool => (6, 8),
        DType::Int8 => (0, 8),
        DType::Int16 => (0, 16),
        DType::Int32 => (0, 32),
        DType::Int64 => (0, 64),
        DType::Uint8 => (1, 8),
        DType::Uint16 => (1, 16),
        DType::Uint32 => (1, 32),
        DType::Uint64 => (1, 64),
        DType::Float16 => (2, 16),
        DType::Float32 => (2, 32),
        DType::Float64 => (2, 64),
        DType::Complex64 => (5, 64),
        DType::Complex128 => (5, 128),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

unsafe extern "C" fn delete_export(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` is the first field of an `Export` made by `export` (repr(C)), and the DLPack
    // contract is that the deleter is called once.
    drop(unsafe { Box::from_raw(t.cast::<Export>()) });
}

/// Exports array `index` of `batch` (already checked to exist).
pub(crate) fn export(batch: &Arc<Batch>, label: &str) -> Option<*mut DLManagedTensorVersioned> {
    let array = batch.array(label)?;
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let mut b = Box::new(Export {
        tensor: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR_VERSION,
                minor: DLPACK_MINOR_VERSION,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
            flags: 0,
            dl_tensor: DLTensor {
                data: array.as_ptr() as *mut c_void,
                device: DLDevice {
                    device_type: 1,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: dl_dtype(array.dtype()),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape,
        batch: Arc::clone(batch),
    });
    // The shape vector's heap buffer does not move when the box is turned into a raw pointer.
    b.tensor.dl_tensor.shape = b.shape.as_mut_ptr();
    let raw = Box::into_raw(b);
    // SAFETY: `raw` is a valid, uniquely owned Export.
    unsafe { (*raw).tensor.manager_ctx = raw.cast() };
    Some(raw.cast())
}

/// Calls a tensor's deleter (for bindings that cannot call a function pointer cheaply). NULL is
/// accepted.
///
/// # Safety
/// `t` is NULL or a tensor exported by this library whose deleter was not called yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_dlpack_delete(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: per the contract, a live exported tensor; its deleter is `delete_export`.
    if let Some(d) = unsafe { (*t).deleter } {
        // SAFETY: forwarded contract; called once.
        unsafe { d(t) };
    }
}
