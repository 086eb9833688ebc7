//! NumPy datasets, parsed by `npyz`: a `.npy` file holds the inputs (its
//! labels and targets are `.npy` files beside it, named by the source), a
//! `.npz` archive (`np.savez`, compressed or not, read with `zip`) holds
//! them as named arrays. Every array streams from its own reader thread
//! through a bounded channel, so an archive member is decompressed a chunk
//! at a time and no part is held whole.

use super::{layout, sample_dims, Chunk, Part, SampleReader};
use crate::data::dataset::SampleShape;
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;
use npyz::{DType, NpyFile, TypeChar};
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};

/// Values per message from the reader thread.
const BLOCK: usize = 1 << 16;

pub struct Reader {
    path: PathBuf,
    shape: SampleShape,
    len: usize,
    next: usize,
    inputs: Stream,
    labels: Option<Stream>,
    targets: Option<Stream>,
}

/// An array's elements as they arrive from its reader thread.
struct Stream {
    blocks: Receiver<Result<Vec<f64>>>,
    /// Values received but not handed out yet.
    pending: Vec<f64>,
}

impl Stream {
    /// Starts reading the array's elements on their own thread, two blocks
    /// ahead at most.
    fn spawn(array: Array) -> Stream {
        let (tx, blocks) = sync_channel(2);
        std::thread::spawn(move || {
            let result = array.with(|npy, _| {
                let mut block = Vec::with_capacity(BLOCK);
                let mut open = true;
                elements(&array, npy, |v| {
                    block.push(v);
                    if block.len() == BLOCK {
                        let full = std::mem::replace(&mut block, Vec::with_capacity(BLOCK));
                        // The reader was dropped: stop reading.
                        open = tx.send(Ok(full)).is_ok();
                    }
                    open
                })?;
                if open && !block.is_empty() {
                    let _ = tx.send(Ok(block));
                }
                Ok(())
            });
            if let Err(e) = result {
                let _ = tx.send(Err(e));
            }
        });
        Stream {
            blocks,
            pending: Vec::new(),
        }
    }

    /// Hands the next `n` elements to `out`; false when the array ended first.
    fn take(&mut self, n: usize, mut out: impl FnMut(f64)) -> Result<bool> {
        while self.pending.len() < n {
            match self.blocks.recv() {
                Ok(block) => self.pending.extend(block?),
                Err(_) => return Ok(false),
            }
        }
        self.pending.drain(..n).for_each(&mut out);
        Ok(true)
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::malformed(Document::Dataset, path, reason)
}

/// Where an array lives: a `.npy` file, or a member of a `.npz` archive.
#[derive(Clone)]
enum Array {
    File(PathBuf),
    Member(PathBuf, String),
}

impl Array {
    fn path(&self) -> &Path {
        match self {
            Array::File(p) | Array::Member(p, _) => p,
        }
    }

    fn name(&self) -> String {
        match self {
            Array::File(p) => p.display().to_string(),
            Array::Member(_, n) => format!("`{n}`"),
        }
    }

    /// Opens the array and hands its header, its element stream and its
    /// length in bytes to `f`.
    fn with<T>(&self, f: impl FnOnce(NpyFile<&mut dyn Read>, u64) -> Result<T>) -> Result<T> {
        let path = self.path();
        let file = super::pinned::open(path)?;
        let len = file.len(path)?;
        let mut file = std::io::BufReader::with_capacity(1 << 20, file);
        match self {
            Array::File(_) => {
                let prefix = file.fill_buf().map_err(|e| Error::io(path, e))?;
                declared_header(prefix, len).map_err(|r| bad(path, r))?;
                let npy = NpyFile::new(&mut file as &mut dyn Read)
                    .map_err(|e| bad(path, format!("not a .npy file: {e}")))?;
                f(npy, len)
            }
            Array::Member(_, name) => {
                let mut zip = zip::ZipArchive::new(file)
                    .map_err(|e| bad(path, format!("not a .npz archive: {e}")))?;
                let member = format!("{name}.npy");
                let names: Vec<String> = zip
                    .file_names()
                    .filter_map(|n| n.ok().map(|n| n.to_string()))
                    .collect();
                let entry = zip.by_name(&member).map_err(|_| {
                    let mut arrays: Vec<&str> = names
                        .iter()
                        .filter_map(|n| n.strip_suffix(".npy"))
                        .collect();
                    arrays.sort();
                    bad(
                        path,
                        format!("it has no array `{name}` (it has {})", arrays.join(", ")),
                    )
                })?;
                let size = entry.size();
                let mut entry = std::io::BufReader::with_capacity(1 << 16, entry);
                let prefix = entry.fill_buf().map_err(|e| Error::io(path, e))?;
                declared_header(prefix, size)
                    .map_err(|r| bad(path, format!("array `{name}`: {r}")))?;
                let npy = NpyFile::new(&mut entry as &mut dyn Read)
                    .map_err(|e| bad(path, format!("array `{name}`: {e}")))?;
                f(npy, size)
            }
        }
    }
}

/// Checks the header length a `.npy` array's first bytes declare against
/// its `len` bytes: npyz allocates the declared length, so a header longer
/// than the file (a 13-byte file declaring 4 GiB) is refused before it reads.
fn declared_header(bytes: &[u8], len: u64) -> std::result::Result<(), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        // Not a .npy prefix: npyz says what is wrong with it.
        return Ok(());
    }
    let (header, prefix) = match bytes[6] {
        1 => (u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u64::from(u32::from_le_bytes([
                bytes[8], bytes[9], bytes[10], bytes[11],
            ])),
            12,
        ),
        _ => return Ok(()),
    };
    if prefix + header > len {
        return Err(format!(
            "its header declares {header} bytes, but the file has {} after its {prefix}-byte prefix",
            len.saturating_sub(prefix)
        ));
    }
    Ok(())
}

/// The array's shape and whether its dtype is an integer type; errors for
/// dtypes that are not numbers, for Fortran order, and for a shape whose
/// data is larger than the `len` bytes the array has (checked before any
/// element is read).
fn header(array: &Array, npy: &NpyFile<&mut dyn Read>, len: u64) -> Result<(Vec<usize>, bool)> {
    let what = array.name();
    if npy.order() == npyz::Order::Fortran {
        return Err(bad(
            array.path(),
            format!("{what} is in Fortran order: save it with np.ascontiguousarray"),
        ));
    }
    let (integer, size) = match npy.dtype() {
        DType::Plain(ts) => match (ts.type_char(), ts.size_field()) {
            (TypeChar::Float, size @ (2 | 4 | 8)) => (false, size),
            (TypeChar::Int | TypeChar::Uint, size @ (1 | 2 | 4 | 8))
            | (TypeChar::Bool, size @ 1) => (true, size),
            _ => {
                return Err(bad(
                    array.path(),
                    format!("{what} has dtype {ts}: expected a float or integer dtype"),
                ))
            }
        },
        other => {
            return Err(bad(
                array.path(),
                format!(
                    "{what} has dtype {}: expected a plain numeric dtype",
                    other.descr()
                ),
            ))
        }
    };
    let need = npy.shape().iter().try_fold(size, |n, &d| n.checked_mul(d));
    if need.is_none_or(|n| n > len) {
        return Err(bad(
            array.path(),
            format!(
                "{what}: its header declares shape {:?} of {}-byte values{}, but the array has {len} bytes",
                npy.shape(),
                size,
                need.map_or(String::from(" (more bytes than a u64 counts)"), |n| format!(" ({n} bytes)")),
            ),
        ));
    }
    Ok((npy.shape().iter().map(|&d| d as usize).collect(), integer))
}

/// Streams every element as f64 into `sink` (which may stop the stream by
/// returning false).
fn elements(
    array: &Array,
    npy: NpyFile<&mut dyn Read>,
    mut sink: impl FnMut(f64) -> bool,
) -> Result<()> {
    let io = |e: std::io::Error| bad(array.path(), format!("{}: {e}", array.name()));
    macro_rules! each {
        ($t:ty) => {{
            let data = npy
                .data::<$t>()
                .map_err(|e| bad(array.path(), format!("{}: {e}", array.name())))?;
            for v in data {
                if !sink(v.map_err(io)? as f64) {
                    break;
                }
            }
        }};
    }
    let DType::Plain(ts) = npy.dtype() else {
        unreachable!("header() admits plain dtypes only")
    };
    match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 2) => {
            let data = npy
                .data::<half::f16>()
                .map_err(|e| bad(array.path(), format!("{}: {e}", array.name())))?;
            for v in data {
                if !sink(v.map_err(io)?.to_f64()) {
                    break;
                }
            }
        }
        (TypeChar::Float, 4) => each!(f32),
        (TypeChar::Float, 8) => each!(f64),
        (TypeChar::Int, 1) => each!(i8),
        (TypeChar::Int, 2) => each!(i16),
        (TypeChar::Int, 4) => each!(i32),
        (TypeChar::Int, 8) => each!(i64),
        (TypeChar::Uint, 1) => each!(u8),
        (TypeChar::Uint, 2) => each!(u16),
        (TypeChar::Uint, 4) => each!(u32),
        (TypeChar::Uint, 8) => each!(u64),
        (TypeChar::Bool, 1) => {
            let data = npy
                .data::<bool>()
                .map_err(|e| bad(array.path(), format!("{}: {e}", array.name())))?;
            for v in data {
                if !sink(f64::from(u8::from(v.map_err(io)?))) {
                    break;
                }
            }
        }
        _ => unreachable!("header() admits these dtypes only"),
    }
    Ok(())
}

impl Reader {
    pub fn open_npy(source: &FileSource) -> Result<Self> {
        let files = super::files_of(source)?;
        let mut parts = files.into_iter().skip(1);
        let mut part =
            |name: &Option<String>| name.as_ref().and_then(|_| parts.next()).map(Array::File);
        let labels = part(&source.labels);
        let targets = part(&source.targets);
        Reader::open(source, Array::File(source.path.clone()), labels, targets)
    }

    pub fn open_npz(source: &FileSource) -> Result<Self> {
        let member = |name: &str| Array::Member(source.path.clone(), name.to_string());
        Reader::open(
            source,
            member(&source.inputs),
            source.labels.as_deref().map(member),
            source.targets.as_deref().map(member),
        )
    }

    fn open(
        source: &FileSource,
        inputs: Array,
        labels: Option<Array>,
        targets: Option<Array>,
    ) -> Result<Self> {
        let (dims, integer) = inputs.with(|npy, len| header(&inputs, &npy, len))?;
        let len = dims.first().copied().unwrap_or(1);
        let declared = |a: &Option<Array>| -> Result<Option<Part>> {
            a.as_ref()
                .map(|a| {
                    let (dims, integer) = a.with(|npy, len| header(a, &npy, len))?;
                    Ok(Part::of(&a.name(), &dims, integer))
                })
                .transpose()
        };
        let shape = layout(
            &source.path,
            len,
            sample_dims(&dims),
            integer,
            declared(&labels)?.as_ref(),
            declared(&targets)?.as_ref(),
        )?;
        Ok(Reader {
            path: source.path.clone(),
            shape,
            len,
            next: 0,
            inputs: Stream::spawn(inputs),
            labels: labels.map(Stream::spawn),
            targets: targets.map(Stream::spawn),
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

    fn read(&mut self, max: usize, chunk: &mut Chunk) -> Result<usize> {
        let k = max.min(self.len - self.next);
        if k == 0 {
            return Ok(0);
        }
        let ended = |what: &str| {
            bad(
                &self.path,
                format!("the {what} ended before their shape said"),
            )
        };
        if !self
            .inputs
            .take(k * self.shape.numel(), |v| chunk.values.push(v))?
        {
            return Err(ended("inputs"));
        }
        if let Some(s) = &mut self.labels {
            if !s.take(k * self.shape.labels, |v| chunk.labels.push(v as i64))? {
                return Err(ended("labels"));
            }
        }
        if let Some(s) = &mut self.targets {
            if !s.take(k * self.shape.targets, |v| chunk.targets.push(v))? {
                return Err(ended("targets"));
            }
        }
        self.next += k;
        Ok(k)
    }
}
