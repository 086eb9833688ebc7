//! The types a run ends in, under the path they had before they moved to
//! [`crate::finding`] (kept so that users' imports keep compiling).

pub use crate::finding::{
    replace_indices, stage_key, user_stage_key, Finding, FindingKind, Outcome, Phase, Signature,
    Trace, TraceMark, Verdict,
};
