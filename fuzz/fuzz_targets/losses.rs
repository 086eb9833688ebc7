//! Losses documented as stable stay finite, with finite gradients, over their documented domain.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use nanhunt::fuzzing::{self, Verdict};

fuzz_target!(
    init: fuzzing::init(),
    |data: &[u8]| -> Corpus {
        match fuzzing::losses_target(data) {
            Verdict::Reject => Corpus::Reject,
            Verdict::Pass => Corpus::Keep,
            Verdict::Violation(v) => panic!("{v}"),
        }
    }
);
