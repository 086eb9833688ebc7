//! A finding's dedup key, and what a run is for its signatures.

use super::{FindingKind, Phase};
use crate::spec::{Case, DeviceSpec, ModelSpec, PrecisionKind};
use serde::{Deserialize, Serialize};

/// The dedup key of a finding: what failed, where (the stage without its
/// indices, see [`stage_key`]), under which configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Signature {
    /// What went wrong.
    pub kind: FindingKind,
    /// Where in the step.
    pub phase: Phase,
    /// The stage, without indices.
    pub stage: String,
    /// The model family.
    pub family: String,
    /// The optimizer's name.
    pub optimizer: String,
    /// The precision.
    pub precision: PrecisionKind,
    /// The device.
    pub device: DeviceSpec,
}

/// How a run's stages become signature keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKeys {
    /// A built-in family: every index dropped (`layer0.t3.gates` and
    /// `layer1.t7.gates` are one block's one fault).
    Family,
    /// A user's model: only the harness's own indices dropped; `fc1` and
    /// `fc2` are different layers.
    User,
}

impl StageKeys {
    /// The stage's signature key under these keys.
    pub fn key(self, stage: &str) -> String {
        match self {
            StageKeys::Family => stage_key(stage),
            StageKeys::User => user_stage_key(stage),
        }
    }
}

/// What a run is, as its signatures name it: the model (a built-in family
/// or the name of a user's model), the optimizer, the precision and the
/// device. The runner reads it from the case, the guard from its options
/// and the user's variables; both build every signature through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// The model family.
    pub family: String,
    /// The optimizer's name.
    pub optimizer: String,
    /// The precision.
    pub precision: PrecisionKind,
    /// The device.
    pub device: DeviceSpec,
    /// How stages become signature keys.
    pub keys: StageKeys,
}

impl Subject {
    /// What a run of `case` is.
    pub fn of_case(case: &Case) -> Subject {
        Subject {
            family: case.family().to_string(),
            optimizer: case.optimizer.name().to_string(),
            precision: case.precision.kind(),
            device: case.device,
            keys: match case.model {
                ModelSpec::Custom(_) => StageKeys::User,
                _ => StageKeys::Family,
            },
        }
    }

    /// The signature of a failure of this run.
    pub fn signature(&self, kind: FindingKind, phase: Phase, stage: &str) -> Signature {
        Signature {
            kind,
            phase,
            stage: self.keys.key(stage),
            family: self.family.clone(),
            optimizer: self.optimizer.clone(),
            precision: self.precision,
            device: self.device,
        }
    }
}

/// The stage as a dedup key: indices dropped, so that the same fault in
/// `layer0.t3.gates` and `layer1.t7.gates`, or in `data.pathologies[1].nan`
/// and `data.pathologies[0].nan`, is one signature (`layer.t.gates`,
/// `data.pathologies.nan`). The finding keeps the precise stage.
pub fn stage_key(stage: &str) -> String {
    let stripped: String = stage
        .chars()
        .filter(|c| !c.is_ascii_digit() && *c != '[' && *c != ']')
        .collect();
    let mut out = String::with_capacity(stripped.len());
    for part in stripped.split('.').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(part);
    }
    out
}

/// The stage as a dedup key in a user's model: only the harness's own
/// indices are dropped (`data.pathologies[1].nan` → `data.pathologies.nan`),
/// the digits of the user's names are kept: `fc1` and `fc2` are different
/// layers, not two copies of one block as `layer0`/`layer1` of a built-in
/// family are.
pub fn user_stage_key(stage: &str) -> String {
    replace_indices(stage, "")
}

/// `name` with every numeric index (`[3]`) replaced by `with`; other
/// brackets (`[x]`) are kept.
pub fn replace_indices(name: &str, with: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close)
                if rest[open + 1..open + close]
                    .chars()
                    .all(|c| c.is_ascii_digit()) =>
            {
                out.push_str(&rest[..open]);
                out.push_str(with);
                rest = &rest[open + close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl Signature {
    /// A file-system-safe name: lowercase ASCII letters, digits, '-', '_'
    /// and '.'; anything else becomes '_'.
    pub fn slug(&self) -> String {
        let raw = format!(
            "{}-{}-{}-{}-{}-{}-{}",
            self.kind.as_str(),
            self.phase.as_str(),
            self.stage,
            self.family,
            self.optimizer,
            self.precision,
            self.device
        );
        let mut out = String::with_capacity(raw.len());
        for ch in raw.chars() {
            let c = ch.to_ascii_lowercase();
            match c {
                ']' => {}
                c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => out.push(c),
                _ => out.push('_'),
            }
        }
        out.truncate(120);
        out
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in {} at `{}` ({} / {} / {} / {})",
            self.kind.as_str(),
            self.phase.as_str(),
            self.stage,
            self.family,
            self.optimizer,
            self.precision,
            self.device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_stage_keys_keep_the_users_digits() {
        assert_eq!(user_stage_key("grad.fc1.weight"), "grad.fc1.weight");
        assert_ne!(
            user_stage_key("grad.fc1.weight"),
            user_stage_key("grad.fc2.weight")
        );
        assert_eq!(
            user_stage_key("data.pathologies[1].nan"),
            "data.pathologies.nan"
        );
        assert_eq!(user_stage_key("augment[2].normalize"), "augment.normalize");
        assert_eq!(user_stage_key("blocks[x].norm2"), "blocks[x].norm2");
    }

    #[test]
    fn stage_keys_drop_indices() {
        assert_eq!(stage_key("layer0.t3.gates"), "layer.t.gates");
        assert_eq!(stage_key("data.pathologies[1].nan"), "data.pathologies.nan");
        assert_eq!(stage_key("augment[2].normalize"), "augment.normalize");
        assert_eq!(stage_key("param.block2.conv.bias"), "param.block.conv.bias");
        assert_eq!(stage_key("loss.cross_entropy"), "loss.cross_entropy");
    }

    #[test]
    fn typed_precision_and_device_serialize_by_name() {
        let subject = Subject {
            family: "cnn".into(),
            optimizer: "adam".into(),
            precision: PrecisionKind::MixedF16,
            device: DeviceSpec::Cuda(1),
            keys: StageKeys::Family,
        };
        let sig = subject.signature(FindingKind::Nan, Phase::Backward, "block2.bn");
        let json = serde_json::to_value(&sig).unwrap();
        assert_eq!(json["precision"], "mixed_f16");
        assert_eq!(json["device"], "cuda:1");
        assert_eq!(json["stage"], "block.bn");
        assert_eq!(
            sig.slug(),
            "nan-backward-block.bn-cnn-adam-mixed_f16-cuda_1"
        );
    }
}
