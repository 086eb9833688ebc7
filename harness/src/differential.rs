//! Differential runs: the same case on two or more devices, precisions or
//! thread counts, compared step by step (the article's step 5, "suspect the
//! hardware"). Reports the first step where an arm's loss or gradient norm
//! leaves the reference arm's by more than a named tolerance, and every
//! NaN/Inf that appears on some arms only.

use crate::error::{Error, Result};
use crate::finding::{FindingKind, Outcome, Signature, Trace, Verdict};
use crate::models::{factory_for, BuiltinFactory, ModelFactory};
use crate::runner::RunOptions;
use crate::spec::{Case, DeviceSpec, Precision};
use crate::training::run_model;
use serde::Serialize;

/// What differs between the arms.
#[derive(Clone, Debug, PartialEq)]
pub enum Arms {
    Devices(Vec<DeviceSpec>),
    Precisions(Vec<Precision>),
    /// Compute threads on the case's device (a rayon pool of each size).
    Threads(Vec<usize>),
}

/// A named tolerance: values a and b agree when
/// |a − b| ≤ abs + rel · max(|a|, |b|).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub name: &'static str,
    pub rel: f64,
    pub abs: f64,
}

impl Tolerance {
    /// Bit-identical: what one device owes the same case (thread counts).
    pub const BITWISE: Tolerance = Tolerance {
        name: "bitwise",
        rel: 0.0,
        abs: 0.0,
    };
    /// f32 on two devices: summation order and fused kernels differ, a few
    /// ulps per op, compounding over steps.
    pub const TIGHT: Tolerance = Tolerance {
        name: "tight",
        rel: 1e-4,
        abs: 1e-7,
    };
    /// A half precision against f32: 2^-8 (bf16) to 2^-11 (f16) per value.
    pub const LOOSE: Tolerance = Tolerance {
        name: "loose",
        rel: 5e-2,
        abs: 1e-4,
    };

    /// `bitwise`, `tight`, `loose`, or a relative tolerance as a number.
    pub fn parse(s: &str) -> std::result::Result<Tolerance, String> {
        match s {
            "bitwise" => Ok(Tolerance::BITWISE),
            "tight" => Ok(Tolerance::TIGHT),
            "loose" => Ok(Tolerance::LOOSE),
            _ => match s.parse::<f64>() {
                Ok(rel) if rel.is_finite() && rel >= 0.0 => Ok(Tolerance {
                    name: "custom",
                    rel,
                    abs: 0.0,
                }),
                _ => Err(format!(
                    "unknown tolerance `{s}`: expected bitwise, tight, loose or a relative tolerance ≥ 0"
                )),
            },
        }
    }

    /// The default for a comparison: bitwise across thread counts, loose
    /// when a half precision is involved, tight otherwise.
    pub fn default_for(arms: &Arms, case: &Case) -> Tolerance {
        let half = |p: &Precision| !matches!(p, Precision::F32 | Precision::F64);
        match arms {
            Arms::Threads(_) => Tolerance::BITWISE,
            Arms::Precisions(ps) if ps.iter().any(half) => Tolerance::LOOSE,
            Arms::Devices(_) if half(&case.precision) => Tolerance::LOOSE,
            _ => Tolerance::TIGHT,
        }
    }

    pub fn agree(&self, a: f64, b: f64) -> bool {
        if a.to_bits() == b.to_bits() {
            return true;
        }
        (a - b).abs() <= self.abs + self.rel * a.abs().max(b.abs())
    }
}

/// One arm's run.
#[derive(Clone, Debug, Serialize)]
pub struct ArmRun {
    pub label: String,
    /// Where the arm ran, and in how many compute threads (None: the
    /// process's default pool).
    pub device: DeviceSpec,
    pub threads: Option<usize>,
    pub verdict: Verdict,
    /// The first finding, if any.
    pub signature: Option<Signature>,
    pub finding_step: Option<usize>,
    /// The step of the first NaN/Inf/overflow, if any.
    pub non_finite_step: Option<usize>,
    pub losses: Vec<f64>,
    pub grad_norms: Vec<f64>,
}

/// Where an arm first left the reference.
#[derive(Clone, Debug, Serialize)]
pub struct Disagreement {
    pub arm: String,
    pub step: usize,
    /// `loss` or `grad_norm`.
    pub quantity: &'static str,
    pub reference: f64,
    pub value: f64,
    pub rel_diff: f64,
}

/// A NaN/Inf seen on some arms and not on others.
#[derive(Clone, Debug, Serialize)]
pub struct OneSided {
    pub arm: String,
    pub step: usize,
    pub signature: Signature,
    /// The arms that stayed finite through that step.
    pub finite_on: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Differential {
    pub tolerance: Tolerance,
    /// The first arm; the others are compared with it.
    pub reference: String,
    pub arms: Vec<ArmRun>,
    /// The earliest disagreement of each other arm (none when it agrees
    /// on every step both ran).
    pub disagreements: Vec<Disagreement>,
    /// The largest relative difference of each other arm's loss.
    pub max_rel_diff: Vec<(String, f64)>,
    pub one_sided: Vec<OneSided>,
}

impl Differential {
    /// Whether every arm agreed and no NaN was one-sided.
    pub fn agrees(&self) -> bool {
        self.disagreements.is_empty() && self.one_sided.is_empty()
    }
}

fn rel_diff(a: f64, b: f64) -> f64 {
    if a.to_bits() == b.to_bits() {
        return 0.0;
    }
    (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
}

fn arm_cases(case: &Case, arms: &Arms) -> Vec<(String, Case, Option<usize>)> {
    match arms {
        Arms::Devices(ds) => ds
            .iter()
            .map(|d| {
                let mut c = case.clone();
                c.device = *d;
                (d.to_string(), c, None)
            })
            .collect(),
        Arms::Precisions(ps) => ps
            .iter()
            .map(|p| {
                let mut c = case.clone();
                c.precision = p.clone();
                (p.name().to_string(), c, None)
            })
            .collect(),
        Arms::Threads(ts) => ts
            .iter()
            .map(|&t| {
                (
                    format!("{t} thread{}", if t == 1 { "" } else { "s" }),
                    case.clone(),
                    Some(t),
                )
            })
            .collect(),
    }
}

fn run_arm(
    label: String,
    case: &Case,
    threads: Option<usize>,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
) -> Result<ArmRun> {
    let opts = RunOptions {
        device: None,
        dump: None,
        ..opts.clone()
    };
    let outcome = match threads {
        Some(n) => crate::device::cpu_pool(n)?.install(|| run_model(case, factory, &opts))?,
        None => run_model(case, factory, &opts)?,
    };
    let empty = Trace::default();
    let (signature, finding_step, non_finite_step, trace) = match &outcome {
        Outcome::Unstable { finding } => {
            let non_finite = matches!(
                finding.kind,
                FindingKind::Nan
                    | FindingKind::Inf
                    | FindingKind::Overflow
                    | FindingKind::ScaleCollapse
            );
            (
                Some(finding.signature.clone()),
                Some(finding.step),
                non_finite.then_some(finding.step),
                &finding.trace,
            )
        }
        Outcome::Stable { trace } => (None, None, None, trace),
        Outcome::Rejected { reason } => {
            return Err(Error::Rejected(format!("arm `{label}`: {reason}")))
        }
    };
    let trace = if trace.losses.is_empty() {
        &empty
    } else {
        trace
    };
    Ok(ArmRun {
        label,
        device: case.device,
        threads,
        verdict: outcome.verdict(),
        signature,
        finding_step,
        non_finite_step,
        losses: trace.losses.clone(),
        grad_norms: trace.grad_norms.clone(),
    })
}

/// Runs the case once per arm and compares every arm with the first.
pub fn compare(
    case: &Case,
    factory: Option<&dyn ModelFactory>,
    arms: &Arms,
    tolerance: Tolerance,
    opts: &RunOptions,
) -> Result<Differential> {
    let cases = arm_cases(case, arms);
    if cases.len() < 2 {
        return Err(Error::option(
            "arms",
            "a differential needs at least two arms",
        ));
    }
    let builtin = BuiltinFactory::new(&case.model);
    let factory = factory_for(case, factory, &builtin)?;
    let runs = cases
        .into_iter()
        .map(|(label, c, threads)| run_arm(label, &c, threads, factory, opts))
        .collect::<Result<Vec<_>>>()?;
    let reference = &runs[0];
    let mut disagreements = Vec::new();
    let mut max_rel_diff = Vec::new();
    for arm in &runs[1..] {
        let mut worst: f64 = 0.0;
        let mut first = None;
        let series = [
            ("loss", &reference.losses, &arm.losses),
            ("grad_norm", &reference.grad_norms, &arm.grad_norms),
        ];
        for (quantity, r, a) in series {
            for (step, (&x, &y)) in r.iter().zip(a.iter()).enumerate() {
                if !(x.is_finite() && y.is_finite()) {
                    break; // non-finite values are the one-sided report's business
                }
                if quantity == "loss" {
                    worst = worst.max(rel_diff(x, y));
                }
                let earlier = first.as_ref().is_none_or(|d: &Disagreement| step < d.step);
                if !tolerance.agree(x, y) && earlier {
                    first = Some(Disagreement {
                        arm: arm.label.clone(),
                        step,
                        quantity,
                        reference: x,
                        value: y,
                        rel_diff: rel_diff(x, y),
                    });
                }
            }
        }
        max_rel_diff.push((arm.label.clone(), worst));
        disagreements.extend(first);
    }
    let mut one_sided = Vec::new();
    for arm in &runs {
        let Some(step) = arm.non_finite_step else {
            continue;
        };
        // Arms that ran past `step` (or through it) without going non-finite.
        let finite_on: Vec<String> = runs
            .iter()
            .filter(|o| o.non_finite_step.is_none_or(|s| s > step) && o.losses.len() > step)
            .map(|o| o.label.clone())
            .collect();
        if !finite_on.is_empty() {
            one_sided.push(OneSided {
                arm: arm.label.clone(),
                step,
                signature: arm
                    .signature
                    .clone()
                    .expect("a non-finite step has a finding"),
                finite_on,
            });
        }
    }
    Ok(Differential {
        tolerance,
        reference: reference.label.clone(),
        arms: runs,
        disagreements,
        max_rel_diff,
        one_sided,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerances_parse_and_compare() {
        assert_eq!(Tolerance::parse("tight").unwrap(), Tolerance::TIGHT);
        assert_eq!(Tolerance::parse("1e-3").unwrap().rel, 1e-3);
        assert!(Tolerance::parse("-1").is_err());
        assert!(Tolerance::parse("close").is_err());
        assert!(Tolerance::BITWISE.agree(1.0, 1.0));
        assert!(!Tolerance::BITWISE.agree(1.0, 1.0 + f64::EPSILON));
        assert!(Tolerance::TIGHT.agree(1.0, 1.00005));
        assert!(!Tolerance::TIGHT.agree(1.0, 1.001));
        assert!(Tolerance::LOOSE.agree(1.0, 1.04));
    }

    #[test]
    fn threads_agree_bitwise_and_precisions_within_loose() {
        let case = Case::example("transformer").unwrap();
        let opts = RunOptions::default();
        let d = compare(
            &case,
            None,
            &Arms::Threads(vec![1, 2]),
            Tolerance::BITWISE,
            &opts,
        )
        .unwrap();
        assert!(d.agrees(), "{:?}", d.disagreements);
        assert_eq!(d.arms[0].losses.len(), case.steps);
        let arms = Arms::Precisions(vec![Precision::F64, Precision::F32]);
        let d = compare(
            &case,
            None,
            &arms,
            Tolerance::default_for(&arms, &case),
            &opts,
        )
        .unwrap();
        assert!(d.agrees(), "{:?}", d.disagreements);
        assert!(d.max_rel_diff[0].1 > 0.0, "f32 and f64 differ in some bit");
        // A bitwise comparison of f32 with f64 must fail at step 0.
        let d = compare(&case, None, &arms, Tolerance::BITWISE, &opts).unwrap();
        assert_eq!(d.disagreements[0].step, 0);
    }

    #[test]
    fn a_nan_on_one_precision_only_is_reported() {
        // Pure f16 Adam: eps 1e-8 underflows to 0, so the update divides by 0.
        let case = Case::example("transformer").unwrap();
        let arms = Arms::Precisions(vec![Precision::F32, Precision::F16]);
        let d = compare(&case, None, &arms, Tolerance::LOOSE, &RunOptions::default()).unwrap();
        assert!(!d.agrees());
        let one = &d.one_sided[0];
        assert_eq!(one.arm, "f16");
        assert_eq!(one.finite_on, vec!["f32".to_string()]);
    }
}
