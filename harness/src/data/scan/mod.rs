//! The source article's `check_data_sanity`, over a whole dataset rather
//! than one batch: non-finite and extreme values, labels outside the class
//! range, all-zero and duplicated samples, constant features, per-feature
//! statistics with a robust scale, the offending samples by index and the
//! fixes the article names. A file is scanned as a stream, a chunk of
//! samples at a time, within a memory limit that does not grow with the
//! file or the sample count: duplicates and quantiles come from bounded
//! sketches whose error the scan states.

mod block;
mod columns;
mod duplicates;
mod element;
mod memory;
mod report;
mod scanner;

pub use memory::Plan;
pub use report::{
    DataScan, DuplicateSketch, FeatureStats, LabelStats, Problem, ProblemKind, QuantileSketch,
    ScanOptions, Sketches,
};
pub use scanner::Scanner;

use super::dataset::{Dataset, Rows};
use super::files::{self, Chunk, SampleReader};
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;

/// Scans a dataset file as a stream.
pub fn scan_file(source: &FileSource, opts: &ScanOptions) -> Result<DataScan> {
    let mut reader = files::open(source, opts.max_memory)?;
    let shape = reader.shape().clone();
    let plan = Plan::new(&shape, opts.max_memory)
        .map_err(|r| Error::malformed(Document::Dataset, &source.path, r))?;
    let mut opts = opts.clone();
    opts.classes = opts.classes.or(reader.classes());
    let per = plan.read_size(opts.threads);
    let mut scanner = Scanner::new(shape, opts, &plan);
    match scanner.pool() {
        Some(pool) => pool.install(|| pipeline(&mut *reader, per, &mut scanner))?,
        None => {
            let mut chunk = Chunk::default();
            while fill(&mut *reader, per, &mut chunk)? > 0 {
                scanner.push(&chunk);
                chunk.clear();
            }
        }
    }
    Ok(scanner.finish(source.path.display().to_string()))
}

/// Reads `per` samples into `chunk`, fewer only at the end of the file (a
/// reader may return fewer at a time): chunks of whole blocks keep every
/// block where it is in the file.
fn fill(reader: &mut (dyn SampleReader + Send), per: usize, chunk: &mut Chunk) -> Result<usize> {
    let mut held = 0;
    while held < per {
        match reader.read(per - held, chunk)? {
            0 => break,
            n => held += n,
        }
    }
    Ok(held)
}

/// A pipeline of three chunks on the scan's threads: while one chunk's
/// blocks are scanned, the chunk before is absorbed (the duplicate table
/// and the reservoir, in order) and the next one is read.
fn pipeline(
    reader: &mut (dyn SampleReader + Send),
    per: usize,
    scanner: &mut Scanner,
) -> Result<()> {
    let blocks = scanner.blocks();
    let f = reader.shape().numel().max(1);
    let (mut current, mut next, mut after) = (Chunk::default(), Chunk::default(), Chunk::default());
    if fill(reader, per, &mut current)? == 0 {
        return Ok(());
    }
    let mut start = 0;
    let (read, mut scanned) = rayon::join(
        || fill(reader, per, &mut next),
        || blocks.scan(&current, start, None),
    );
    let mut read = read?;
    loop {
        if read == 0 {
            scanner.absorb(&current, None, scanned);
            return Ok(());
        }
        let next_start = start + current.inputs().len() / f;
        after.clear();
        let (read_after, (next_scanned, ())) = rayon::join(
            || fill(reader, per, &mut after),
            || {
                rayon::join(
                    || blocks.scan(&next, next_start, None),
                    || scanner.absorb(&current, None, scanned),
                )
            },
        );
        read = read_after?;
        (scanned, start) = (next_scanned, next_start);
        std::mem::swap(&mut current, &mut next);
        std::mem::swap(&mut next, &mut after);
    }
}

/// Scans the samples `indices` of a dataset (all when `None`).
pub fn scan_dataset(
    dataset: &dyn Dataset,
    indices: Option<&[usize]>,
    opts: &ScanOptions,
) -> Result<DataScan> {
    let shape = dataset.shape();
    let plan = Plan::new(&shape, opts.max_memory)
        .map_err(|r| Error::invalid("data", format!("dataset {}: {r}", dataset.name())))?;
    let per = plan.read_size(opts.threads);
    let all: Vec<usize>;
    let indices = match indices {
        Some(i) => i,
        None => {
            all = (0..dataset.len()).collect();
            &all
        }
    };
    let mut scanner = Scanner::new(shape, opts.clone(), &plan);
    let mut rows = Rows::default();
    for block in indices.chunks(per) {
        rows.values.clear();
        rows.labels.clear();
        rows.targets.clear();
        for &i in block {
            dataset.append(i, &mut rows)?;
        }
        let mut chunk = Chunk {
            labels: rows.labels.clone(),
            ..Chunk::default()
        };
        chunk.narrow.extend_from_slice(&rows.values);
        scanner.push_with(&chunk, Some(block));
    }
    Ok(scanner.finish(dataset.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dataset::SampleShape;
    use crate::data::MemoryDataset;

    fn dataset(values: Vec<f32>, labels: Vec<i64>) -> MemoryDataset {
        let shape = SampleShape {
            dims: vec![2],
            integer: false,
            labels: 1,
            targets: 0,
        };
        MemoryDataset::new("t".into(), shape, values, labels, Vec::new()).unwrap()
    }

    #[test]
    fn duplicates_constant_features_and_statistics() {
        // Samples: (1, 5) (2, 5) (1, 5) (3, 5) (2, 5); labels 0 1 0 1 0.
        let d = dataset(
            vec![1.0, 5.0, 2.0, 5.0, 1.0, 5.0, 3.0, 5.0, 2.0, 5.0],
            vec![0, 1, 0, 1, 0],
        );
        let scan = scan_dataset(&d, None, &ScanOptions::default()).unwrap();
        // Sample 2 repeats sample 0; sample 4 has 1's values but 0's label.
        let dup = scan.problem(ProblemKind::DuplicateSample).unwrap();
        assert_eq!(dup.indices, vec![2]);
        let constant = scan.problem(ProblemKind::ConstantFeature).unwrap();
        assert_eq!(constant.indices, vec![1]);
        assert!(!scan.has_errors(), "warnings only");
        let f0 = &scan.feature_stats[0];
        assert_eq!((f0.min, f0.max, f0.median), (1.0, 3.0, 2.0));
        assert!((f0.mean - 1.8).abs() < 1e-12);
        assert!((f0.std - 0.56f64.sqrt()).abs() < 1e-12);
        assert_eq!(scan.labels.as_ref().unwrap().counts, vec![3, 2]);
    }

    #[test]
    fn a_subset_reports_dataset_indices() {
        let d = dataset(
            vec![0.0, 1.0, f32::NAN, 1.0, 2.0, 1.0, 3.0, f32::INFINITY],
            vec![0, 1, 0, 7],
        );
        let opts = ScanOptions {
            classes: Some(2),
            ..ScanOptions::default()
        };
        let scan = scan_dataset(&d, Some(&[3, 1]), &opts).unwrap();
        assert_eq!(scan.samples, 2);
        assert_eq!(scan.problem(ProblemKind::Nan).unwrap().indices, vec![1]);
        assert_eq!(scan.problem(ProblemKind::Inf).unwrap().indices, vec![3]);
        assert_eq!(
            scan.problem(ProblemKind::LabelOutOfRange).unwrap().indices,
            vec![3]
        );
        assert_eq!(scan.bad_samples(), vec![1, 3]);
    }

    #[test]
    fn any_number_of_threads_gives_the_same_report() {
        // 2,500 samples of 64 values: three blocks of up to 1,024 samples,
        // read two at a time on one thread and all three at once on three.
        let (k, f) = (2_500, 64);
        let mut rng = crate::rng::Rng::keyed(7, "scan.threads", 0);
        let mut values: Vec<f32> = (0..k * f)
            .map(|_| rng.uniform_in(-3.0, 3.0) as f32)
            .collect();
        values[1_300 * f + 5] = f32::NAN;
        values[2_100 * f] = f32::INFINITY;
        let (head, tail) = values.split_at_mut(2_000 * f);
        tail[..f].copy_from_slice(&head[17 * f..18 * f]);
        let labels = (0..k as i64).map(|i| i % 3).collect();
        let shape = SampleShape {
            dims: vec![f],
            integer: false,
            labels: 1,
            targets: 0,
        };
        let d = MemoryDataset::new("t".into(), shape, values, labels, Vec::new()).unwrap();
        let report = |threads| {
            let opts = ScanOptions {
                threads,
                ..ScanOptions::default()
            };
            serde_json::to_string(&scan_dataset(&d, None, &opts).unwrap()).unwrap()
        };
        let one = report(1);
        assert!(
            one.contains("\"duplicate_sample\"") && one.contains("\"nan\""),
            "{one}"
        );
        assert_eq!(one, report(3));
    }

    /// f32 inputs viewed in place in the mapped file, and the same values
    /// stored as f64 (read as f64), give the same report to the bit, on one
    /// thread and on the pipeline of two.
    #[test]
    fn f32_in_place_and_f64_give_the_same_report() {
        use ::safetensors::tensor::TensorView;
        use ::safetensors::Dtype;
        let (k, f) = (3_000, 24);
        let mut rng = crate::rng::Rng::keyed(3, "scan.narrow", 0);
        let mut values: Vec<f32> = (0..k * f)
            .map(|_| rng.uniform_in(-5.0, 50.0) as f32)
            .collect();
        values[700 * f + 3] = f32::NAN;
        values[1_400 * f + 23] = f32::NEG_INFINITY;
        values[2_000 * f + 1] = 3e7;
        values[900 * f..901 * f].fill(0.0);
        let copy = values[12 * f..13 * f].to_vec(); // labels 12 % 4 = 2500 % 4
        values[2_500 * f..2_501 * f].copy_from_slice(&copy);
        let labels: Vec<i64> = (0..k as i64)
            .map(|i| if i == 77 { 9 } else { i % 4 })
            .collect();
        let dir = std::env::temp_dir().join(format!("nanhunt-scan-narrow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let label_bytes: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
        let wide: Vec<u8> = values
            .iter()
            .flat_map(|&v| f64::from(v).to_le_bytes())
            .collect();
        let narrow: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut reports = Vec::new();
        for (name, dtype, bytes) in [("f32", Dtype::F32, narrow), ("f64", Dtype::F64, wide)] {
            let path = dir.join(format!("{name}.safetensors"));
            let tensors = vec![
                (
                    "inputs",
                    TensorView::new(dtype, vec![k, f], &bytes).unwrap(),
                ),
                (
                    "labels",
                    TensorView::new(Dtype::I64, vec![k], &label_bytes).unwrap(),
                ),
            ];
            ::safetensors::serialize_to_file(tensors, None, &path).unwrap();
            let source = FileSource::new(&path);
            for threads in [1, 2] {
                let opts = ScanOptions {
                    classes: Some(4),
                    max_memory: 1 << 20,
                    threads,
                    ..ScanOptions::default()
                };
                let mut scan = scan_file(&source, &opts).unwrap();
                scan.dataset.clear();
                reports.push(serde_json::to_string(&scan).unwrap());
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        for kind in [
            "\"nan\"",
            "\"inf\"",
            "\"extreme\"",
            "all_zero",
            "duplicate_sample",
            "label_out",
        ] {
            assert!(reports[0].contains(kind), "{kind} in {}", reports[0]);
        }
        assert!(reports.iter().all(|r| *r == reports[0]), "{reports:#?}");
    }
}
