//! The memory a caller hands a collective: any object with the buffer
//! protocol (numpy arrays, bytearray, array.array, memoryview) or with
//! `__dlpack__` (torch tensors on the CPU or a GPU, bfloat16 included),
//! checked (contiguous, aligned, an element type the engine has, on the
//! expected device) before the engine sees its address.
//!
//! The buffer protocol's C API joined the limited API only in 3.11, so pyo3
//! offers it to abi3 builds from 3.11 on. Its functions and the `Py_buffer`
//! layout are the same in every CPython 3 (3.11 made that layout stable
//! because it had not changed since 3.3), so this module declares them
//! itself and one abi3 wheel takes buffers on 3.9 and 3.10 too.

use std::ffi::{c_char, c_int, c_void, CStr};

use pcieipc::engine::DType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi::{PyObject, Py_ssize_t};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

/// CPython's `Py_buffer`, as `Include/pybuffer.h` has it since 3.3.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: Py_ssize_t,
    itemsize: Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut Py_ssize_t,
    strides: *mut Py_ssize_t,
    suboffsets: *mut Py_ssize_t,
    internal: *mut c_void,
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_C_CONTIGUOUS`: C-contiguous memory, or the exporter refuses.
const PYBUF_C_CONTIGUOUS: c_int = 0x0038;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// Where a buffer's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Host,
    Cuda(i32),
}

/// A contiguous run of `count` elements of `dtype` at `address`, held
/// alive (and, for buffer-protocol exporters, unresizable) while this
/// lives.
pub struct Memory {
    pub address: usize,
    pub count: usize,
    pub dtype: DType,
    pub device: Device,
    _hold: Hold,
}

enum Hold {
    Buffer(Box<RawBuffer>),
    /// The capsule owns the exporter's DLManagedTensor: left unconsumed,
    /// its destructor calls the deleter when it is dropped.
    DlPack {
        _capsule: Py<PyAny>,
    },
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Hold::Buffer(view) = self {
            // Releasing needs the interpreter: taken if this thread lacks it.
            Python::attach(|_| {
                // SAFETY: `view` was filled by a successful PyObject_GetBuffer
                // and is released once, here.
                unsafe { PyBuffer_Release(&mut **view) }
            });
        }
    }
}

// SAFETY: `Memory` is a description of memory (an address and its extent)
// plus a hold that is released under the interpreter lock (`Hold::drop`);
// the engine reads and writes the memory from the thread that runs the call
// while the caller's thread waits for it.
unsafe impl Send for Memory {}

// SAFETY: shared references only read the description; the hold is touched
// only by `drop`.
unsafe impl Sync for Memory {}

impl Memory {
    /// `object`'s memory, writable if `writable`: through the buffer
    /// protocol where the object has it, else through `__dlpack__`.
    pub fn of(object: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Memory> {
        match Memory::from_buffer(object, what, writable)? {
            Some(memory) => Ok(memory),
            None if object.hasattr("__dlpack__")? => Memory::from_dlpack(object, what, writable),
            None => Err(PyTypeError::new_err(format!(
                "{what}: needs a C-contiguous buffer (numpy array, bytearray, memoryview) or a \
                 tensor with __dlpack__, got {}",
                object.get_type().name()?
            ))),
        }
    }

    /// The element type `self` (an input) and `output` share, or an
    /// `InvalidArgument` of `what` on `rank` when they differ.
    pub fn same_type_as(&self, output: &Memory, what: &str, rank: usize) -> PyResult<DType> {
        if self.dtype == output.dtype {
            Ok(self.dtype)
        } else {
            Err(crate::errors::invalid(
                format!(
                    "{what}: input is {}, output is {}",
                    dtype_name(self.dtype),
                    dtype_name(output.dtype)
                ),
                rank,
            ))
        }
    }

    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size_bytes()
    }

    /// Whether this and `other` share any byte (and are not the same run).
    pub fn overlaps_partly(&self, other: &Memory) -> bool {
        let (a, b) = (self.address, other.address);
        let (a_end, b_end) = (a + self.bytes(), b + other.bytes());
        a < b_end && b < a_end && !(a == b && self.bytes() == other.bytes())
    }

    /// `object`'s memory through the buffer protocol; `None` when it does
    /// not export buffers at all (a torch tensor: DLPack is tried next).
    fn from_buffer(
        object: &Bound<'_, PyAny>,
        what: &str,
        writable: bool,
    ) -> PyResult<Option<Memory>> {
        let mut view = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = PYBUF_C_CONTIGUOUS | PYBUF_FORMAT | if writable { PYBUF_WRITABLE } else { 0 };
        // SAFETY: `object` is a live object (the interpreter is held) and
        // `view` a writable Py_buffer-shaped block.
        if unsafe { PyObject_GetBuffer(object.as_ptr(), &mut *view, flags) } != 0 {
            let cause = PyErr::fetch(object.py());
            // TypeError: no buffer support; BufferError: a buffer, but not
            // one this call can take (strided, read-only).
            if cause.is_instance_of::<PyTypeError>(object.py()) {
                return Ok(None);
            }
            return Err(PyTypeError::new_err(format!(
                "{what}: needs a C-contiguous{} buffer: {cause}",
                if writable { ", writable" } else { "" }
            )));
        }
        // From here `view` is released when `hold` drops.
        let format = if view.format.is_null() {
            "B".to_owned()
        } else {
            // SAFETY: the exporter filled `format` with a NUL-terminated
            // string that lives as long as the view.
            unsafe { CStr::from_ptr(view.format) }
                .to_string_lossy()
                .into_owned()
        };
        let (address, len, itemsize) = (view.buf as usize, view.len, view.itemsize);
        let hold = Hold::Buffer(view);
        let dtype = dtype_of_format(&format, itemsize as usize).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what}: element format {format:?} ({itemsize} bytes) is not one the engine \
                 reduces (float32, float64, float16, bfloat16, int32, int64, uint8)"
            ))
        })?;
        Memory::checked(
            what,
            address,
            len as usize / dtype.size_bytes(),
            dtype,
            Device::Host,
            hold,
        )
        .map(Some)
    }

    fn from_dlpack(object: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Memory> {
        let capsule = dlpack_capsule(object)?;
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err(format!("{what}: __dlpack__ did not return a capsule"))
        })?;
        let tensor = if let Ok(pointer) = capsule.pointer_checked(Some(c"dltensor_versioned")) {
            // SAFETY: a "dltensor_versioned" capsule holds a
            // DLManagedTensorVersioned (DLPack 1.x), alive while the capsule
            // is unconsumed; only its plain fields are read, under the
            // interpreter lock.
            let managed = unsafe { pointer.cast::<DlManagedTensorVersioned>().as_ref() };
            if managed.version.major != 1 {
                return Err(PyTypeError::new_err(format!(
                    "{what}: DLPack {}.{} is not a version this reads (1.x)",
                    managed.version.major, managed.version.minor
                )));
            }
            if writable && managed.flags & (DLPACK_FLAG_READ_ONLY | DLPACK_FLAG_IS_COPIED) != 0 {
                return Err(PyValueError::new_err(format!(
                    "{what}: the exporter hands this memory out {}: an output must be memory the \
                     result can be written into",
                    if managed.flags & DLPACK_FLAG_READ_ONLY != 0 {
                        "read-only"
                    } else {
                        "as a copy"
                    }
                )));
            }
            &managed.dl_tensor
        } else {
            let pointer = capsule.pointer_checked(Some(c"dltensor")).map_err(|_| {
                PyTypeError::new_err(format!(
                    "{what}: __dlpack__ returned a capsule that is not an unused DLPack tensor"
                ))
            })?;
            // SAFETY: a "dltensor" capsule holds a DLManagedTensor (DLPack's
            // first ABI), alive while the capsule is unconsumed; only its
            // plain fields are read, under the interpreter lock.
            unsafe { &pointer.cast::<DlManagedTensor>().as_ref().dl_tensor }
        };
        let shape: Vec<i64> = match usize::try_from(tensor.ndim) {
            Ok(0) => Vec::new(),
            // SAFETY: DLPack: `shape` holds `ndim` extents.
            Ok(ndim) => unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }.to_vec(),
            Err(_) => {
                return Err(PyValueError::new_err(format!(
                    "{what}: the exporter says the tensor has {} dimensions",
                    tensor.ndim
                )))
            }
        };
        if !tensor.strides.is_null() {
            // SAFETY: DLPack: non-null `strides` holds `ndim` strides.
            let strides = unsafe { std::slice::from_raw_parts(tensor.strides, shape.len()) };
            if !is_row_major(&shape, strides) {
                return Err(PyValueError::new_err(format!(
                    "{what}: the tensor is not contiguous (shape {shape:?}, strides \
                     {strides:?}): call .contiguous() first"
                )));
            }
        }
        let dtype = dtype_of_dlpack(tensor.dtype).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what}: element type (DLPack code {}, {} bits, {} lanes) is not one the engine \
                 reduces (float32, float64, float16, bfloat16, int32, int64, uint8)",
                tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
            ))
        })?;
        let device = match tensor.device.device_type {
            DL_CPU | DL_CUDA_HOST => Device::Host,
            DL_CUDA => Device::Cuda(tensor.device.device_id),
            other => {
                return Err(PyValueError::new_err(format!(
                    "{what}: memory on DLPack device type {other} is neither host nor CUDA"
                )))
            }
        };
        // What the exporter says is checked before its address is used: no
        // negative extent, and a size and an end address that fit.
        let count = shape
            .iter()
            .try_fold(1usize, |count, &extent| {
                count.checked_mul(usize::try_from(extent).ok()?)
            })
            .filter(|count| {
                count
                    .checked_mul(dtype.size_bytes())
                    .and_then(|bytes| (tensor.data as usize).checked_add(bytes))
                    .and_then(|end| end.checked_add(tensor.byte_offset as usize))
                    .is_some_and(|end| end <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{what}: the exporter's shape {shape:?} of {} elements at {:#x} + {} is not \
                     memory that can exist",
                    dtype_name(dtype),
                    tensor.data as usize,
                    tensor.byte_offset
                ))
            })?;
        let address = tensor.data as usize + tensor.byte_offset as usize;
        Memory::checked(
            what,
            address,
            count,
            dtype,
            device,
            Hold::DlPack {
                _capsule: capsule.into_any().unbind(),
            },
        )
    }

    fn checked(
        what: &str,
        address: usize,
        count: usize,
        dtype: DType,
        device: Device,
        hold: Hold,
    ) -> PyResult<Memory> {
        let align = dtype.size_bytes();
        if count > 0 && !address.is_multiple_of(align) {
            return Err(PyValueError::new_err(format!(
                "{what}: address {address:#x} is not aligned to its {align}-byte {} elements",
                dtype_name(dtype)
            )));
        }
        Ok(Memory {
            address,
            count,
            dtype,
            device,
            _hold: hold,
        })
    }
}

/// The element type's name as numpy and torch spell it.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::Bf16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
    }
}

/// `object.__dlpack__()`, as DLPack 1.x where the exporter speaks it (its
/// flags say whether the memory is read-only), else DLPack's first ABI.
/// stream=-1: the producer must not synchronise anything; the caller orders
/// the streams (pcieipc.torch does, with events).
fn dlpack_capsule<'py>(object: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = pyo3::types::PyDict::new(object.py());
    if is_cuda(object)? {
        kwargs.set_item("stream", -1)?;
    }
    let legacy = kwargs.copy()?;
    kwargs.set_item("max_version", (1, 0))?;
    match object.call_method("__dlpack__", (), Some(&kwargs)) {
        // An exporter from before DLPack 1.0 has no `max_version`.
        Err(error) if error.is_instance_of::<PyTypeError>(object.py()) => {
            object.call_method("__dlpack__", (), Some(&legacy))
        }
        result => result,
    }
}

fn is_cuda(object: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !object.hasattr("__dlpack_device__")? {
        return Ok(false);
    }
    let (device_type, _): (i32, i32) = object.call_method0("__dlpack_device__")?.extract()?;
    Ok(device_type == DL_CUDA)
}

/// The engine's type for a struct-module format and item size.
fn dtype_of_format(format: &str, itemsize: usize) -> Option<DType> {
    let code = format.trim_start_matches(['@', '=', '<']);
    let dtype = match code {
        "f" => DType::F32,
        "d" => DType::F64,
        "e" => DType::F16,
        "B" => DType::U8,
        "i" | "l" | "q" | "n" if itemsize == 4 => DType::I32,
        "i" | "l" | "q" | "n" if itemsize == 8 => DType::I64,
        _ => return None,
    };
    (dtype.size_bytes() == itemsize).then_some(dtype)
}

fn dtype_of_dlpack(dtype: DlDataType) -> Option<DType> {
    if dtype.lanes != 1 {
        return None;
    }
    Some(match (dtype.code, dtype.bits) {
        (DL_FLOAT, 32) => DType::F32,
        (DL_FLOAT, 64) => DType::F64,
        (DL_FLOAT, 16) => DType::F16,
        (DL_BFLOAT, 16) => DType::Bf16,
        (DL_INT, 32) => DType::I32,
        (DL_INT, 64) => DType::I64,
        (DL_UINT, 8) => DType::U8,
        _ => return None,
    })
}

/// Whether `strides` (in elements) are those of a C-contiguous `shape`
/// (extents of 1 may carry any stride).
fn is_row_major(shape: &[i64], strides: &[i64]) -> bool {
    let mut expected = 1;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected *= extent;
    }
    true
}

// DLPack (dlpack.h, v0.8: what `__dlpack__()` returns without max_version).
const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// DLPack 1.x: the versioned tensor, whose flags say read-only or copied.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

const DLPACK_FLAG_READ_ONLY: u64 = 1 << 0;
const DLPACK_FLAG_IS_COPIED: u64 = 1 << 1;

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}
