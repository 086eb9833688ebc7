//! Any valid case runs to an Outcome without a panic or an unexpected error.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use nanhunt::fuzzing::{self, Verdict};

fuzz_target!(
    init: fuzzing::init(),
    |data: &[u8]| -> Corpus {
        match fuzzing::case_runs(data) {
            Verdict::Reject => Corpus::Reject,
            Verdict::Pass => Corpus::Keep,
            Verdict::Violation(v) => panic!("{v}"),
        }
    }
);
