//! CSV datasets, read with the `csv` crate: a header row, one sample per
//! row, the label column named by the source and every other column a
//! numeric feature. An empty field or `nan` is a missing value (NaN), as
//! pandas reads it; anything else that is not a number is an error naming
//! the line and the column. A line longer than the reader's bound is
//! refused before the parser buffers it (a record costs about ten times
//! its text once split into fields and values).

use super::{Chunk, SampleReader};
use crate::data::dataset::SampleShape;
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;
use std::path::{Path, PathBuf};

pub struct Reader {
    path: PathBuf,
    rows: csv::StringRecordsIntoIter<Lines<std::io::BufReader<super::pinned::Opened>>>,
    header: Vec<String>,
    label: Option<usize>,
    shape: SampleShape,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::malformed(Document::Dataset, path, reason)
}

/// A reader that fails once a record runs past `max` bytes: a line, or
/// the lines a quoted field spans (an unterminated quote makes the rest
/// of the file one record, which the parser would buffer whole).
struct Lines<R> {
    inner: R,
    max: usize,
    /// Bytes of the current record so far.
    line: usize,
    /// Lines ended so far (the one that runs long is this plus one).
    number: u64,
    /// Inside a quoted field (`""` inside one toggles twice).
    quoted: bool,
    /// The line the current record started on.
    start: u64,
}

impl<R: std::io::Read> std::io::Read for Lines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Hand out at most what is left of the line's allowance, so the
        // parser never holds more than one bound of a line.
        let room = (self.max - self.line).max(1).min(buf.len());
        let n = self.inner.read(&mut buf[..room])?;
        for &b in &buf[..n] {
            if b == b'"' {
                self.quoted = !self.quoted;
            }
            if b == b'\n' {
                self.number += 1;
                if !self.quoted {
                    self.line = 0;
                    self.start = self.number;
                    continue;
                }
            }
            self.line += 1;
            if self.line >= self.max {
                let what = match self.quoted {
                    true => format!(
                        "the quoted field opened on line {} runs past {} MiB (an unterminated quote?)",
                        self.start + 1,
                        self.max >> 20
                    ),
                    false => format!(
                        "line {} is longer than {} MiB",
                        self.number + 1,
                        self.max >> 20
                    ),
                };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{what}, the bound for a CSV record under this memory limit"),
                ));
            }
        }
        Ok(n)
    }
}

/// A field as a number; empty and `nan` are missing values.
fn number(field: &str) -> Option<f64> {
    let f = field.trim();
    if f.is_empty() || f.eq_ignore_ascii_case("nan") || f.eq_ignore_ascii_case("na") {
        return Some(f64::NAN);
    }
    f.parse().ok()
}

impl Reader {
    /// Opens the file; a line longer than `max_line` bytes is an error.
    pub fn open(source: &FileSource, max_line: usize) -> Result<Self> {
        let path = source.path.clone();
        if source.targets.is_some() {
            return Err(Error::invalid(
                "data.source.targets",
                "CSV datasets take a label column; dense targets need safetensors or NumPy",
            ));
        }
        let file = super::pinned::open(&path)?;
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(Lines {
                inner: std::io::BufReader::with_capacity(1 << 20, file),
                max: max_line.max(1 << 16),
                line: 0,
                number: 0,
                quoted: false,
                start: 0,
            });
        let header: Vec<String> = reader
            .headers()
            .map_err(|e| bad(&path, e.to_string()))?
            .iter()
            .map(str::to_string)
            .collect();
        let label = match &source.labels {
            Some(name) => Some(header.iter().position(|h| h == name).ok_or_else(|| {
                bad(
                    &path,
                    format!(
                        "it has no column `{name}` (its columns are {})",
                        header.join(", ")
                    ),
                )
            })?),
            // Inputs alone: every column is a feature (a scan reads them;
            // training refuses a dataset with nothing to train toward).
            None => None,
        };
        let features = header.len() - usize::from(label.is_some());
        if features == 0 {
            return Err(bad(&path, "it has no feature columns besides the labels"));
        }
        Ok(Reader {
            rows: reader.into_records(),
            header,
            label,
            shape: SampleShape {
                dims: vec![features],
                integer: false,
                labels: usize::from(label.is_some()),
                targets: 0,
            },
            path,
        })
    }
}

impl SampleReader for Reader {
    fn shape(&self) -> &SampleShape {
        &self.shape
    }

    fn samples(&self) -> Option<usize> {
        None
    }

    fn read(&mut self, max: usize, chunk: &mut Chunk) -> Result<usize> {
        let mut k = 0;
        while k < max {
            let Some(record) = self.rows.next() else {
                break;
            };
            let record = record.map_err(|e| bad(&self.path, e.to_string()))?;
            let line = record.position().map_or(0, |p| p.line());
            if record.len() != self.header.len() {
                return Err(bad(
                    &self.path,
                    format!(
                        "line {line} has {} fields, the header {}",
                        record.len(),
                        self.header.len()
                    ),
                ));
            }
            for (i, field) in record.iter().enumerate() {
                let column = &self.header[i];
                if Some(i) == self.label {
                    let label: i64 = field.trim().parse().map_err(|_| {
                        bad(
                            &self.path,
                            format!(
                                "line {line}, column `{column}`: label `{field}` is not an integer class; label-encode the column to 0..classes-1"
                            ),
                        )
                    })?;
                    chunk.labels.push(label);
                } else {
                    let v = number(field).ok_or_else(|| {
                        bad(
                            &self.path,
                            format!("line {line}, column `{column}`: `{field}` is not a number"),
                        )
                    })?;
                    chunk.values.push(v);
                }
            }
            k += 1;
        }
        Ok(k)
    }
}
