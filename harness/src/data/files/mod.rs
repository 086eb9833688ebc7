//! Dataset files: safetensors, NumPy `.npy` / `.npz` and CSV, read with
//! the formats' own crates. Every format is read as a stream of samples
//! ([`SampleReader`]), so a scan holds a chunk at a time; a run loads the
//! whole file once per process ([`load`]) and checks its SHA-256 against
//! the case's.

mod csv;
mod narrow;
mod npy;
pub mod pinned;
mod safetensors;

use super::dataset::{MemoryDataset, SampleShape};
use crate::error::{Document, Error, Result};
use crate::spec::{FileFormat, FileSource};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use narrow::Narrow;

/// Samples read so far, appended by [`SampleReader::read`]. A chunk holds
/// its inputs in one of two forms: f32 inputs as they are (`narrow`, in
/// place where the file is mapped), any other dtype as f64 (`values`).
#[derive(Clone, Debug, Default)]
pub struct Chunk {
    /// Inputs of any dtype but f32, as f64.
    pub values: Vec<f64>,
    /// f32 inputs as the file holds them.
    pub narrow: Narrow,
    /// Class labels.
    pub labels: Vec<i64>,
    /// Dense targets.
    pub targets: Vec<f64>,
}

/// A chunk's inputs, in the form the reader held them.
#[derive(Clone, Copy, Debug)]
pub enum Inputs<'a> {
    /// As f64.
    Wide(&'a [f64]),
    /// As f32.
    Narrow(&'a [f32]),
}

impl Inputs<'_> {
    /// Values.
    pub fn len(&self) -> usize {
        match self {
            Inputs::Wide(v) => v.len(),
            Inputs::Narrow(v) => v.len(),
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Chunk {
    /// Empties it for the next samples.
    pub fn clear(&mut self) {
        self.values.clear();
        self.narrow.clear();
        self.labels.clear();
        self.targets.clear();
    }

    /// The inputs read, in whichever form they were read.
    pub fn inputs(&self) -> Inputs<'_> {
        if self.narrow.is_empty() {
            Inputs::Wide(&self.values)
        } else {
            Inputs::Narrow(self.narrow.as_slice())
        }
    }
}

/// A dataset file opened for reading, sample by sample.
pub trait SampleReader {
    /// What one sample holds.
    fn shape(&self) -> &SampleShape;
    /// Samples in the file, where the format says so before reading (CSV does not).
    fn samples(&self) -> Option<usize>;
    /// Appends up to `max` samples to `chunk`; returns how many (0 at the end).
    fn read(&mut self, max: usize, chunk: &mut Chunk) -> Result<usize>;
    /// The class count the file declares (safetensors metadata `classes`).
    fn classes(&self) -> Option<usize> {
        None
    }
}

/// The format of a source: its own, else from the file's extension.
pub fn format_of(source: &FileSource) -> Result<FileFormat> {
    if let Some(f) = source.format {
        return Ok(f);
    }
    let ext = source
        .path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("safetensors") => Ok(FileFormat::Safetensors),
        Some("npy") => Ok(FileFormat::Npy),
        Some("npz") => Ok(FileFormat::Npz),
        Some("csv") => Ok(FileFormat::Csv),
        _ => Err(Error::invalid(
            "data.source.format",
            format!(
                "cannot tell the format of {} from its extension: name it (`format` in a case, `--format` for scan-data): safetensors, npy, npz or csv",
                source.path.display()
            ),
        )),
    }
}

/// The files a source reads, in the order they are hashed.
pub fn files_of(source: &FileSource) -> Result<Vec<PathBuf>> {
    let mut files = vec![source.path.clone()];
    if format_of(source)? == FileFormat::Npy {
        // `.npy` holds one array: labels and targets are files beside it.
        let dir = source.path.parent().unwrap_or(Path::new(""));
        files.extend(
            [&source.labels, &source.targets]
                .into_iter()
                .flatten()
                .map(|f| {
                    let f = dir.join(f);
                    // `labels` names `labels.npy`.
                    if f.extension().is_none() {
                        f.with_extension("npy")
                    } else {
                        f
                    }
                }),
        );
    }
    Ok(files)
}

/// Opens a source's file(s) for streaming, under a memory limit of
/// `max_bytes` (it bounds a CSV record, and a safetensors header, to a
/// sixteenth of it).
pub fn open(source: &FileSource, max_bytes: usize) -> Result<Box<dyn SampleReader + Send>> {
    present(source, &files_of(source)?)?;
    Ok(match format_of(source)? {
        FileFormat::Safetensors => Box::new(safetensors::Reader::open(source, max_bytes / 16)?),
        FileFormat::Npy => Box::new(npy::Reader::open_npy(source)?),
        FileFormat::Npz => Box::new(npy::Reader::open_npz(source)?),
        FileFormat::Csv => Box::new(csv::Reader::open(source, max_bytes / 16)?),
    })
}

/// Every file of a source is a regular file; else an error naming the
/// missing one and the hash the case expected of it.
fn present(source: &FileSource, files: &[PathBuf]) -> Result<()> {
    match files.iter().find(|f| !f.is_file()) {
        None => Ok(()),
        Some(f) => {
            let expected = source
                .sha256
                .as_deref()
                .map(|h| format!(" (the case expects sha256 {h})"))
                .unwrap_or_default();
            Err(Error::data(
                f.display(),
                format!("the file is missing or not a regular file{expected}"),
            ))
        }
    }
}

/// SHA-256 (hex) of the files' bytes, read in order.
pub fn sha256(files: &[PathBuf]) -> Result<String> {
    use std::io::Read;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in files {
        let mut f = pinned::open(path)?;
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// What identifies a loaded file in the process's cache: its names, its
/// size and its modification time (a rewritten file is read again).
#[derive(Clone, Debug, PartialEq)]
struct Key {
    source: FileSource,
    stamps: Vec<(u64, Option<std::time::SystemTime>)>,
}

/// Datasets loaded by this process: campaigns and the minimizer run many
/// cases on one file.
static LOADED: Mutex<Vec<(Key, Arc<MemoryDataset>)>> = Mutex::new(Vec::new());
const CACHED: usize = 4;

/// Loads a source's samples into memory (at most `max_bytes` of them),
/// checking the file against the source's `sha256` when it has one.
pub fn load(source: &FileSource, max_bytes: usize) -> Result<Arc<MemoryDataset>> {
    let files = files_of(source)?;
    let mut unpinned = source.clone();
    unpinned.sampling = Default::default();
    unpinned.sha256 = None;
    let stamps = files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok();
            (
                m.as_ref().map_or(0, |m| m.len()),
                m.and_then(|m| m.modified().ok()),
            )
        })
        .collect();
    let key = Key {
        source: unpinned,
        stamps,
    };
    let cached = {
        let loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        loaded
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, d)| d.clone())
    };
    let dataset = match cached {
        Some(d) => d,
        None => {
            present(source, &files)?;
            // The files are held in memory while they load: one larger than
            // the memory limit is refused before anything reads it (a
            // hostile path such as /proc/kcore).
            let size: u64 = files
                .iter()
                .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
                .sum();
            if u128::from(size) > max_bytes as u128 {
                return Err(too_large(source, u128::from(size), max_bytes));
            }
            // The hash first: a changed file is named as changed, not as
            // whatever the change broke. Both read the pinned bytes.
            let pins = pinned::Pins::hold(&files)?;
            let hash = sha256(&files)?;
            check_hash(source, &hash)?;
            let mut d = read_all(source, max_bytes, pins.len())?;
            drop(pins);
            d.sha256 = Some(hash);
            let d = Arc::new(d);
            let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
            if loaded.len() >= CACHED {
                loaded.remove(0);
            }
            loaded.push((key, d.clone()));
            d
        }
    };
    if let Some(have) = &dataset.sha256 {
        check_hash(source, have)?;
    }
    Ok(dataset)
}

fn check_hash(source: &FileSource, have: &str) -> Result<()> {
    match &source.sha256 {
        Some(want) if !want.eq_ignore_ascii_case(have) => Err(Error::data(
            source.path.display(),
            format!("the file changed since the case was written: its sha256 is {have}, the case expects {want}"),
        )),
        _ => Ok(()),
    }
}

/// Reads every sample into memory, under `max_bytes` with the `held`
/// bytes of the pinned files counted in.
fn read_all(source: &FileSource, max_bytes: usize, held: usize) -> Result<MemoryDataset> {
    let mut reader = open(source, max_bytes)?;
    let shape = reader.shape().clone();
    // Scanning reads inputs alone; training needs what to train toward.
    if shape.labels == 0 && shape.targets == 0 {
        return Err(Error::malformed(
            Document::Dataset,
            &source.path,
            "it has neither labels nor targets: name one (`labels`, `targets`)",
        ));
    }
    let per_sample = 4 * (shape.numel() + shape.targets) + 8 * shape.labels;
    if let Some(n) = reader.samples() {
        let need = n as u128 * per_sample as u128 + held as u128;
        if need > max_bytes as u128 {
            return Err(too_large(source, need, max_bytes));
        }
    }
    let mut chunk = Chunk::default();
    let (mut values, mut labels, mut targets) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        chunk.clear();
        if reader.read(4096, &mut chunk)? == 0 {
            break;
        }
        values.extend(chunk.values.iter().map(|&v| v as f32));
        values.extend_from_slice(chunk.narrow.as_slice());
        labels.extend_from_slice(&chunk.labels);
        targets.extend(chunk.targets.iter().map(|&v| v as f32));
        let read = 4 * (values.len() + targets.len()) + 8 * labels.len() + held;
        if read > max_bytes {
            return Err(too_large(source, read as u128, max_bytes));
        }
    }
    let dataset = MemoryDataset::new(
        source.path.display().to_string(),
        shape,
        values,
        labels,
        targets,
    )?;
    if dataset.values.is_empty() {
        return Err(Error::malformed(
            Document::Dataset,
            &source.path,
            "it holds no samples",
        ));
    }
    Ok(dataset)
}

fn too_large(source: &FileSource, need: u128, max_bytes: usize) -> Error {
    Error::data(
        source.path.display(),
        format!(
            "it needs {} MiB, over the limit of {} MiB (--max-memory-mib)",
            need >> 20,
            max_bytes >> 20
        ),
    )
}

/// The shape of the samples of an array of `dims` (samples first).
fn sample_dims(dims: &[usize]) -> Vec<usize> {
    match dims {
        [] | [_] => vec![1],
        [_, rest @ ..] => rest.to_vec(),
    }
}

/// A part of a file (labels or targets) as its header declares it: the
/// samples it holds, its values per sample (the product of the dims after
/// the first) and whether its dtype is integer. Parts stream beside the
/// inputs, so a scan holds a chunk of them, never the whole part.
struct Part {
    name: String,
    samples: usize,
    per: usize,
    integer: bool,
}

impl Part {
    fn of(name: &str, dims: &[usize], integer: bool) -> Self {
        Part {
            name: name.to_string(),
            samples: dims.first().copied().unwrap_or(1),
            per: dims.iter().skip(1).product(),
            integer,
        }
    }
}

/// The shape of a file of `len` samples of `dims` (`integer` inputs) with
/// its labels and targets (named as the error should name them), checking
/// that they hold as many samples as the inputs; errors name the file and
/// the part. Labels must be of an integer dtype.
fn layout(
    path: &Path,
    len: usize,
    dims: Vec<usize>,
    integer: bool,
    labels: Option<&Part>,
    targets: Option<&Part>,
) -> Result<SampleShape> {
    let bad = |reason: String| Error::malformed(Document::Dataset, path, reason);
    let mut shape = SampleShape {
        dims,
        integer,
        labels: 0,
        targets: 0,
    };
    for (part, slot) in [(labels, &mut shape.labels), (targets, &mut shape.targets)] {
        if let Some(p) = part {
            if p.samples != len {
                return Err(bad(format!(
                    "`{}` holds {} samples, the inputs {len}",
                    p.name, p.samples
                )));
            }
            *slot = p.per;
        }
    }
    if let Some(p) = labels.filter(|p| !p.integer) {
        return Err(bad(format!(
            "`{}` must hold integer class labels, but its dtype is a float type",
            p.name
        )));
    }
    Ok(shape)
}

#[cfg(test)]
mod tests;
