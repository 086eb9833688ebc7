use super::*;
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../corpora")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::keyed(seed, "fuzz.test", 0);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

#[test]
fn every_target_passes_its_seed_corpus_and_most_seeds_are_valid() {
    for target in TARGETS {
        let files = corpus(target);
        assert!(files.len() >= 4, "{target}: {} seeds", files.len());
        let mut valid = 0;
        for (path, bytes) in &files {
            match check(target, bytes, Envelope::Documented).unwrap() {
                Verdict::Violation(v) => panic!("{}: {v}", path.display()),
                Verdict::Pass => valid += 1,
                Verdict::Reject => {}
            }
        }
        assert!(
            valid * 2 >= files.len(),
            "{target}: only {valid} valid seeds"
        );
    }
}

#[test]
fn random_bytes_mostly_decode_to_valid_cases() {
    let valid = (0..200)
        .filter(|&s| {
            training_case("case_runs", &random_bytes(s, 256), Envelope::Documented)
                .is_some_and(|c| c.validate(&limits()).is_ok())
        })
        .count();
    eprintln!("{valid} of 200 valid");
    assert!(valid >= 100, "{valid} of 200");
}

#[test]
fn the_planted_envelope_is_caught_and_the_documented_one_holds() {
    // The same inputs: the planted envelope (Adam eps 0 allowed) must produce
    // a NaN within a bounded number of inputs; the documented one none.
    let mut planted_found = None;
    for s in 0..300 {
        let bytes = random_bytes(1000 + s, 256);
        if let Verdict::Violation(v) = safe_envelope_target(&bytes, Envelope::Documented) {
            panic!("documented envelope violated by input {s}: {v}");
        }
        if let Verdict::Violation(v) = safe_envelope_target(&bytes, Envelope::Planted) {
            planted_found = Some((s, v));
            break;
        }
    }
    let (s, v) = planted_found.expect("the planted envelope was never violated in 300 inputs");
    eprintln!("planted: input {s}: {v}");
    assert!(v.contains("nan"), "input {s}: {v}");
}

#[test]
fn targets_flag_what_they_must() {
    // An undocumented loss configuration is rejected, not checked.
    use crate::spec::LossSpec;
    assert_eq!(losses::stable_domain(&LossSpec::Bce { eps: 0.0 }), None);
    // A documented loss with an overflowing logit is a violation: the check can fail.
    let input = decode::LossInput {
        loss: LossSpec::Mse {
            root: false,
            eps: 0.0,
        },
        rows: 1,
        classes: 2,
        logits: vec![3e19, 0.0],
        labels: vec![0],
    };
    let (value, _) = loss_value_and_gradient(&input).unwrap();
    assert!(
        !value.is_finite(),
        "outside the documented 1e18 the square overflows"
    );
    // Bytes that are not UTF-8 are rejected; malformed JSON is parsed (an
    // error, no panic) and rejected from the corpus, so that the corpus
    // keeps inputs that reach validation; a parsed but invalid case passes.
    assert_eq!(case_json(&[0xff, 0xfe]), Verdict::Reject);
    assert_eq!(case_json(b"{\"format\": 1"), Verdict::Reject);
    let other_format = Case::example("cnn")
        .unwrap()
        .to_json()
        .replace("\"format\": 1", "\"format\": 2");
    assert_eq!(case_json(other_format.as_bytes()), Verdict::Pass);
    assert_eq!(check("nope", b"", Envelope::Documented), None);
}

#[test]
fn structured_case_json_inputs_mostly_parse_and_reach_validation() {
    let mut share = CaseJsonShare::default();
    for seed in 0..400 {
        let mut bytes = random_bytes(seed, 64);
        bytes[0] = 0; // the structured form
        share.add(&bytes);
    }
    eprintln!("{share:?}");
    // Each edit breaks the parse only where it changes a type or removes a
    // required field; most inputs must still be cases.
    assert!(share.parse * 10 >= share.inputs * 6, "{share:?}");
    // ... and validation must see both verdicts.
    assert!(share.valid > 0 && share.valid < share.parse, "{share:?}");
}

#[test]
fn a_custom_image_input_too_large_to_count_is_rejected_not_an_overflow() {
    // The regression from the parser fuzz target: 65536^3 inputs at batch 256
    // overflowed the memory estimate (a panic with overflow checks, a wrap
    // to 0 bytes without).
    let (_, bytes) = corpus("case_json")
        .into_iter()
        .find(|(p, _)| p.ends_with("regression-custom_image_overflow.json"))
        .expect("the regression input is checked in");
    assert_eq!(case_json(&bytes), Verdict::Pass);
    let case = Case::from_json(std::str::from_utf8(&bytes).unwrap()).unwrap();
    let e = case.validate(&Limits::default()).unwrap_err().to_string();
    assert!(
        e.contains("estimated memory") && e.contains("exceeds"),
        "{e}"
    );
}
