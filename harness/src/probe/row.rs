//! The probe's figures of a tensor on a device, in one pass: its row
//! [Σx² over finite values, NaN count, ±Inf count, max |x| over finite
//! values, Σx over every value] (the last is the value of a scalar: a
//! loss comes back exact, NaN and ±Inf included).
//!
//! On CUDA each tensor is one launch of `scan_row.cu` (compiled to PTX by
//! the CUDA build), every row written into one buffer that comes back in a
//! single copy: a step's probe is one launch per tensor and one
//! synchronization, where a composition of candle ops took a dozen
//! launches and allocations per tensor. Elsewhere (the CPU, where this
//! path is tested, and a device without the kernel) the same row is
//! computed on the host, with the in-place scan's arithmetic.

use super::{scan_slice, with_cpu_range, TensorScan};
use crate::error::Result;
use candle_core::{CpuStorage, DType, Device, Tensor};
use half::{bf16, f16};

/// Columns of a row.
pub(crate) const WIDTH: usize = 5;

/// [Σx² finite, #NaN, #Inf, max |x| finite, Σx].
pub(crate) type Row = [f64; WIDTH];

/// The rows of `tensors`, all on one device, read back together.
pub(crate) fn rows(tensors: &[&Tensor]) -> Result<Vec<Row>> {
    #[cfg(feature = "cuda")]
    if let Some(Device::Cuda(dev)) = tensors.first().map(|t| t.device()) {
        match cuda::rows(dev, tensors) {
            Ok(rows) => return Ok(rows),
            // A driver that cannot load the kernel's PTX: the host's rows
            // (slower, a copy a tensor, but the run goes on), said once.
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!("warning: the probe's CUDA kernel failed ({e}); probing on the host instead")
                });
            }
        }
    }
    tensors.iter().map(|t| host_row(t)).collect()
}

/// The scan a row holds.
pub(crate) fn scan_of(r: &Row) -> TensorScan {
    TensorScan {
        sum_sq: r[0],
        nan: r[1] as usize,
        inf: r[2] as usize,
        max_abs: r[3],
    }
}

/// A row computed on the host: the in-place scan's Σx², counts and max
/// (so the same bits as [`super::scan_all`] on the CPU), and Σx in order.
fn host_row(t: &Tensor) -> Result<Row> {
    let t = match t.device() {
        Device::Cpu => t.contiguous()?,
        _ => t.to_device(&Device::Cpu)?,
    };
    let row = with_cpu_range(&t, |cpu, range| {
        Some(match cpu {
            CpuStorage::F32(v) => row_of(&v[range], |x| x as f64),
            CpuStorage::F64(v) => row_of(&v[range], |x| x),
            CpuStorage::F16(v) => row_of(&v[range], f16::to_f64),
            CpuStorage::BF16(v) => row_of(&v[range], bf16::to_f64),
            _ => return None,
        })
    });
    match row {
        Some(r) => Ok(r),
        // Integer and other storage: every value is finite in f64.
        None => host_row(&t.to_dtype(DType::F64)?),
    }
}

fn row_of<T: Copy>(values: &[T], to_f64: impl Fn(T) -> f64 + Copy) -> Row {
    let s = scan_slice(values, to_f64);
    let sum = values.iter().map(|&v| to_f64(v)).sum();
    [s.sum_sq, s.nan as f64, s.inf as f64, s.max_abs, sum]
}

#[cfg(feature = "cuda")]
mod cuda {
    //! One launch of `scan_row` per tensor into a shared buffer, one copy.

    use super::{Row, WIDTH};
    use crate::error::Result;
    use candle_core::cuda::cudarc::driver::{CudaViewMut, LaunchConfig, PushKernelArg};
    use candle_core::cuda::{CudaDevice, WrapErr};
    use candle_core::{DType, Storage, Tensor};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/scan_row.ptx"));
    const MODULE: &str = "nanhunt_scan_row";
    /// Threads per block: `THREADS` in scan_row.cu.
    const THREADS: u32 = 256;
    /// Most blocks per tensor; each block reduces a share of the values,
    /// and the last to finish adds the blocks' rows in block order.
    const MAX_BLOCKS: usize = 240;
    /// Values a thread takes at least, before a tensor gets another block.
    const PER_THREAD: usize = 16;

    pub(super) fn rows(dev: &CudaDevice, tensors: &[&Tensor]) -> Result<Vec<Row>> {
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        let tensors = tensors
            .iter()
            .map(|t| match t.dtype() {
                DType::F32 | DType::F64 | DType::F16 | DType::BF16 => t.contiguous(),
                _ => t.to_dtype(DType::F64)?.contiguous(),
            })
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        let blocks: Vec<usize> = tensors
            .iter()
            .map(|t| {
                t.elem_count()
                    .div_ceil(THREADS as usize * PER_THREAD)
                    .clamp(1, MAX_BLOCKS)
            })
            .collect();
        // Three allocations a step, whatever the number of tensors: the
        // rows, the blocks' rows (each written before it is read) and the
        // counters of finished blocks.
        let mut out = dev.alloc_zeros::<f64>(tensors.len() * WIDTH)?;
        // SAFETY: every block writes its row before any block reads it.
        let mut partials = unsafe { dev.alloc::<f64>(blocks.iter().sum::<usize>() * WIDTH)? };
        let mut done = dev.alloc_zeros::<u32>(tensors.len())?;
        let mut first = 0;
        for (i, (t, &b)) in tensors.iter().zip(&blocks).enumerate() {
            let to = Scratch {
                partials: partials.slice_mut(first * WIDTH..(first + b) * WIDTH),
                done: done.slice_mut(i..i + 1),
                row: out.slice_mut(i * WIDTH..(i + 1) * WIDTH),
            };
            launch(dev, t, b, to)?;
            first += b;
        }
        let flat = dev.clone_dtoh(&out)?;
        Ok(flat
            .chunks_exact(WIDTH)
            .map(|c| c.try_into().expect("rows are WIDTH wide"))
            .collect())
    }

    /// Where one tensor's launch writes.
    struct Scratch<'a> {
        partials: CudaViewMut<'a, f64>,
        done: CudaViewMut<'a, u32>,
        row: CudaViewMut<'a, f64>,
    }

    fn launch(dev: &CudaDevice, t: &Tensor, blocks: usize, mut to: Scratch) -> Result<()> {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(s) = &*storage else {
            return Err(
                candle_core::Error::Msg("the probe's CUDA rows need CUDA tensors".into()).into(),
            );
        };
        let (start, end) = layout
            .contiguous_offsets()
            .expect("the caller made the tensor contiguous");
        let n = end - start;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        macro_rules! go {
            ($ty:ty, $name:literal) => {{
                let src = s.as_cuda_slice::<$ty>()?.slice(start..end);
                let func = dev.get_or_load_custom_func($name, MODULE, PTX)?;
                let mut b = func.builder();
                b.arg(&src)
                    .arg(&n)
                    .arg(&mut to.partials)
                    .arg(&mut to.done)
                    .arg(&mut to.row);
                // SAFETY: the kernel reads n values of src and writes
                // `blocks` rows of partials, the counter and one row.
                unsafe { b.launch(cfg) }.w()?;
            }};
        }
        match t.dtype() {
            DType::F32 => go!(f32, "scan_row_f32"),
            DType::F64 => go!(f64, "scan_row_f64"),
            DType::F16 => go!(half::f16, "scan_row_f16"),
            DType::BF16 => go!(half::bf16, "scan_row_bf16"),
            other => unreachable!("converted to f64 above, not {other:?}"),
        }
        Ok(())
    }
}
