//! Cases inside the documented safe envelope stay finite (NANHUNT_ENVELOPE=planted: the planted unsafe envelope).
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use nanhunt::fuzzing::{self, Envelope, Verdict};
use std::sync::LazyLock;

static ENVELOPE: LazyLock<Envelope> = LazyLock::new(Envelope::from_env);

fuzz_target!(
    init: fuzzing::init(),
    |data: &[u8]| -> Corpus {
        match fuzzing::safe_envelope_target(data, *ENVELOPE) {
            Verdict::Reject => Corpus::Reject,
            Verdict::Pass => Corpus::Keep,
            Verdict::Violation(v) => panic!("{v}"),
        }
    }
);
