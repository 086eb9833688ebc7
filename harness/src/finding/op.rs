//! What a stage computes, as a type: explanations, localization and
//! diagnose branch on it, never on a stage's name. A model declares it when
//! it records the stage (`Tracer::record_as`, `nanhunt::trace_as`); the
//! built-in models declare every stage. A stage recorded by name only gets
//! the kind its name reads as ([`OpKind::from_name`]), marked as such so
//! that the output can say it was a guess.

use serde::{Deserialize, Serialize};

pub use crate::opkind::OpKind;

/// How a stage's op kind is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpSource {
    /// The model declared it when it recorded the stage.
    Declared,
    /// Read from the stage's name (a fallback: the output says so).
    Name,
}

/// The kind of a stage's op and how it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StageOp {
    /// What the stage computes.
    pub kind: OpKind,
    /// How that is known.
    pub source: OpSource,
}

impl StageOp {
    /// An op kind the model declared.
    pub fn declared(kind: OpKind) -> StageOp {
        StageOp {
            kind,
            source: OpSource::Declared,
        }
    }

    /// The kind of `stage` as declared, else as its name reads.
    pub fn of(stage: &str, declared: Option<OpKind>) -> Option<StageOp> {
        match declared {
            Some(kind) => Some(StageOp::declared(kind)),
            None => OpKind::from_name(stage).map(|kind| StageOp {
                kind,
                source: OpSource::Name,
            }),
        }
    }

    /// Whether the kind was read from the stage's name.
    pub fn guessed(&self) -> bool {
        self.source == OpSource::Name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_kind_wins_over_the_name() {
        let op = StageOp::of("logits", Some(OpKind::Exp)).unwrap();
        assert_eq!((op.kind, op.guessed()), (OpKind::Exp, false));
        let op = StageOp::of("middle.log", None).unwrap();
        assert_eq!((op.kind, op.guessed()), (OpKind::Log, true));
    }
}
