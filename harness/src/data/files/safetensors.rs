//! safetensors datasets: named tensors for the inputs (samples first), the
//! labels ((N) or (N, T) for per-token labels) and the dense targets.
//! The file is memory-mapped and parsed by the `safetensors` crate; inputs
//! are converted a chunk at a time and the pages already read are given
//! back, so a scan of a file larger than memory stays small.

use super::{layout, sample_dims, Chunk, Layout, SampleReader, Whole};
use crate::data::dataset::SampleShape;
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;
use ::safetensors::{Dtype, SafeTensors};
use memmap2::Mmap;
use std::path::Path;

pub struct Reader {
    map: Mmap,
    /// The inputs' bytes within the map, their dtype and bytes per sample.
    start: usize,
    dtype: Dtype,
    sample_bytes: usize,
    len: usize,
    next: usize,
    shape: SampleShape,
    labels: Vec<i64>,
    targets: Vec<f64>,
    /// Bytes before this offset were read and given back to the OS.
    released: usize,
    classes: Option<usize>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::malformed(Document::Dataset, path, reason)
}

/// Bytes per element and whether the dtype is an integer type.
fn element(path: &Path, name: &str, dtype: Dtype) -> Result<(usize, bool)> {
    Ok(match dtype {
        Dtype::F64 | Dtype::I64 | Dtype::U64 => (8, !matches!(dtype, Dtype::F64)),
        Dtype::F32 | Dtype::I32 | Dtype::U32 => (4, !matches!(dtype, Dtype::F32)),
        Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => {
            (2, matches!(dtype, Dtype::I16 | Dtype::U16))
        }
        Dtype::I8 | Dtype::U8 => (1, true),
        other => {
            return Err(bad(
                path,
                format!("tensor `{name}` has dtype {other:?}: expected a float or integer dtype"),
            ))
        }
    })
}

/// Appends little-endian elements of `dtype` as f64.
fn convert(dtype: Dtype, bytes: &[u8], out: &mut Vec<f64>) {
    macro_rules! each {
        ($t:ty, $n:expr, $f:expr) => {
            out.extend(bytes.chunks_exact($n).map(|b| {
                let v = <$t>::from_le_bytes(b.try_into().expect("chunk size"));
                $f(v)
            }))
        };
    }
    match dtype {
        Dtype::F64 => each!(f64, 8, |v| v),
        Dtype::F32 => each!(f32, 4, f64::from),
        Dtype::F16 => each!(u16, 2, |v| half::f16::from_bits(v).to_f64()),
        Dtype::BF16 => each!(u16, 2, |v| half::bf16::from_bits(v).to_f64()),
        Dtype::I64 => each!(i64, 8, |v| v as f64),
        Dtype::U64 => each!(u64, 8, |v| v as f64),
        Dtype::I32 => each!(i32, 4, f64::from),
        Dtype::U32 => each!(u32, 4, f64::from),
        Dtype::I16 => each!(i16, 2, f64::from),
        Dtype::U16 => each!(u16, 2, f64::from),
        Dtype::I8 => each!(i8, 1, f64::from),
        Dtype::U8 => each!(u8, 1, f64::from),
        _ => unreachable!("element() admits numeric dtypes only"),
    }
}

impl Reader {
    pub fn open(source: &FileSource) -> Result<Self> {
        let path = source.path.clone();
        let file = super::pinned::open(&path)?;
        // SAFETY: the map is read-only; a file truncated under a running
        // scan is the one hazard of any mapped read, as in candle's loaders.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let st = SafeTensors::deserialize(&map).map_err(|e| bad(&path, e.to_string()))?;
        let view = |name: &str| {
            st.tensor(name).map_err(|_| {
                let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
                names.sort();
                bad(
                    &path,
                    format!("it has no tensor `{name}` (it has {})", names.join(", ")),
                )
            })
        };
        let inputs = view(&source.inputs)?;
        let dtype = inputs.dtype();
        let (_, meta) = SafeTensors::read_metadata(&map).map_err(|e| bad(&path, e.to_string()))?;
        let classes = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("classes"))
            .and_then(|c| c.parse().ok());
        let (size, integer) = element(&path, &source.inputs, inputs.dtype())?;
        let len = inputs.shape().first().copied().unwrap_or(1);
        let dims = sample_dims(inputs.shape());
        let start = inputs.data().as_ptr() as usize - map.as_ptr() as usize;
        let whole = |name: &str| -> Result<(String, Whole)> {
            let v = view(name)?;
            let (_, integer) = element(&path, name, v.dtype())?;
            let mut values = Vec::new();
            convert(v.dtype(), v.data(), &mut values);
            let per = v.shape().iter().skip(1).product();
            Ok((
                name.to_string(),
                Whole {
                    values,
                    per,
                    integer,
                },
            ))
        };
        let labels = source.labels.as_deref().map(whole).transpose()?;
        let targets = source.targets.as_deref().map(whole).transpose()?;
        let Layout {
            shape,
            labels,
            targets,
        } = layout(&path, len, dims, integer, labels, targets)?;
        let sample_bytes = size * shape.numel();
        drop(st);
        Ok(Reader {
            map,
            start,
            dtype,
            sample_bytes,
            len,
            next: 0,
            shape,
            labels,
            targets,
            released: 0,
            classes,
        })
    }

    /// Gives the pages of inputs already read back to the OS (whole pages
    /// only): the map then holds what a chunk needs, not the file.
    fn release(&mut self, upto: usize) {
        const PAGE: usize = 4096;
        let end = upto / PAGE * PAGE;
        if end > self.released {
            // SAFETY: the pages are never read again (samples are read in
            // order); were they, they would be read from the file again.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.released,
                    end - self.released,
                )
            };
            self.released = end;
        }
    }
}

impl SampleReader for Reader {
    fn shape(&self) -> &SampleShape {
        &self.shape
    }

    fn samples(&self) -> Option<usize> {
        Some(self.len)
    }

    fn classes(&self) -> Option<usize> {
        self.classes
    }

    fn read(&mut self, max: usize, chunk: &mut Chunk) -> Result<usize> {
        let k = max.min(self.len - self.next);
        if k == 0 {
            return Ok(0);
        }
        let from = self.start + self.next * self.sample_bytes;
        let to = from + k * self.sample_bytes;
        convert(self.dtype, &self.map[from..to], &mut chunk.values);
        chunk.extend_parts(
            &self.shape,
            &self.labels,
            &self.targets,
            self.next..self.next + k,
        );
        self.next += k;
        self.release(to);
        Ok(k)
    }
}
