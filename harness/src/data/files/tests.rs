//! Each format loads the same samples; broken files give errors that name
//! the file and the part.

use super::*;
use ::safetensors::tensor::TensorView;
use ::safetensors::Dtype;
use npyz::WriterBuilder;
use std::io::Write;

/// 6 samples of 2×3 values (sample s, value j = 10 s + j) and labels s % 3.
fn values() -> Vec<f32> {
    (0..6)
        .flat_map(|s| (0..6).map(move |j| (10 * s + j) as f32))
        .collect()
}
fn labels() -> Vec<i64> {
    (0..6).map(|s| s % 3).collect()
}

/// A fresh directory for one test, which removes it when it passes.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nanhunt-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    // The values are plain numbers: their bytes, little-endian on the test machines.
    let n = std::mem::size_of_val(v);
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, n) }.to_vec()
}

fn write_safetensors(path: &Path, labels_dtype: Dtype, label_rows: usize) {
    let v = bytes(&values());
    let l: Vec<u8> = match labels_dtype {
        Dtype::F32 => bytes(
            &labels()
                .iter()
                .map(|&l| l as f32 + 0.5)
                .take(label_rows)
                .collect::<Vec<_>>(),
        ),
        _ => bytes(&labels()[..label_rows]),
    };
    let tensors = vec![
        (
            "inputs",
            TensorView::new(Dtype::F32, vec![6, 2, 3], &v).unwrap(),
        ),
        (
            "labels",
            TensorView::new(labels_dtype, vec![label_rows], &l).unwrap(),
        ),
    ];
    ::safetensors::serialize_to_file(tensors, None, path).unwrap();
}

fn write_npy<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[u64], data: &[T]) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(file)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

fn npy_bytes<T: npyz::AutoSerialize + Copy>(shape: &[u64], data: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut out)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    out
}

fn write_npz(path: &Path, compressed: bool) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let method = if compressed {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    zip.start_file("inputs.npy", opts).unwrap();
    zip.write_all(&npy_bytes(&[6, 2, 3], &values())).unwrap();
    zip.start_file("labels.npy", opts).unwrap();
    zip.write_all(&npy_bytes(&[6], &labels())).unwrap();
    zip.finish().unwrap();
}

fn write_csv(path: &Path) {
    let mut text = String::from("a,b,label,c,d,e,f\n");
    for (s, row) in values().chunks(6).enumerate() {
        let f: Vec<String> = row.iter().map(|v| v.to_string()).collect();
        text += &format!("{},{},{},{}\n", f[0], f[1], labels()[s], f[2..].join(","));
    }
    std::fs::write(path, text).unwrap();
}

fn loaded(source: &FileSource) -> Result<Arc<MemoryDataset>> {
    load(source, 1 << 30)
}

#[test]
fn every_format_loads_the_same_samples() {
    let d = dir("formats");
    write_safetensors(&d.join("x.safetensors"), Dtype::I64, 6);
    write_npy(&d.join("x.npy"), &[6, 2, 3], &values());
    write_npy(&d.join("y.npy"), &[6], &labels());
    write_npz(&d.join("stored.npz"), false);
    write_npz(&d.join("deflated.npz"), true);
    write_csv(&d.join("x.csv"));
    let mut npy = FileSource::new(d.join("x.npy"));
    npy.labels = Some("y.npy".into());
    let mut csv = FileSource::new(d.join("x.csv"));
    csv.labels = Some("label".into());
    let sources = [
        FileSource::new(d.join("x.safetensors")),
        npy,
        FileSource::new(d.join("stored.npz")),
        FileSource::new(d.join("deflated.npz")),
        csv,
    ];
    for source in &sources {
        let ds = loaded(source).unwrap_or_else(|e| panic!("{}: {e}", source.path.display()));
        assert_eq!(ds.values, values(), "{}", source.path.display());
        assert_eq!(ds.labels, labels(), "{}", source.path.display());
        assert_eq!(crate::data::Dataset::len(&*ds), 6);
        assert_eq!(ds.shape.numel(), 6);
        assert_eq!(ds.sha256.as_ref().map(String::len), Some(64));
    }
    assert_eq!(loaded(&sources[0]).unwrap().shape.dims, vec![2, 3]);
    assert_eq!(loaded(&sources[4]).unwrap().shape.dims, vec![6]);
    // The npy source hashes both files.
    let both = sha256(&[d.join("x.npy"), d.join("y.npy")]).unwrap();
    assert_eq!(loaded(&sources[1]).unwrap().sha256.as_deref(), Some(&*both));
    std::fs::remove_dir_all(&d).unwrap();
}

fn error_of(source: &FileSource) -> String {
    match loaded(source) {
        Ok(_) => panic!("{} loaded", source.path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_files_name_the_file_and_the_part() {
    let d = dir("broken");
    let path = d.join("x.safetensors");
    write_safetensors(&path, Dtype::I64, 6);
    let whole = std::fs::read(&path).unwrap();

    // Truncated: the header promises more bytes than there are.
    let cut = d.join("cut.safetensors");
    std::fs::write(&cut, &whole[..whole.len() - 10]).unwrap();
    let e = error_of(&FileSource::new(&cut));
    assert!(
        e.contains("cannot parse dataset") && e.contains("cut.safetensors"),
        "{e}"
    );

    // Corrupted header.
    let mut bad = whole.clone();
    bad[10] = b'#';
    let corrupt = d.join("corrupt.safetensors");
    std::fs::write(&corrupt, bad).unwrap();
    let e = error_of(&FileSource::new(&corrupt));
    assert!(e.contains("corrupt.safetensors"), "{e}");

    // Labels of a float dtype.
    let float = d.join("float.safetensors");
    write_safetensors(&float, Dtype::F32, 6);
    let e = error_of(&FileSource::new(&float));
    assert!(
        e.contains("float.safetensors") && e.contains("`labels`") && e.contains("integer"),
        "{e}"
    );

    // Labels for 5 samples, inputs for 6.
    let short = d.join("short.safetensors");
    write_safetensors(&short, Dtype::I64, 5);
    let e = error_of(&FileSource::new(&short));
    assert!(e.contains("`labels` holds 5 samples, the inputs 6"), "{e}");

    // A tensor that is not there.
    let mut named = FileSource::new(&path);
    named.inputs = "pixels".into();
    let e = error_of(&named);
    assert!(
        e.contains("no tensor `pixels` (it has inputs, labels)"),
        "{e}"
    );

    // A missing file, with the hash the case expected.
    let mut missing = FileSource::new(d.join("gone.safetensors"));
    missing.sha256 = Some("ab".repeat(32));
    let e = error_of(&missing);
    assert!(
        e.contains("gone.safetensors") && e.contains("missing") && e.contains(&"ab".repeat(32)),
        "{e}"
    );

    // A changed file.
    let mut pinned = FileSource::new(&path);
    pinned.sha256 = Some("00".repeat(32));
    let e = error_of(&pinned);
    assert!(e.contains("changed since the case was written"), "{e}");

    // Not an npy file; an npz without the array.
    std::fs::write(d.join("junk.npy"), b"not numpy").unwrap();
    write_npy(&d.join("labels.npy"), &[6], &labels());
    let e = error_of(&FileSource::new(d.join("junk.npy")));
    assert!(
        e.contains("junk.npy") && e.contains("not a .npy file"),
        "{e}"
    );
    write_npz(&d.join("a.npz"), true);
    let mut other = FileSource::new(d.join("a.npz"));
    other.labels = Some("y".into());
    let e = error_of(&other);
    assert!(
        e.contains("a.npz") && e.contains("no array `y` (it has inputs, labels)"),
        "{e}"
    );

    // CSV: a field that is not a number; a label that is not a class.
    std::fs::write(d.join("t.csv"), "x,label\n1.5,0\nabc,1\n").unwrap();
    let mut csv = FileSource::new(d.join("t.csv"));
    csv.labels = Some("label".into());
    let e = error_of(&csv);
    assert!(
        e.contains("t.csv") && e.contains("line 3, column `x`: `abc` is not a number"),
        "{e}"
    );
    std::fs::write(d.join("s.csv"), "x,label\n1.5,setosa\n").unwrap();
    let mut csv = FileSource::new(d.join("s.csv"));
    csv.labels = Some("label".into());
    let e = error_of(&csv);
    assert!(e.contains("label-encode"), "{e}");
    // Empty fields are missing values, not errors.
    std::fs::write(d.join("m.csv"), "x,label\n,0\n2,1\n").unwrap();
    let mut csv = FileSource::new(d.join("m.csv"));
    csv.labels = Some("label".into());
    assert!(loaded(&csv).unwrap().values[0].is_nan());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_load_larger_than_the_memory_limit_is_refused() {
    let d = dir("limit");
    let path = d.join("x.safetensors");
    write_safetensors(&path, Dtype::I64, 6);
    let e = load(&FileSource::new(&path), 64).err().unwrap().to_string();
    assert!(e.contains("over the limit"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
