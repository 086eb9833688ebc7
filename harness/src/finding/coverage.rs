//! Gradient coverage as a finding carries it: which trainable tensors a
//! backward pass missed, by module, their share, where the recorded flow
//! stops and candle's ops without a backward pass ([`crate::coverage`]
//! computes it).

use serde::{Deserialize, Serialize};

/// What one backward pass reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradientCoverage {
    /// Trainable tensors checked (those declared frozen left out).
    pub tensors: usize,
    /// Their elements.
    pub parameters: usize,
    /// Tensors without a gradient, and their elements.
    pub frozen_tensors: usize,
    /// Their elements.
    pub frozen_parameters: usize,
    /// `frozen_parameters / parameters`: the share of the model that would
    /// silently never train.
    pub frozen_share: f64,
    /// The frozen tensors grouped by module path, in creation order.
    pub modules: Vec<FrozenModule>,
    /// Where the flow stops among the recorded stages (with tracing on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stops_at: Option<FlowStop>,
    /// The ops of the linked candle with no backward pass (checked by
    /// running each) that can explain the cuts, with what to use instead:
    /// all of them when no cut could be read from the frozen tensors.
    pub no_backward_ops: Vec<NoBackwardOp>,
    /// Where the frozen tensors say the graph is cut, and by which op.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<Cut>,
}

/// What a cut's frozen tensors look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CutKind {
    /// A norm module whose own weight (and bias) get no gradient while
    /// what is around it trains: its fused op has no backward pass.
    NormOp,
    /// Some sibling projections of one module lose their gradient while
    /// the others train: a branch that merges again, as the attention
    /// scores (queries, keys and what is added to the scores) merge with
    /// the values after the softmax.
    Branch,
    /// Everything inside a module, nested layers and all, loses its
    /// gradient while a module after it trains: an op at its output.
    Trunk,
}

/// One place where the gradient stops, read from which tensors lost it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// What cut the flow.
    pub kind: CutKind,
    /// The module the op is in (a branch's: the module whose projections
    /// split; a norm's and a trunk's: the frozen module itself).
    pub module: String,
    /// The frozen parts under `module` (a branch's projections), or empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<String>,
    /// Their siblings that train (a branch's), or empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trained: Vec<String>,
    /// The candle ops without a backward pass that can make this cut.
    pub ops: Vec<String>,
}

impl Cut {
    /// One clause for a finding's detail.
    pub fn describe(&self) -> String {
        let ops = self.ops.join(" or ");
        match self.kind {
            CutKind::NormOp => format!(
                "`{}` is a norm whose own op has no backward pass ({ops})",
                self.module
            ),
            CutKind::Branch => format!(
                "in `{}`, {} get no gradient but {} do: the branch they feed stops at {ops}",
                self.module,
                self.frozen.join(", "),
                self.trained.join(", ")
            ),
            CutKind::Trunk => format!(
                "all of `{}` gets no gradient: the flow stops at its output, at {ops}",
                self.module
            ),
        }
    }
}

/// The frozen tensors of one module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenModule {
    /// The path before the tensor's own name (`encoder.layer.0.attention.self.query`).
    pub module: String,
    /// The tensors' own names (`weight`, `bias`).
    pub tensors: Vec<String>,
    /// Their elements.
    pub parameters: usize,
}

/// The recorded stage nearest the loss that the gradient does not reach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowStop {
    /// The stage with no gradient.
    pub stage: String,
    /// The next recorded stage in execution order, which has one: the op
    /// without a backward pass lies between the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// An op of candle with no backward pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoBackwardOp {
    /// The op's name as candle's error gives it.
    pub op: String,
    /// The differentiable op or module to use instead.
    pub replacement: String,
}

impl GradientCoverage {
    /// One paragraph for a finding's detail and the command line.
    pub fn summary(&self) -> String {
        let modules: Vec<String> = self
            .modules
            .iter()
            .take(6)
            .map(|m| {
                let path = if m.module.is_empty() {
                    "(top)"
                } else {
                    &m.module
                };
                format!("{path} ({})", m.tensors.join(", "))
            })
            .collect();
        let more = match self.modules.len() {
            n if n > 6 => format!(" and {} more modules", n - 6),
            _ => String::new(),
        };
        let stop = match &self.stops_at {
            Some(FlowStop {
                stage,
                next: Some(next),
            }) => format!(
                "; the gradient stops between stages `{stage}` and `{next}`: an op there has no backward pass"
            ),
            Some(FlowStop { stage, next: None }) => {
                format!("; no gradient reaches stage `{stage}` or any stage after it")
            }
            None => String::new(),
        };
        let ops: Vec<String> = self
            .no_backward_ops
            .iter()
            .map(|o| format!("{} -> {}", o.op, o.replacement))
            .collect();
        let cuts = match self.cuts.len() {
            0 => String::new(),
            n => {
                let shown: Vec<String> = self.cuts.iter().take(4).map(Cut::describe).collect();
                let more = if n > 4 {
                    format!(" (and {} more)", n - 4)
                } else {
                    String::new()
                };
                format!(". Where: {}{more}", shown.join("; "))
            }
        };
        let which = if self.cuts.is_empty() {
            "candle ops without a backward pass"
        } else {
            "The candle ops without a backward pass that make these cuts"
        };
        format!(
            "{} of {} trainable tensors ({:.1}% of {} parameters) received no gradient and would silently never train: {}{more}{stop}{cuts}. {which}, and their replacements: {}; or declare deliberately frozen tensors frozen",
            self.frozen_tensors,
            self.tensors,
            100.0 * self.frozen_share,
            self.parameters,
            modules.join("; "),
            ops.join("; ")
        )
    }

    /// The stage a `no_gradient` finding names: where the recorded flow
    /// stops, else the first frozen tensor (`param.<name>`).
    pub fn stage(&self) -> String {
        match &self.stops_at {
            Some(stop) => stop.stage.clone(),
            None => format!(
                "param.{}",
                self.frozen_names()
                    .first()
                    .map(String::as_str)
                    .unwrap_or("?")
            ),
        }
    }

    /// Every frozen tensor's full name, in creation order.
    pub fn frozen_names(&self) -> Vec<String> {
        self.modules
            .iter()
            .flat_map(|m| {
                m.tensors.iter().map(move |t| match m.module.as_str() {
                    "" => t.clone(),
                    module => format!("{module}.{t}"),
                })
            })
            .collect()
    }
}
