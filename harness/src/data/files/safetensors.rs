//! safetensors datasets: named tensors for the inputs (samples first), the
//! labels ((N) or (N, T) for per-token labels) and the dense targets.
//! The file is memory-mapped (or, while a run loads it, read from its
//! pinned bytes) and parsed by the `safetensors` crate; every tensor is
//! converted a chunk of samples at a time and the mapped pages already
//! read are given back, so a scan of a file larger than memory stays small.

use super::narrow::{Bytes, PAGE};
use super::{layout, sample_dims, Chunk, Part, SampleReader};
use crate::data::dataset::SampleShape;
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;
use ::safetensors::{Dtype, SafeTensors};
use memmap2::Mmap;
use std::path::Path;
use std::sync::Arc;

/// One tensor's bytes within the map, read a chunk of samples at a time.
struct Region {
    start: usize,
    dtype: Dtype,
    sample_bytes: usize,
    /// Bytes before this offset were read and given back to the OS.
    released: usize,
}

impl Region {
    /// The bytes of samples `rows`.
    fn range(&self, rows: std::ops::Range<usize>) -> std::ops::Range<usize> {
        self.start + rows.start * self.sample_bytes..self.start + rows.end * self.sample_bytes
    }

    /// Gives the pages before `upto` back to the OS (see [`Bytes::release`]).
    fn release(&mut self, bytes: &Bytes, upto: usize) {
        let from = self.released.max(self.start);
        if upto > from {
            bytes.release(from..upto);
            self.released = upto / PAGE * PAGE;
        }
    }
}

pub struct Reader {
    /// Shared with the chunks that view f32 inputs in place.
    map: Arc<Bytes>,
    inputs: Region,
    labels: Option<Region>,
    targets: Option<Region>,
    len: usize,
    next: usize,
    shape: SampleShape,
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

/// Appends little-endian integer elements of `dtype` as i64 (labels).
fn integers(dtype: Dtype, bytes: &[u8], out: &mut Vec<i64>) {
    macro_rules! each {
        ($t:ty, $n:expr) => {
            out.extend(
                bytes
                    .chunks_exact($n)
                    .map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk size")) as i64),
            )
        };
    }
    match dtype {
        Dtype::I64 => each!(i64, 8),
        Dtype::U64 => each!(u64, 8),
        Dtype::I32 => each!(i32, 4),
        Dtype::U32 => each!(u32, 4),
        Dtype::I16 => each!(i16, 2),
        Dtype::U16 => each!(u16, 2),
        Dtype::I8 => each!(i8, 1),
        Dtype::U8 => each!(u8, 1),
        _ => unreachable!("layout() admits integer labels only"),
    }
}

impl Reader {
    /// Opens the file; a header (the JSON index) longer than
    /// `max_header` bytes is refused before it is parsed (its parse holds
    /// several times its text).
    pub fn open(source: &FileSource, max_header: usize) -> Result<Self> {
        let path = source.path.clone();
        let map = Arc::new(match super::pinned::bytes(&path) {
            Some(b) => Bytes::Pinned(b),
            None => {
                let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
                // SAFETY: the map is read-only; a file truncated under a
                // running scan is the one hazard of any mapped read, as in
                // candle's loaders.
                Bytes::Mapped(unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?)
            }
        });
        if let Some(len) = map
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        {
            let bound = max_header.max(1 << 16) as u64;
            if len > bound && len <= map.len() as u64 {
                return Err(bad(
                    &path,
                    format!(
                        "its header is {} MiB, past {} MiB, the bound for a safetensors header under this memory limit",
                        len >> 20,
                        bound >> 20
                    ),
                ));
            }
        }
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
        let (_, meta) = SafeTensors::read_metadata(&map).map_err(|e| bad(&path, e.to_string()))?;
        let classes = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("classes"))
            .and_then(|c| c.parse().ok());
        // A tensor's region, its declared part and its dims.
        let region = |name: &str| -> Result<(Region, Part, Vec<usize>)> {
            let v = view(name)?;
            let (size, integer) = element(&path, name, v.dtype())?;
            let part = Part::of(name, v.shape(), integer);
            let region = Region {
                start: v.data().as_ptr() as usize - map.as_ptr() as usize,
                dtype: v.dtype(),
                sample_bytes: size * part.per,
                released: 0,
            };
            Ok((region, part, v.shape().to_vec()))
        };
        let (inputs, declared, dims) = region(&source.inputs)?;
        let (len, integer, dims) = (declared.samples, declared.integer, sample_dims(&dims));
        let labels = source.labels.as_deref().map(region).transpose()?;
        let targets = source.targets.as_deref().map(region).transpose()?;
        let shape = layout(
            &path,
            len,
            dims,
            integer,
            labels.as_ref().map(|(_, p, _)| p),
            targets.as_ref().map(|(_, p, _)| p),
        )?;
        drop(st);
        Ok(Reader {
            map,
            inputs,
            labels: labels.map(|(r, _, _)| r),
            targets: targets.map(|(r, _, _)| r),
            len,
            next: 0,
            shape,
            classes,
        })
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
        let rows = self.next..self.next + k;
        let map = &self.map;
        let bytes = self.inputs.range(rows.clone());
        if self.inputs.dtype == Dtype::F32 {
            // Viewed in place: the chunk gives its pages back when dropped.
            chunk.narrow.extend_from_file(map, bytes);
        } else {
            convert(self.inputs.dtype, &map[bytes.clone()], &mut chunk.values);
            self.inputs.release(map, bytes.end);
        }
        if let Some(r) = &mut self.labels {
            let bytes = r.range(rows.clone());
            integers(r.dtype, &map[bytes.clone()], &mut chunk.labels);
            r.release(map, bytes.end);
        }
        if let Some(r) = &mut self.targets {
            let bytes = r.range(rows);
            convert(r.dtype, &map[bytes.clone()], &mut chunk.targets);
            r.release(map, bytes.end);
        }
        self.next += k;
        Ok(k)
    }
}
