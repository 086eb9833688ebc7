//! Where the graph is cut, read from which tensors lost their gradient.
//!
//! candle keeps an op's graph private, so a third-party model without
//! traced stages cannot be walked; but the shape of what is frozen tells
//! the op apart. A norm module whose own weight gets no gradient while the
//! layers around it train is its fused op. Queries and keys frozen while
//! the values train are the attention scores' branch: a fused softmax (or
//! a rope on the two of them); a third projection frozen beside them (a
//! relative position bias, added to the scores) leaves the softmax alone.
//! A whole nested module frozen before a module that trains is cut at its
//! output, by a norm it holds. Only the ops that fit are named.

use crate::finding::{Cut, CutKind};

/// A fused candle op that may have no backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fused {
    SoftmaxLastDim,
    LayerNorm,
    RmsNorm,
    Rope,
}

/// What the cut reading needs of one trainable tensor.
pub(super) struct Tensor<'a> {
    pub name: &'a str,
    pub rank: usize,
    pub frozen: bool,
}

/// The cuts the frozen tensors show; `ops(fused)` names the linked
/// candle's ops of that kind without a backward pass.
pub(super) fn read(tensors: &[Tensor], ops: &dyn Fn(Fused) -> Vec<String>) -> Vec<Cut> {
    let subtrees = frozen_subtrees(tensors);
    let mut cuts = Vec::new();
    let mut parents: Vec<&str> = Vec::new();
    for s in &subtrees {
        if !parents.contains(&parent(s)) {
            parents.push(parent(s));
        }
    }
    for p in parents {
        let here: Vec<&str> = subtrees
            .iter()
            .copied()
            .filter(|s| parent(s) == p)
            .collect();
        let mut branch = Vec::new();
        for s in here {
            let inside: Vec<&Tensor> = tensors.iter().filter(|t| under(t.name, s)).collect();
            match shape_of(s, &inside) {
                Shape::Norm { bias } => {
                    let norm = if bias {
                        Fused::LayerNorm
                    } else {
                        Fused::RmsNorm
                    };
                    cuts.push(whole(CutKind::NormOp, s, ops(norm)));
                }
                Shape::Projection => branch.push(child(s, p).to_string()),
                Shape::Nested => cuts.push(whole(CutKind::Trunk, s, norms_inside(tensors, s, ops))),
            }
        }
        if !branch.is_empty() {
            cuts.push(branch_cut(tensors, p, branch, ops));
        }
    }
    one_op_for_every_branch(&mut cuts);
    cuts.retain(|c| !c.ops.is_empty());
    cuts
}

/// A cut of the whole module `s` (a norm's own op, a trunk's output).
fn whole(kind: CutKind, s: &str, ops: Vec<String>) -> Cut {
    Cut {
        kind,
        module: s.to_string(),
        frozen: Vec::new(),
        trained: Vec::new(),
        ops,
    }
}

/// The frozen projections `frozen` of module `p` beside those that train.
fn branch_cut(
    tensors: &[Tensor],
    p: &str,
    frozen: Vec<String>,
    ops: &dyn Fn(Fused) -> Vec<String>,
) -> Cut {
    let mut trained: Vec<String> = Vec::new();
    for t in tensors.iter().filter(|t| !t.frozen && under(t.name, p)) {
        let c = child(module_of(t.name), p);
        if !c.is_empty() && !trained.iter().any(|x| x == c) {
            trained.push(c.to_string());
        }
    }
    // Rope turns queries and keys; a third frozen input (a bias added to
    // the scores) is reached only through the softmax.
    let mut candidates = ops(Fused::SoftmaxLastDim);
    if frozen.len() == 2 {
        candidates.extend(ops(Fused::Rope));
    }
    Cut {
        kind: CutKind::Branch,
        module: p.to_string(),
        frozen,
        trained,
        ops: candidates,
    }
}

/// One op is the likelier cause of all the branch cuts when it can make
/// every one of them (a model repeats its attention): the others go.
fn one_op_for_every_branch(cuts: &mut [Cut]) {
    let branches: Vec<&Cut> = cuts.iter().filter(|c| c.kind == CutKind::Branch).collect();
    let Some(first) = branches.first() else {
        return;
    };
    let common: Vec<String> = first
        .ops
        .iter()
        .filter(|o| branches.iter().all(|b| b.ops.contains(o)))
        .cloned()
        .collect();
    if common.is_empty() {
        return;
    }
    for c in cuts.iter_mut().filter(|c| c.kind == CutKind::Branch) {
        c.ops = common.clone();
    }
}

/// The norms a frozen nested module holds (by their tensors' shapes):
/// the ops that can cut it at its output; every fused op when it holds none.
fn norms_inside(tensors: &[Tensor], s: &str, ops: &dyn Fn(Fused) -> Vec<String>) -> Vec<String> {
    let mut modules: Vec<&str> = Vec::new();
    for t in tensors.iter().filter(|t| under(t.name, s)) {
        if !modules.contains(&module_of(t.name)) {
            modules.push(module_of(t.name));
        }
    }
    let (mut layer, mut rms) = (false, false);
    for m in modules {
        let inside: Vec<&Tensor> = tensors.iter().filter(|t| module_of(t.name) == m).collect();
        if let Shape::Norm { bias } = shape_of(m, &inside) {
            layer |= bias;
            rms |= !bias;
        }
    }
    let kinds: Vec<Fused> = match (layer, rms) {
        (false, false) => vec![
            Fused::LayerNorm,
            Fused::RmsNorm,
            Fused::SoftmaxLastDim,
            Fused::Rope,
        ],
        _ => [(layer, Fused::LayerNorm), (rms, Fused::RmsNorm)]
            .into_iter()
            .filter(|(present, _)| *present)
            .map(|(_, f)| f)
            .collect(),
    };
    kinds.into_iter().flat_map(ops).collect()
}

/// What a frozen subtree is.
enum Shape {
    /// One module of vectors only: `weight` (an RMS norm), with `bias`
    /// (a layer norm).
    Norm { bias: bool },
    /// One module with a matrix (a projection, an embedding).
    Projection,
    /// Modules inside modules.
    Nested,
}

fn shape_of(s: &str, inside: &[&Tensor]) -> Shape {
    if inside.iter().any(|t| module_of(t.name) != s) {
        return Shape::Nested;
    }
    let leaf = |t: &&&Tensor| t.name.rsplit('.').next().unwrap_or(t.name).to_string();
    let vectors = inside.iter().all(|t| t.rank == 1);
    let names: Vec<String> = inside.iter().map(|t| leaf(&t)).collect();
    match (vectors, names.len()) {
        (true, 1 | 2) if names.iter().any(|n| n == "weight" || n == "gamma") => Shape::Norm {
            bias: names.len() == 2,
        },
        _ => Shape::Projection,
    }
}

/// The highest modules all of whose tensors are frozen, in order.
fn frozen_subtrees<'a>(tensors: &[Tensor<'a>]) -> Vec<&'a str> {
    let all_frozen = |prefix: &str| {
        tensors
            .iter()
            .filter(|t| under(t.name, prefix))
            .all(|t| t.frozen)
    };
    let mut out: Vec<&str> = Vec::new();
    for t in tensors.iter().filter(|t| t.frozen) {
        let mut top = module_of(t.name);
        if top.is_empty() {
            continue;
        }
        while !parent(top).is_empty() && all_frozen(parent(top)) {
            top = parent(top);
        }
        // A frozen root is no cut (nothing trains to read it against).
        if parent(top).is_empty() && all_frozen("") {
            continue;
        }
        if !out.contains(&top) {
            out.push(top);
        }
    }
    out
}

/// The module path of a tensor name (`a.b.weight` → `a.b`).
fn module_of(name: &str) -> &str {
    name.rsplit_once('.').map_or("", |(m, _)| m)
}

fn parent(module: &str) -> &str {
    module_of(module)
}

/// `module`'s name under `p` (`q` for `a.attn.q` under `a.attn`).
fn child<'a>(module: &'a str, p: &str) -> &'a str {
    let rest = match p {
        "" => module,
        _ => module
            .strip_prefix(p)
            .and_then(|r| r.strip_prefix('.'))
            .unwrap_or(""),
    };
    rest.split('.').next().unwrap_or("")
}

/// Whether tensor `name` lies under module `prefix` (everything is under "").
pub(super) fn under(name: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || (name.len() > prefix.len()
            && name.starts_with(prefix)
            && name[prefix.len()..].starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(f: Fused) -> Vec<String> {
        match f {
            Fused::Rope => vec!["rope".into(), "rope_i".into()],
            other => vec![format!("{other:?}")],
        }
    }

    fn tensors<'a>(spec: &'a [(&'a str, usize, bool)]) -> Vec<Tensor<'a>> {
        spec.iter()
            .map(|&(name, rank, frozen)| Tensor { name, rank, frozen })
            .collect()
    }

    #[test]
    fn queries_keys_and_a_score_bias_frozen_name_the_softmax_only() {
        let t = tensors(&[
            ("enc.0.attn.q.weight", 2, true),
            ("enc.0.attn.k.weight", 2, true),
            ("enc.0.attn.bias.weight", 2, true),
            ("enc.0.attn.v.weight", 2, false),
            ("enc.0.attn.o.weight", 2, false),
            ("enc.1.attn.q.weight", 2, true),
            ("enc.1.attn.k.weight", 2, true),
            ("enc.1.attn.v.weight", 2, false),
            ("head.weight", 2, false),
        ]);
        let cuts = read(&t, &ops);
        assert_eq!(cuts.len(), 2, "{cuts:?}");
        for c in &cuts {
            assert_eq!(
                (c.kind, c.ops.clone()),
                (CutKind::Branch, vec!["SoftmaxLastDim".to_string()])
            );
        }
        assert_eq!(cuts[0].frozen, ["q", "k", "bias"]);
        assert_eq!(cuts[0].trained, ["v", "o"]);
        assert_eq!(cuts[1].module, "enc.1.attn");
    }

    #[test]
    fn queries_and_keys_alone_could_be_a_rope_too() {
        let t = tensors(&[
            ("l.attn.q.weight", 2, true),
            ("l.attn.k.weight", 2, true),
            ("l.attn.v.weight", 2, false),
        ]);
        assert_eq!(read(&t, &ops)[0].ops, ["SoftmaxLastDim", "rope", "rope_i"]);
    }

    #[test]
    fn a_frozen_norm_module_and_a_frozen_trunk_name_the_norms_they_are() {
        let t = tensors(&[
            ("m.layers.0.ln.weight", 1, true),
            ("m.layers.0.ln.bias", 1, true),
            ("m.layers.0.mlp.weight", 2, false),
            ("body.0.norm.weight", 1, true),
            ("body.0.fc.weight", 2, true),
            ("body.1.fc.weight", 2, true),
            ("out.weight", 2, false),
        ]);
        let cuts = read(&t, &ops);
        let kinds: Vec<(CutKind, &str, Vec<String>)> = cuts
            .iter()
            .map(|c| (c.kind, c.module.as_str(), c.ops.clone()))
            .collect();
        assert_eq!(
            kinds,
            [
                (
                    CutKind::NormOp,
                    "m.layers.0.ln",
                    vec!["LayerNorm".to_string()]
                ),
                (CutKind::Trunk, "body", vec!["RmsNorm".to_string()]),
            ]
        );
    }

    #[test]
    fn nothing_frozen_or_everything_frozen_is_no_cut() {
        let none = tensors(&[("a.weight", 2, false)]);
        assert!(read(&none, &ops).is_empty());
        let all = tensors(&[("a.weight", 2, true), ("b.weight", 2, true)]);
        assert!(read(&all, &ops).is_empty());
    }
}
