//! Arrays in, arrays out, through DLPack: the one way numpy arrays and PyTorch tensors (CPU
//! and CUDA) reach the Rust code, without copies and without a Python-side table of pointers,
//! dtypes or lengths.
//!
//! Every argument is either a DLPack capsule (`torch.utils.dlpack.to_dlpack(t)`, the fast path
//! of the PyTorch glue) or an object with `__dlpack__` (numpy arrays, tensors). The capsule is
//! consumed as the DLPack protocol says (renamed `used_dltensor`, its deleter called when the
//! [`Tensor`] drops), and everything the computation relies on is checked here, once: device,
//! dtype, contiguity (or a row stride, for logits), alignment, read-only flag, and that no
//! output overlaps another argument (a Rust `&mut` slice must not alias).

use std::ffi::{CStr, c_char, c_void};
use std::marker::PhantomData;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

use crate::error::invalid;

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

type Deleter = Option<unsafe extern "C" fn(*mut c_void)>;

/// DLPack < 1.0 (`"dltensor"`).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Deleter,
}

/// DLPack >= 1.0 (`"dltensor_versioned"`).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: [u32; 2],
    manager_ctx: *mut c_void,
    deleter: Deleter,
    flags: u64,
    dl_tensor: DlTensor,
}

const FLAG_READ_ONLY: u64 = 1;
const DEVICE_CPU: i32 = 1;
const DEVICE_CUDA: i32 = 2;
const DEVICE_CUDA_HOST: i32 = 3;
const CODE_INT: u8 = 0;
const CODE_UINT: u8 = 1;
const CODE_FLOAT: u8 = 2;
const CODE_BFLOAT: u8 = 4;
const CODE_BOOL: u8 = 6;

/// The element types the bindings read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `bfloat16`.
    Bf16,
    /// `float16`.
    F16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint32`.
    U32,
    /// `uint8`.
    U8,
    /// `bool` (one byte, 0 or 1).
    Bool,
    /// Anything else (named in error messages by its DLPack code and bits).
    Other(u8, u8),
}

impl Dt {
    fn from_dl(t: DlDataType) -> Dt {
        if t.lanes != 1 {
            return Dt::Other(t.code, t.bits);
        }
        match (t.code, t.bits) {
            (CODE_FLOAT, 32) => Dt::F32,
            (CODE_FLOAT, 64) => Dt::F64,
            (CODE_FLOAT, 16) => Dt::F16,
            (CODE_BFLOAT, 16) => Dt::Bf16,
            (CODE_INT, 32) => Dt::I32,
            (CODE_INT, 64) => Dt::I64,
            (CODE_UINT, 32) => Dt::U32,
            (CODE_UINT, 8) => Dt::U8,
            (CODE_BOOL, 8) => Dt::Bool,
            (c, b) => Dt::Other(c, b),
        }
    }

    /// The name numpy and PyTorch use.
    pub fn name(self) -> String {
        match self {
            Dt::F32 => "float32".into(),
            Dt::F64 => "float64".into(),
            Dt::Bf16 => "bfloat16".into(),
            Dt::F16 => "float16".into(),
            Dt::I32 => "int32".into(),
            Dt::I64 => "int64".into(),
            Dt::U32 => "uint32".into(),
            Dt::U8 => "uint8".into(),
            Dt::Bool => "bool".into(),
            Dt::Other(c, b) => format!("DLPack dtype (code {c}, {b} bits)"),
        }
    }

    /// Bytes per element (0 for an unknown dtype).
    pub fn size(self) -> usize {
        match self {
            Dt::F64 | Dt::I64 => 8,
            Dt::F32 | Dt::I32 | Dt::U32 => 4,
            Dt::Bf16 | Dt::F16 => 2,
            Dt::U8 | Dt::Bool => 1,
            Dt::Other(_, b) => usize::from(b) / 8,
        }
    }
}

/// A Rust element type with its DLPack dtypes.
pub trait Elem: Copy + Send + Sync + 'static {
    /// Whether a tensor of `dt` holds values of this type, bit for bit.
    fn accepts(dt: Dt) -> bool;
    /// What to name in an error message.
    const EXPECT: &'static str;
}

macro_rules! elem {
    ($t:ty, $expect:literal, $($dt:ident)|+) => {
        impl Elem for $t {
            fn accepts(dt: Dt) -> bool {
                matches!(dt, $(Dt::$dt)|+)
            }
            const EXPECT: &'static str = $expect;
        }
    };
}
elem!(f32, "float32", F32);
elem!(f64, "float64", F64);
elem!(half::bf16, "bfloat16", Bf16);
elem!(half::f16, "float16", F16);
elem!(i32, "int32", I32);
elem!(i64, "int64", I64);
// Offsets: care reads `u32`; int32 (what PyTorch has) has the same bits for every valid offset,
// and a negative one becomes a huge `u32`, which the layout check refuses.
elem!(u32, "int32 or uint32", U32 | I32);
// Masks: any non-zero byte counts; bool tensors are bytes of 0 or 1.
elem!(u8, "uint8 or bool", U8 | Bool);

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory (including CUDA pinned host memory).
    Cpu,
    /// A CUDA device, by ordinal.
    Cuda(i32),
}

/// One consumed DLPack tensor, named after the argument it came from.
pub struct Tensor<'py> {
    name: &'static str,
    managed: *mut c_void,
    deleter: Deleter,
    t: *const DlTensor,
    read_only: bool,
    _py: PhantomData<Python<'py>>,
}

impl Drop for Tensor<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.deleter {
            // SAFETY: the capsule was renamed `used_dltensor` when it was consumed, so this is
            // the one call of the producer's deleter the protocol asks of the consumer.
            unsafe { d(self.managed) }
        }
    }
}

const NAME_V0: &CStr = c"dltensor";
const NAME_V1: &CStr = c"dltensor_versioned";
const USED_V0: &CStr = c"used_dltensor";
const USED_V1: &CStr = c"used_dltensor_versioned";

/// The capsule of `obj`: itself, or `obj.__dlpack__()` (with `max_version=(1, 0)` when the
/// plain call refuses, which is how numpy >= 2.1 exports a read-only array).
fn capsule_of<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    if obj.is_instance_of::<PyCapsule>() {
        return Ok(obj.clone());
    }
    let py = obj.py();
    if !obj.hasattr("__dlpack__")? {
        return Err(invalid(format!(
            "{name}: expected a numpy array or a torch tensor (an object with __dlpack__), got {}",
            obj.get_type().name()?
        )));
    }
    match obj.call_method0("__dlpack__") {
        Ok(c) => Ok(c),
        Err(e) if e.is_instance_of::<PyBufferError>(py) => {
            let kw = pyo3::types::PyDict::new(py);
            kw.set_item("max_version", PyTuple::new(py, [1u32, 0u32])?)?;
            obj.call_method("__dlpack__", (), Some(&kw)).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

impl<'py> Tensor<'py> {
    /// Consumes the DLPack tensor of `obj` (a capsule or an object with `__dlpack__`).
    pub fn take(obj: &Bound<'py, PyAny>, name: &'static str) -> PyResult<Tensor<'py>> {
        let cap = capsule_of(obj, name)?;
        let raw = cap.as_ptr();
        // SAFETY: `raw` is a live object (held by `cap`); the capsule API checks the type and
        // the name and sets a Python error on mismatch.
        unsafe {
            let cname: *const c_char = ffi::PyCapsule_GetName(raw);
            if cname.is_null() {
                return Err(PyErr::fetch(cap.py()));
            }
            let cname = CStr::from_ptr(cname);
            let (versioned, used) = if cname == NAME_V0 {
                (false, USED_V0)
            } else if cname == NAME_V1 {
                (true, USED_V1)
            } else {
                return Err(invalid(format!(
                    "{name}: a DLPack capsule can be used once (this one is named {cname:?})"
                )));
            };
            let p = ffi::PyCapsule_GetPointer(raw, cname.as_ptr());
            if p.is_null() {
                return Err(PyErr::fetch(cap.py()));
            }
            if ffi::PyCapsule_SetName(raw, used.as_ptr()) != 0 {
                return Err(PyErr::fetch(cap.py()));
            }
            let (t, deleter, read_only) = if versioned {
                let m = p.cast::<DlManagedTensorVersioned>();
                (
                    &raw const (*m).dl_tensor,
                    (*m).deleter,
                    (*m).flags & FLAG_READ_ONLY != 0,
                )
            } else {
                let m = p.cast::<DlManagedTensor>();
                (&raw const (*m).dl_tensor, (*m).deleter, false)
            };
            Ok(Tensor {
                name,
                managed: p,
                deleter,
                t,
                read_only,
                _py: PhantomData,
            })
        }
    }

    /// [`Tensor::take`] for an optional argument (`None` stays `None`).
    pub fn take_opt(
        obj: Option<&Bound<'py, PyAny>>,
        name: &'static str,
    ) -> PyResult<Option<Tensor<'py>>> {
        match obj {
            Some(o) if !o.is_none() => Ok(Some(Tensor::take(o, name)?)),
            _ => Ok(None),
        }
    }

    fn dl(&self) -> &DlTensor {
        // SAFETY: the managed tensor stays valid until the deleter runs in `drop`.
        unsafe { &*self.t }
    }

    /// The argument's name (for messages).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The element type.
    pub fn dtype(&self) -> Dt {
        Dt::from_dl(self.dl().dtype)
    }

    /// Where the data lives.
    pub fn device(&self) -> PyResult<Device> {
        let d = self.dl().device;
        match d.device_type {
            DEVICE_CPU | DEVICE_CUDA_HOST => Ok(Device::Cpu),
            DEVICE_CUDA => Ok(Device::Cuda(d.device_id)),
            other => Err(invalid(format!(
                "{}: DLPack device type {other} is neither the CPU nor CUDA",
                self.name
            ))),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        let dl = self.dl();
        let n = usize::try_from(dl.ndim).unwrap_or(0);
        if n == 0 || dl.shape.is_null() {
            return &[];
        }
        // SAFETY: DLPack: `shape` holds `ndim` entries while the tensor lives.
        unsafe { std::slice::from_raw_parts(dl.shape, n) }
    }

    fn strides(&self) -> Option<&[i64]> {
        let dl = self.dl();
        let n = usize::try_from(dl.ndim).unwrap_or(0);
        if n == 0 || dl.strides.is_null() {
            return None;
        }
        // SAFETY: DLPack: `strides`, when not null, holds `ndim` entries.
        Some(unsafe { std::slice::from_raw_parts(dl.strides, n) })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?))
            .unwrap_or(0)
    }

    /// Whether the elements are dense in row-major order (size-1 dimensions may have any
    /// stride, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = self.strides() else {
            return true;
        };
        // An empty tensor has no element to be out of place (numpy gives it strides of 0).
        if self.shape().contains(&0) {
            return true;
        }
        let mut expect = 1i64;
        for (&d, &s) in self.shape().iter().zip(strides).rev() {
            if d != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(d);
        }
        true
    }

    /// The address of the first element (`data + byte_offset`).
    pub fn addr(&self) -> u64 {
        let dl = self.dl();
        (dl.data as u64).wrapping_add(dl.byte_offset)
    }

    /// The byte range the elements occupy (for the overlap check), given `span` elements from
    /// the first.
    fn byte_range(&self, span: usize) -> (u64, u64) {
        let start = self.addr();
        let len = (span as u64).saturating_mul(self.dtype().size() as u64);
        (start, start.saturating_add(len))
    }

    /// The elements' byte range (contiguous tensors; rows with their stride for 2-D).
    pub fn extent(&self) -> (u64, u64) {
        let shape = self.shape();
        let span = match (self.strides(), shape) {
            (Some(st), [rows, cols]) if *rows > 0 && *cols > 0 => {
                ((rows - 1) * st[0].max(0) + cols) as usize
            }
            _ => self.numel(),
        };
        self.byte_range(span)
    }

    fn expect<T: Elem>(&self, device: Device) -> PyResult<()> {
        let dt = self.dtype();
        if !T::accepts(dt) {
            return Err(invalid(format!(
                "{}: expected {}, got {}",
                self.name,
                T::EXPECT,
                dt.name()
            )));
        }
        if self.device()? != device {
            return Err(invalid(format!(
                "{}: on {:?}, expected {:?} like the other arguments",
                self.name,
                self.device()?,
                device
            )));
        }
        if self.numel() > 0 && !self.addr().is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(invalid(format!("{}: data is not aligned", self.name)));
        }
        Ok(())
    }

    fn expect_dense<T: Elem>(&self, device: Device) -> PyResult<()> {
        self.expect::<T>(device)?;
        if !self.is_contiguous() {
            return Err(invalid(format!(
                "{}: must be contiguous (call .contiguous() / np.ascontiguousarray)",
                self.name
            )));
        }
        Ok(())
    }

    /// The elements as a host slice: dtype `T`, on the CPU, contiguous.
    pub fn slice<T: Elem>(&self) -> PyResult<&[T]> {
        self.expect_dense::<T>(Device::Cpu)?;
        let n = self.numel();
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: checked above: host memory of `n` aligned, initialized elements of a dtype
        // with the bits of `T`, alive while `self` is (the producer keeps it until the
        // deleter runs).
        Ok(unsafe { std::slice::from_raw_parts(self.addr() as *const T, n) })
    }

    /// The elements as a writable host slice (an output). Callers run [`check_outputs`]
    /// first, so that no other argument of the call aliases it.
    pub fn slice_mut<T: Elem>(&mut self) -> PyResult<&mut [T]> {
        self.expect_dense::<T>(Device::Cpu)?;
        if self.read_only {
            return Err(invalid(format!("{}: the output is read-only", self.name)));
        }
        let n = self.numel();
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as `slice`, writable (not flagged read-only), and not aliased by any other
        // argument of the call (`check_outputs`); `&mut self` makes the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut T, n) })
    }

    /// A 2-D `[rows, cols]` matrix whose rows may be further apart than `cols` (a slice
    /// `x[:, :V]` of a wider buffer): `(data, rows, cols, row_stride)` on the host, `data`
    /// covering `(rows - 1) * row_stride + cols` elements.
    pub fn rows<T: Elem>(&self) -> PyResult<(&[T], usize, usize, usize)> {
        let (rows, cols, stride) = self.matrix_shape::<T>(Device::Cpu)?;
        if rows == 0 || cols == 0 {
            return Ok((&[], rows, cols, stride));
        }
        let span = (rows - 1) * stride + cols;
        // SAFETY: the producer's tensor covers `span` elements from the first: the last row
        // starts at `(rows - 1) * stride` and holds `cols` dense elements.
        let data = unsafe { std::slice::from_raw_parts(self.addr() as *const T, span) };
        Ok((data, rows, cols, stride))
    }

    /// The 2-D layout `(rows, cols, row_stride)` on `device`, checked: dtype `T`, unit column
    /// stride, row stride `>= cols`.
    pub fn matrix_shape<T: Elem>(&self, device: Device) -> PyResult<(usize, usize, usize)> {
        self.expect::<T>(device)?;
        let shape = self.shape();
        let [rows, cols] = shape else {
            return Err(invalid(format!(
                "{}: expected a 2-D [rows, V] tensor, got shape {shape:?}",
                self.name
            )));
        };
        let (rows, cols) = (*rows as usize, *cols as usize);
        let (rs, cs) = match self.strides() {
            None => (cols as i64, 1),
            Some(st) => (st[0], st[1]),
        };
        let stride = if rows <= 1 { cols as i64 } else { rs };
        if (cols > 1 && cs != 1) || stride < cols as i64 {
            return Err(invalid(format!(
                "{}: rows must be dense and not overlap (strides {:?}); call .contiguous()",
                self.name,
                self.strides()
            )));
        }
        Ok((rows, cols, stride as usize))
    }

    /// The device address of a dense tensor of `T` on `device` (CUDA paths).
    pub fn device_ptr<T: Elem>(&self, device: Device) -> PyResult<u64> {
        self.expect_dense::<T>(device)?;
        Ok(self.addr())
    }

    /// Whether the tensor may be written.
    pub fn writable(&self) -> PyResult<()> {
        if self.read_only {
            return Err(invalid(format!("{}: the output is read-only", self.name)));
        }
        Ok(())
    }
}

/// Checks that no output overlaps any other argument (input or output) of the same call.
pub fn check_outputs(outputs: &[&Tensor<'_>], inputs: &[Option<&Tensor<'_>>]) -> PyResult<()> {
    let overlap = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
    for (i, o) in outputs.iter().enumerate() {
        o.writable()?;
        let r = o.extent();
        let others = outputs
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, t)| *t)
            .chain(inputs.iter().flatten().copied());
        for t in others {
            if t.numel() > 0 && r.0 != r.1 && overlap(r, t.extent()) {
                return Err(invalid(format!(
                    "{}: the output shares memory with {}",
                    o.name(),
                    t.name()
                )));
            }
        }
    }
    Ok(())
}
