//! How many inputs of a `case_json` corpus reach validation (parse as a
//! case): `cargo run -p nanhunt-bench-tools --bin case_json_share -- DIR...`.
//! `.ci/fuzz` prints it for the corpus a fuzzing run grew.

use nanhunt::fuzzing::CaseJsonShare;

fn main() -> anyhow::Result<()> {
    let mut share = CaseJsonShare::default();
    for dir in std::env::args().skip(1) {
        for entry in std::fs::read_dir(&dir).map_err(|e| anyhow::anyhow!("{dir}: {e}"))? {
            let path = entry?.path();
            if path.is_file() {
                share.add(&std::fs::read(&path)?);
            }
        }
    }
    let pct = |n: usize| 100.0 * n as f64 / share.inputs.max(1) as f64;
    println!(
        "case_json corpus: {} inputs, {} parse as a case ({:.1}%), {} valid ({:.1}%)",
        share.inputs,
        share.parse,
        pct(share.parse),
        share.valid,
        pct(share.valid)
    );
    Ok(())
}
