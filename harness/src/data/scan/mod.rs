//! The source article's `check_data_sanity`, over a whole dataset rather
//! than one batch: non-finite and extreme values, labels outside the class
//! range, all-zero and duplicated samples, constant features, per-feature
//! statistics with a robust scale, the offending samples by index and the
//! fixes the article names. A file is scanned as a stream, a chunk of
//! samples at a time, within a memory limit that does not grow with the
//! file or the sample count: duplicates and quantiles come from bounded
//! sketches whose error the scan states.

mod duplicates;
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
use super::files::{self, Chunk};
use crate::error::{Document, Error, Result};
use crate::spec::FileSource;

/// Scans a dataset file as a stream.
pub fn scan_file(source: &FileSource, opts: &ScanOptions) -> Result<DataScan> {
    let mut reader = files::open(source, opts.max_memory)?;
    let shape = reader.shape().clone();
    let plan = Plan::new(&shape, opts.max_memory)
        .map_err(|r| Error::malformed(Document::Dataset, &source.path, r))?;
    let per = plan.chunk;
    let mut opts = opts.clone();
    opts.classes = opts.classes.or(reader.classes());
    let mut scanner = Scanner::new(shape, opts, &plan);
    let mut chunk = Chunk::default();
    loop {
        chunk.clear();
        if reader.read(per, &mut chunk)? == 0 {
            break;
        }
        scanner.push(&chunk);
    }
    Ok(scanner.finish(source.path.display().to_string()))
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
    let per = plan.chunk;
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
        let chunk = Chunk {
            values: rows.values.iter().map(|&v| f64::from(v)).collect(),
            labels: rows.labels.clone(),
            targets: Vec::new(),
        };
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
}
