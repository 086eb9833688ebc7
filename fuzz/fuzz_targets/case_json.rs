//! The case parser never panics, and valid cases survive a JSON round trip.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use nanhunt::fuzzing::{self, Verdict};

fuzz_target!(
    init: fuzzing::init(),
    |data: &[u8]| -> Corpus {
        match fuzzing::case_json(data) {
            Verdict::Reject => Corpus::Reject,
            Verdict::Pass => Corpus::Keep,
            Verdict::Violation(v) => panic!("{v}"),
        }
    }
);
