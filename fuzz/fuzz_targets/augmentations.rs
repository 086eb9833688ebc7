//! Augmentations documented as safe keep finite inputs finite.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use nanhunt::fuzzing::{self, Verdict};

fuzz_target!(
    init: fuzzing::init(),
    |data: &[u8]| -> Corpus {
        match fuzzing::augmentations_target(data) {
            Verdict::Reject => Corpus::Reject,
            Verdict::Pass => Corpus::Keep,
            Verdict::Violation(v) => panic!("{v}"),
        }
    }
);
