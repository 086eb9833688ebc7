//! candle-transformers' BERT, Llama, ViT, Qwen2, Mistral, T5's encoder and
//! ResNet-18 as published (tiny configs: hidden 32, 2 layers), wrapped as
//! nanhunt models: the gradients their fused ops lose are one
//! `no_gradient` finding in `run`, the guard and `gradcheck`, counted as a
//! plain candle loop counts them, with the cuts read from which tensors
//! are frozen and only the ops that can make them.

use candle_core::{DType, Device, IndexOp, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::{bert, llama, mistral, qwen2, t5, vit};
use nanhunt::coverage::CutKind;
use nanhunt::gradcheck::{CheckPrecision, Verdict};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, FindingKind, Outcome, Phase, RunOptions};

const HIDDEN: usize = 32;
const LAYERS: usize = 2;
const VOCAB: usize = 64;
const SEQ: usize = 8;
const CLASSES: usize = 4;

fn bert_config() -> bert::Config {
    bert::Config {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        num_hidden_layers: LAYERS,
        num_attention_heads: 4,
        intermediate_size: 2 * HIDDEN,
        max_position_embeddings: 4 * SEQ,
        ..bert::Config::default()
    }
}

/// BERT with a classification head on the first token.
pub struct Bert {
    bert: bert::BertModel,
    head: candle_nn::Linear,
}

impl Bert {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Bert {
            bert: bert::BertModel::load(vb.pp("bert"), &bert_config())?,
            head: candle_nn::linear(HIDDEN, CLASSES, vb.pp("head"))?,
        })
    }
}

impl Model for Bert {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let types = ids.zeros_like()?;
        let h = tr.record("bert", self.bert.forward(ids, &types, None)?)?;
        tr.record("head", self.head.forward(&h.i((.., 0, ..))?)?)
    }
}

fn llama_config() -> llama::Config {
    llama::Config {
        hidden_size: HIDDEN,
        intermediate_size: 2 * HIDDEN,
        vocab_size: VOCAB,
        num_hidden_layers: LAYERS,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 4 * SEQ,
        tie_word_embeddings: false,
    }
}

/// Llama predicting the token after the sequence (its own head).
pub struct Llama {
    llama: llama::Llama,
    dtype: DType,
}

impl Llama {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Llama {
            dtype: vb.dtype(),
            llama: llama::Llama::load(vb, &llama_config())?,
        })
    }
}

impl Model for Llama {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut cache = llama::Cache::new(false, self.dtype, &llama_config(), ids.device())?;
        tr.record("llama", self.llama.forward(ids, 0, &mut cache)?)
    }
}

fn vit_config() -> vit::Config {
    vit::Config {
        hidden_size: HIDDEN,
        num_hidden_layers: LAYERS,
        num_attention_heads: 4,
        intermediate_size: 2 * HIDDEN,
        hidden_act: candle_nn::Activation::Gelu,
        layer_norm_eps: 1e-12,
        image_size: 16,
        patch_size: 4,
        num_channels: 3,
        qkv_bias: true,
    }
}

pub struct Vit(vit::Model);

impl Vit {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Vit(vit::Model::new(&vit_config(), CLASSES, vb)?))
    }
}

impl Model for Vit {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        tr.record("vit", self.0.forward(x)?)
    }
}

fn qwen2_config() -> qwen2::Config {
    qwen2::Config {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 2 * HIDDEN,
        num_hidden_layers: LAYERS,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        sliding_window: 64,
        max_window_layers: LAYERS,
        tie_word_embeddings: true,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        use_sliding_window: false,
        hidden_act: candle_nn::Activation::Silu,
    }
}

/// Qwen2 as published, predicting the token after the sequence (its
/// forward keeps a key/value cache, cleared for every batch).
pub struct Qwen2(std::sync::Mutex<qwen2::ModelForCausalLM>);

impl Qwen2 {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Qwen2(std::sync::Mutex::new(qwen2::ModelForCausalLM::new(
            &qwen2_config(),
            vb,
        )?)))
    }
}

impl Model for Qwen2 {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.clear_kv_cache();
        tr.record("qwen2", m.forward(ids, 0)?.squeeze(1)?)
    }
}

fn t5_config() -> t5::Config {
    t5::Config {
        vocab_size: VOCAB,
        d_model: HIDDEN,
        d_kv: HIDDEN / 4,
        d_ff: 2 * HIDDEN,
        num_layers: LAYERS,
        num_heads: 4,
        relative_attention_num_buckets: 8,
        relative_attention_max_distance: 16,
        dropout_rate: 0.0,
        use_cache: false,
        ..t5::Config::default()
    }
}

/// T5's encoder as published with a classification head on the mean
/// token (its forward takes `&mut self`).
pub struct T5(std::sync::Mutex<t5::T5EncoderModel>, candle_nn::Linear);

impl T5 {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(T5(
            std::sync::Mutex::new(t5::T5EncoderModel::load(vb.pp("t5"), &t5_config())?),
            candle_nn::linear(HIDDEN, CLASSES, vb.pp("head"))?,
        ))
    }
}

impl Model for T5 {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let h = tr.record("t5", m.forward(ids)?)?;
        tr.record("head", self.1.forward(&h.mean(1)?)?)
    }
}

/// T5's encoder, cut only by the fused `softmax_last_dim` of its attention.
fn t5() -> Real {
    Real {
        name: "t5",
        input: tokens(),
        outputs: CLASSES,
        factory: |vb| Ok(Box::new(T5::new(vb)?)),
    }
}

fn mistral_config() -> mistral::Config {
    mistral::Config {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 2 * HIDDEN,
        num_hidden_layers: LAYERS,
        num_attention_heads: 4,
        head_dim: None,
        num_key_value_heads: 2,
        hidden_act: candle_nn::Activation::Silu,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        sliding_window: Some(64),
        use_flash_attn: false,
    }
}

/// Mistral as published, predicting the token after the sequence.
pub struct Mistral(std::sync::Mutex<mistral::Model>);

impl Model for Mistral {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.clear_kv_cache();
        tr.record("mistral", m.forward(ids, 0)?.squeeze(1)?)
    }
}

fn mistral() -> Real {
    Real {
        name: "mistral",
        input: tokens(),
        outputs: VOCAB,
        factory: |vb| {
            let m = mistral::Model::new(&mistral_config(), vb)?;
            Ok(Box::new(Mistral(std::sync::Mutex::new(m))))
        },
    }
}

/// The three models: name, input, outputs, factory.
struct Real {
    name: &'static str,
    input: InputSpec,
    outputs: usize,
    factory: fn(VarBuilder<'static>) -> candle_core::Result<Box<dyn Model>>,
}

fn tokens() -> InputSpec {
    InputSpec::Tokens {
        seq_len: SEQ,
        vocab: VOCAB,
    }
}

fn models() -> [Real; 3] {
    [
        Real {
            name: "bert",
            input: tokens(),
            outputs: CLASSES,
            factory: |vb| Ok(Box::new(Bert::new(vb)?)),
        },
        Real {
            name: "llama",
            input: tokens(),
            outputs: VOCAB,
            factory: |vb| Ok(Box::new(Llama::new(vb)?)),
        },
        Real {
            name: "vit",
            input: InputSpec::Image {
                channels: 3,
                height: 16,
                width: 16,
            },
            outputs: CLASSES,
            factory: |vb| Ok(Box::new(Vit::new(vb)?)),
        },
    ]
}

fn case_of(m: &Real) -> Case {
    let mut c = Case::example("transformer").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(m.name, m.input.clone(), m.outputs));
    c.batch_size = 4;
    c.steps = 3;
    c.optimizer = crate::support::sgd(1e-2);
    c.precision = Precision::F32;
    c
}

/// Four token sequences and a label each, for a guarded step.
fn token_batch() -> nanhunt::guard::Batch {
    let ids = Tensor::arange(0u32, (4 * SEQ) as u32, &Device::Cpu)
        .unwrap()
        .reshape((4, SEQ))
        .unwrap();
    let labels = Tensor::new(&[0u32, 1, 2, 3], &Device::Cpu).unwrap();
    nanhunt::guard::Batch::new([("ids", ids), ("labels", labels)])
}

fn token_loss(model: &dyn Model, b: &nanhunt::guard::Batch) -> candle_core::Result<Tensor> {
    let logits = model.forward(b.get("ids")?, &mut Tracer::off())?;
    candle_nn::loss::cross_entropy(&logits, b.get("labels")?)
}

/// A plain candle loop's answer: the tensors of a VarMap that one
/// backward pass of the cross-entropy leaves without a gradient.
fn untrained_by_a_plain_loop(m: &Real) -> (usize, usize) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    // The VarMap's builder borrows nothing: it is 'static like nanhunt's.
    let model = (m.factory)(vb).unwrap();
    let input = match &m.input {
        InputSpec::Tokens { .. } => Tensor::arange(0u32, (4 * SEQ) as u32, &Device::Cpu)
            .unwrap()
            .reshape((4, SEQ))
            .unwrap(),
        _ => Tensor::ones((4, 3, 16, 16), DType::F32, &Device::Cpu).unwrap(),
    };
    let logits = model.forward(&input, &mut Tracer::off()).unwrap();
    let labels = Tensor::new(&[0u32, 1, 2, 3], &Device::Cpu).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits, &labels).unwrap();
    let grads = loss.backward().unwrap();
    let vars = varmap.all_vars();
    let missing = vars
        .iter()
        .filter(|v| grads.get(v.as_tensor()).is_none())
        .count();
    (missing, vars.len())
}

#[test]
fn stock_bert_llama_and_vit_give_one_no_gradient_finding_counting_what_a_plain_loop_leaves_untrained(
) {
    let expected = [("bert", 37, 39), ("llama", 20, 21), ("vit", 16, 40)];
    for (m, (name, frozen, total)) in models().iter().zip(expected) {
        assert_eq!(m.name, name);
        assert_eq!(
            untrained_by_a_plain_loop(m),
            (frozen, total),
            "{name}: the plain loop"
        );
        let outcome = run_model(&case_of(m), &m.factory, &RunOptions::default()).unwrap();
        let f = outcome
            .finding()
            .unwrap_or_else(|| panic!("{name}: {outcome:?}"));
        assert_eq!(
            (f.kind, f.phase, f.step),
            (FindingKind::NoGradient, Phase::Backward, 0),
            "{name}"
        );
        let cov = f.coverage.as_ref().unwrap();
        assert_eq!(
            (cov.frozen_tensors, cov.tensors),
            (frozen, total),
            "{name}: {}",
            f.detail
        );
        assert!(cov.frozen_share > 0.0 && cov.frozen_share < 1.0, "{name}");
        // The wrapper's one record is reached: the flow stops inside the
        // model, before `bert`/`llama`/`vit` hands its output on.
        assert!(
            cov.no_backward_ops
                .iter()
                .any(|o| o.op.contains("layer_norm") || o.op.contains("rms_norm")),
            "{name}: {:?}",
            cov.no_backward_ops
        );
        assert!(
            f.detail.contains("would silently never train"),
            "{}",
            f.detail
        );
    }
}

/// The tensors a plain run of `m`'s case finds without a gradient.
fn frozen_in_a_run(m: &Real, case: &Case) -> Vec<String> {
    let outcome = run_model(case, &m.factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("tensors without a gradient");
    f.coverage.as_ref().expect("their coverage").frozen_names()
}

#[test]
fn a_real_model_with_its_frozen_tensors_declared_runs_and_trains_the_rest() {
    let m = &models()[0];
    let mut case = case_of(m);
    let frozen = frozen_in_a_run(m, &case);
    if let ModelSpec::Custom(c) = &mut case.model {
        c.frozen = vec!["bert".into()];
    }
    let outcome = run_model(&case, &m.factory, &RunOptions::default()).unwrap();
    assert_eq!(outcome.verdict(), "stable", "{outcome:?}");
    assert!(frozen.iter().all(|n| n.starts_with("bert.")), "{frozen:?}");
}

/// Qwen2's fused RMSNorm, softmax and rope cut every tensor but the tied
/// embedding off its gradient; what reaches the embedding is truncated too
/// (it used to pass gradcheck as the model's one checked tensor).
#[test]
fn qwen2_as_published_has_no_gradient_in_run_and_fails_gradcheck() {
    let factory = |vb: VarBuilder<'static>| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Qwen2::new(vb)?))
    };
    let mut case = case_of(&models()[1]);
    if let ModelSpec::Custom(c) = &mut case.model {
        c.name = "qwen2".into();
    }
    let outcome = run_model(&case, &factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("tensors without a gradient");
    assert_eq!(f.kind, FindingKind::NoGradient, "{f:?}");
    let report = nanhunt::gradcheck::check_model(&case, &factory).unwrap();
    assert!(!report.passed, "{report:#?}");
    let embedding = report
        .tensors
        .iter()
        .find(|t| t.name == "model.embed_tokens.weight")
        .unwrap();
    assert!(embedding.has_gradient);
    assert_eq!(embedding.verdict, Verdict::Mismatch, "{embedding:?}");
}

#[test]
fn vit_with_its_frozen_tensors_declared_trains_on_truncated_gradients_that_the_check_names() {
    let m = &models()[2];
    let mut case = case_of(m);
    let frozen = frozen_in_a_run(m, &case);
    if let ModelSpec::Custom(c) = &mut case.model {
        c.frozen = frozen;
    }
    // Declared frozen, the rest trains with nothing reported...
    let plain = run_model(&case, &m.factory, &RunOptions::default()).unwrap();
    assert!(plain.finding().is_none(), "{plain:?}");
    // ... on gradients the directional check shows to be wrong.
    let checked = RunOptions::default().with_gradient_check(true);
    let f = run_model(&case, &m.factory, &checked).unwrap();
    let f = f.finding().expect("a wrong gradient");
    assert_eq!(f.kind, FindingKind::WrongGradient, "{f:?}");
    assert!(f.stage.starts_with("grad.vit."), "{}", f.stage);
}

#[test]
fn the_guard_reports_the_same_frozen_tensors_in_a_plain_loop() {
    use nanhunt::guard::{Guard, GuardOptions};
    let m = &models()[1];
    let varmap = VarMap::new();
    let model = (m.factory)(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default().named("llama")).unwrap();
    let mut opt = guard.optimizer(crate::support::sgd(1e-2)).unwrap();
    let batch = token_batch();
    let err = guard
        .step(0, &batch, &mut opt, |b| {
            let logits = model.forward(b.get("ids")?, &mut Tracer::off())?;
            candle_nn::loss::cross_entropy(&logits, b.get("labels")?)
        })
        .unwrap_err();
    let f = err.finding().expect("a finding");
    assert_eq!(f.kind, FindingKind::NoGradient);
    let cov = f.coverage.as_ref().unwrap();
    assert_eq!((cov.frozen_tensors, cov.tensors), (20, 21));
    // Module paths as the model names them.
    assert!(
        cov.modules
            .iter()
            .any(|m| m.module == "model.layers.0.self_attn.q_proj"),
        "{:?}",
        cov.modules
    );
}

#[test]
fn gradcheck_on_stock_models_runs_in_f32_reports_the_frozen_tensors_and_the_truncated_ones() {
    for m in &models() {
        let report = nanhunt::gradcheck::check_model(&case_of(m), &m.factory).unwrap();
        let why = report.fallback.as_deref().unwrap_or_default();
        assert_eq!(report.precision, CheckPrecision::F32, "{}: {why}", m.name);
        assert!(why.contains("f64"), "{}: {why}", m.name);
        let cov = report.coverage.as_ref().expect("the frozen tensors");
        assert_eq!(
            report.with_verdict(Verdict::NoGradient).len(),
            cov.frozen_tensors
        );
        let alarms: Vec<_> = report
            .tensors
            .iter()
            .filter(|t| t.has_gradient && t.verdict.fails())
            .collect();
        if m.name != "vit" {
            assert!(alarms.is_empty(), "{}: {alarms:?}", m.name);
            continue;
        }
        // ViT's gradients reach its encoder truncated: analytic and numeric
        // differ steadily across steps (the value projection: 6.28e-3
        // analytic, -3.59e-2 numeric at steps 1e-3 and 1e-2). It used to
        // pass as "ill-conditioned".
        assert!(!report.passed);
        assert!(alarms.len() >= 10, "{alarms:?}");
        let value = alarms
            .iter()
            .find(|t| t.name == "vit.encoder.layer.0.attention.attention.value.weight")
            .expect("the value projection's gradient is wrong");
        assert_eq!(value.verdict, Verdict::Mismatch);
        assert!(alarms
            .iter()
            .all(|t| t.note.as_deref().unwrap().contains("steady across steps")));
    }
}

/// A feature-vector case for a small custom model.
fn vector_case(name: &str, features: usize) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(
        name,
        InputSpec::Vector { features },
        CLASSES,
    ));
    c.batch_size = 8;
    c
}

/// tanh with a deliberately wrong backward (twice the true derivative).
struct WrongTanh;

impl candle_core::CustomOp1 for WrongTanh {
    fn name(&self) -> &'static str {
        "wrong-tanh"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("wrong-tanh takes contiguous input")
        };
        let out = match storage {
            candle_core::CpuStorage::F64(v) => {
                candle_core::CpuStorage::F64(v[start..end].iter().map(|x| x.tanh()).collect())
            }
            candle_core::CpuStorage::F32(v) => {
                candle_core::CpuStorage::F32(v[start..end].iter().map(|x| x.tanh()).collect())
            }
            _ => candle_core::bail!("wrong-tanh takes f32 or f64"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let d = (1.0 - res.sqr()?)?;
        Ok(Some(((grad * d)? * 2.0)?))
    }
}

/// Two linear layers around `mid`.
struct Mlp {
    a: candle_nn::Linear,
    b: candle_nn::Linear,
    mid: fn(&Tensor) -> candle_core::Result<Tensor>,
}

impl Model for Mlp {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("a", self.a.forward(x)?)?;
        let h = tr.record("mid", (self.mid)(&h)?)?;
        tr.record("b", self.b.forward(&h)?)
    }
}

fn mlp(
    vb: VarBuilder,
    mid: fn(&Tensor) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Box<dyn Model>> {
    Ok(Box::new(Mlp {
        a: candle_nn::linear(8, 16, vb.pp("a"))?,
        b: candle_nn::linear(16, CLASSES, vb.pp("b"))?,
        mid,
    }))
}

#[test]
fn gradcheck_catches_a_planted_wrong_backward_at_every_step_size() {
    let factory = |vb: VarBuilder| mlp(vb, |h| h.contiguous()?.apply_op1(WrongTanh));
    let report = nanhunt::gradcheck::check_model(&vector_case("wrong", 8), &factory).unwrap();
    assert!(!report.passed);
    assert_eq!(report.precision, CheckPrecision::F64);
    let bad: Vec<&str> = report
        .with_verdict(Verdict::Mismatch)
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    // The wrong backward feeds the first layer only.
    assert_eq!(bad, ["a.weight", "a.bias"], "{report:#?}");
    assert!(report
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("b."))
        .all(|t| t.passed));
    let note = report.tensors[0].note.as_deref().unwrap();
    assert!(note.contains("steady across steps"), "{note}");
}

#[test]
fn a_run_with_the_gradient_check_finds_a_present_but_wrong_gradient() {
    let case = vector_case("wrong", 8);
    let wrong = |vb: VarBuilder| mlp(vb, |h| h.contiguous()?.apply_op1(WrongTanh));
    let checked = RunOptions::default().with_gradient_check(true);
    let finding = match run_model(&case, &wrong, &checked).unwrap() {
        Outcome::Unstable { finding } => finding,
        other => panic!("{other:?}"),
    };
    assert_eq!(finding.kind, FindingKind::WrongGradient);
    assert_eq!(finding.step, 0);
    assert!(finding.stage.starts_with("grad.a."), "{}", finding.stage);
    assert!(finding.detail.contains("off by"), "{}", finding.detail);
    // Unchecked, the same model trains on the wrong gradient unnoticed.
    let plain = run_model(&case, &wrong, &RunOptions::default()).unwrap();
    assert!(!matches!(plain, Outcome::Unstable { .. }), "{plain:?}");
    // A right gradient passes the check.
    let right = |vb: VarBuilder| mlp(vb, |h| h.tanh());
    let ok = run_model(&case, &right, &checked).unwrap();
    assert!(!matches!(ok, Outcome::Unstable { .. }), "{ok:?}");
}

#[test]
fn gradcheck_catches_a_backward_that_drops_part_of_its_inputs_gradient() {
    // Half the hidden features pass on detached: the first layer still has
    // a gradient, but half of it is missing.
    let factory = |vb: VarBuilder| {
        mlp(vb, |h| {
            Tensor::cat(&[h.narrow(1, 0, 8)?, h.narrow(1, 8, 8)?.detach()], 1)?.tanh()
        })
    };
    let report = nanhunt::gradcheck::check_model(&vector_case("cut", 8), &factory).unwrap();
    assert!(!report.passed);
    assert!(report.coverage.is_none(), "every tensor has some gradient");
    let a = report
        .tensors
        .iter()
        .find(|t| t.name == "a.weight")
        .unwrap();
    assert_eq!(a.verdict, Verdict::Mismatch, "{a:?}");
    assert!(a.note.as_deref().unwrap().contains("analytic 0.0"), "{a:?}");
    assert!(report
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("b."))
        .all(|t| t.passed));
}

#[test]
fn gradcheck_checks_a_model_that_casts_to_f32_inside_at_f32_tolerance_without_false_alarms() {
    let factory =
        |vb: VarBuilder| mlp(vb, |h| h.to_dtype(DType::F32)?.tanh()?.to_dtype(DType::F64));
    let report = nanhunt::gradcheck::check_model(&vector_case("casts", 8), &factory).unwrap();
    assert_eq!(report.precision, CheckPrecision::F64);
    assert!(report.passed, "{report:#?}");
    // Both layers' loss moves in f32 steps: the first feeds the cast, the
    // second reads its f32-rounded output.
    assert!(
        report.lower_precision.contains(&"a.weight".to_string()),
        "{:?}",
        report.lower_precision
    );
    // The f64 check alone would have failed: the planted cast is real.
    let strict = report
        .tensors
        .iter()
        .find(|t| t.name == "a.weight")
        .unwrap();
    assert!(strict.max_rel_err > nanhunt::gradcheck::RTOL, "{strict:?}");
}

/// A zero-initialized token (candle's default hint for `get`) through a
/// layer norm with eps 1e-12, added to the input: the ViT `cls_token` case.
struct ZeroToken {
    token: Tensor,
    head: candle_nn::Linear,
}

impl Model for ZeroToken {
    fn forward(&self, x: &Tensor, _tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let ones = Tensor::ones(8, x.dtype(), x.device())?;
        let zeros = Tensor::zeros(8, x.dtype(), x.device())?;
        let n = candle_nn::ops::layer_norm_slow(&self.token, &ones, &zeros, 1e-12)?;
        self.head.forward(&x.broadcast_add(&n)?)
    }
}

#[test]
fn gradcheck_reports_an_ill_conditioned_point_as_such_neither_wrong_nor_passed() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(ZeroToken {
            token: vb.get((1, 8), "token")?,
            head: candle_nn::linear(8, CLASSES, vb.pp("head"))?,
        }))
    };
    let report = nanhunt::gradcheck::check_model(&vector_case("zero_token", 8), &factory).unwrap();
    let token = report.tensors.iter().find(|t| t.name == "token").unwrap();
    assert_eq!(token.verdict, Verdict::IllConditioned, "{token:?}");
    assert!(
        token.note.as_deref().unwrap().contains("near-singular"),
        "{token:?}"
    );
    // Not a wrong gradient, and no pass either: the check could not judge it.
    assert!(report.with_verdict(Verdict::Mismatch).is_empty());
    assert!(!token.passed && !report.passed, "{report:#?}");
}

#[test]
fn gradcheck_says_plainly_when_a_gradient_or_the_loss_is_not_finite() {
    // sqrt at an exact 0: the gradient of `p` is +inf.
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let p = vb.get(CLASSES, "p")?;
        let head = candle_nn::linear(8, CLASSES, vb.pp("head"))?;
        Ok(Box::new(nanhunt::models::ModuleModel(candle_nn::func(
            move |x| head.forward(x)?.broadcast_add(&p.sqrt()?),
        ))))
    };
    let report = nanhunt::gradcheck::check_model(&vector_case("sqrt0", 8), &factory);
    let report = report.unwrap();
    let p = report.tensors.iter().find(|t| t.name == "p").unwrap();
    assert_eq!(p.verdict, Verdict::NonFinite, "{p:?}");
    assert!(p.note.as_deref().unwrap().contains("inf"), "{p:?}");
    assert!(!report.passed);
    // A loss that is NaN at the checked point is the report's problem.
    let factory = |vb: VarBuilder| mlp(vb, |h| (h - 10.0)?.log());
    let report = nanhunt::gradcheck::check_model(&vector_case("log", 8), &factory).unwrap();
    assert!(
        report.problem.as_deref().unwrap().contains("NaN"),
        "{report:?}"
    );
    assert!(!report.passed && report.tensors.is_empty());
    // The point can be chosen: another batch and seed.
    let mut opts = nanhunt::gradcheck::GradcheckOptions::default();
    opts.batch = 3;
    opts.seed = Some(7);
    let factory = |vb: VarBuilder| mlp(vb, |h| h.tanh());
    let report =
        nanhunt::gradcheck::check_model_with(&vector_case("tanh", 8), &factory, &opts).unwrap();
    assert_eq!((report.batch, report.seed), (3, 7));
    assert!(report.passed, "{report:#?}");
}

#[test]
fn with_records_the_finding_names_the_stages_between_which_the_gradient_stops() {
    let factory = |vb: VarBuilder| mlp(vb, candle_nn::ops::softmax_last_dim);
    let outcome = run_model(&vector_case("fused", 8), &factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().unwrap();
    assert_eq!(f.kind, FindingKind::NoGradient);
    let stop = f
        .coverage
        .as_ref()
        .unwrap()
        .stops_at
        .clone()
        .expect("localized");
    assert_eq!(
        (stop.stage.as_str(), stop.next.as_deref()),
        ("a", Some("mid"))
    );
    assert_eq!(f.stage, "a");
    assert!(
        f.detail.contains("between stages `a` and `mid`"),
        "{}",
        f.detail
    );
}

#[test]
fn the_guard_trains_a_stock_model_whose_frozen_part_is_declared() {
    use nanhunt::guard::{Guard, GuardOptions};
    let m = &models()[1];
    let varmap = VarMap::new();
    let model = (m.factory)(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let opts = GuardOptions::default().named("llama").frozen(["model"]);
    let mut guard = Guard::new(&varmap, opts).unwrap();
    assert_eq!(guard.names(), ["lm_head.weight"]);
    let mut opt = guard.optimizer(crate::support::sgd(1e-2)).unwrap();
    let batch = token_batch();
    for step in 0..3 {
        guard
            .step(step, &batch, &mut opt, |b| token_loss(&*model, b))
            .unwrap();
    }
}

#[test]
fn diagnose_names_the_cut_for_a_stock_model_and_verifies_training_what_it_reaches() {
    use nanhunt::diagnose::{diagnose, CauseKind};
    let m = &models()[2];
    let d = diagnose(&case_of(m), &m.factory, &RunOptions::default()).unwrap();
    let first = &d.causes[0];
    assert_eq!(
        first.kind,
        CauseKind::NoBackward,
        "{:?}",
        d.causes
            .iter()
            .map(|c| (c.kind, c.score))
            .collect::<Vec<_>>()
    );
    assert!(first.verified(), "{:?}", first.fixes);
    assert!(
        first.evidence[0].contains("16 of 40"),
        "{:?}",
        first.evidence
    );
    // No other cause claims a no-gradient finding.
    assert!(d.causes[1..].iter().all(|c| c.score < first.score));
}

#[test]
fn resnet18_borrows_its_builder_and_is_a_factory_as_published() {
    use candle_transformers::models::resnet;
    // `resnet18` returns a `Func<'_>` tied to its builder: no transmute needed.
    let factory = |vb: VarBuilder<'static>| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(nanhunt::models::ModuleModel(resnet::resnet18(
            CLASSES, vb,
        )?)))
    };
    let mut case = case_of(&models()[2]);
    if let ModelSpec::Custom(c) = &mut case.model {
        c.name = "resnet18".into();
        c.input = InputSpec::Image {
            channels: 3,
            height: 32,
            width: 32,
        };
    }
    case.batch_size = 2;
    // candle 0.11.1 has no backward for a max-pool whose kernel differs
    // from its stride: a finding naming the op and a replacement, in `run`
    // and in `gradcheck`, not candle's error.
    let outcome = run_model(&case, &factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("a finding");
    assert_eq!(
        (f.kind, f.phase, f.step),
        (FindingKind::NoGradient, Phase::Backward, 0)
    );
    assert!(
        f.detail
            .contains("max_pool2d with kernel (3, 3) and stride (2, 2)")
            && f.detail.contains("Replace it with"),
        "{}",
        f.detail
    );
    let report = nanhunt::gradcheck::check_model(&case, &factory).unwrap();
    assert!(!report.passed);
    assert!(
        report.problem.as_deref().unwrap().contains("max_pool2d"),
        "{report:?}"
    );
}

/// One cut as (kind, module, ops).
type CutRow = (CutKind, String, Vec<String>);

/// The cuts of `m`'s `no_gradient` finding in a plain run, and the ops it names.
fn cuts_of(m: &Real) -> (Vec<CutRow>, Vec<String>) {
    let outcome = run_model(&case_of(m), &m.factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("a no_gradient finding");
    let cov = f.coverage.as_ref().unwrap();
    let cuts = cov
        .cuts
        .iter()
        .map(|c| (c.kind, c.module.clone(), c.ops.clone()))
        .collect();
    let ops = cov.no_backward_ops.iter().map(|o| o.op.clone()).collect();
    (cuts, ops)
}

#[test]
fn t5_is_cut_only_by_its_fused_softmax_and_the_finding_names_it_alone() {
    let m = t5();
    let (cuts, ops) = cuts_of(&m);
    assert_eq!(ops, ["candle_nn::ops::softmax_last_dim"], "{cuts:?}");
    assert_eq!(
        cuts.iter().map(|c| (c.0, c.1.as_str())).collect::<Vec<_>>(),
        [
            (CutKind::Branch, "t5.encoder.block.0.layer.0.SelfAttention"),
            (CutKind::Branch, "t5.encoder.block.1.layer.0.SelfAttention"),
        ]
    );
    let outcome = run_model(&case_of(&m), &m.factory, &RunOptions::default()).unwrap();
    let detail = &outcome.finding().unwrap().detail;
    assert!(
        detail.contains("q, k, relative_attention_bias get no gradient but v, o do"),
        "{detail}"
    );
    assert!(
        !detail.contains("rope") && !detail.contains("norm"),
        "{detail}"
    );
    // gradcheck: the five frozen tensors, and no pass.
    let report = nanhunt::gradcheck::check_model(&case_of(&m), &m.factory).unwrap();
    assert!(!report.passed);
    assert_eq!(report.with_verdict(Verdict::NoGradient).len(), 5);
    // The guard over a plain loop: the same cut.
    use nanhunt::guard::{Guard, GuardOptions};
    let varmap = VarMap::new();
    let model = (m.factory)(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default().named("t5")).unwrap();
    let mut opt = guard.optimizer(crate::support::sgd(1e-2)).unwrap();
    let err = guard
        .step(0, &token_batch(), &mut opt, |b| token_loss(&*model, b))
        .unwrap_err();
    let cov = err.finding().unwrap().coverage.clone().unwrap();
    assert_eq!(cov.frozen_tensors, 5);
    assert_eq!(cov.cuts.len(), 2);
    assert_eq!(cov.no_backward_ops.len(), 1);
}

#[test]
fn the_cuts_of_bert_llama_and_vit_name_the_norms_they_hold() {
    let [bert, llama, vit] = models();
    let layer_norm = "candle_nn::ops::layer_norm (and candle_nn::LayerNorm on contiguous input)";
    let rms_norm = "candle_nn::ops::rms_norm (and candle_nn::RmsNorm on contiguous input)";
    for (m, module, norm) in [(&bert, "bert", layer_norm), (&llama, "model", rms_norm)] {
        let (cuts, ops) = cuts_of(m);
        let trunk = (CutKind::Trunk, module.to_string(), vec![norm.to_string()]);
        assert_eq!(cuts, [trunk], "{}", m.name);
        assert_eq!(ops, [norm], "{}", m.name);
    }
    // ViT: its own layer norms, and the attention scores' branch (a fused
    // softmax, or a rope: the frozen queries and keys cannot tell).
    let (cuts, ops) = cuts_of(&vit);
    let norms: Vec<&str> = cuts
        .iter()
        .filter(|c| c.0 == CutKind::NormOp)
        .map(|c| c.1.as_str())
        .collect();
    assert_eq!(
        norms,
        [
            "vit.encoder.layer.0.layernorm_before",
            "vit.encoder.layer.0.layernorm_after",
            "vit.encoder.layer.1.layernorm_before",
            "vit.encoder.layer.1.layernorm_after",
        ]
    );
    assert_eq!(cuts.iter().filter(|c| c.0 == CutKind::Branch).count(), 2);
    assert!(!ops.iter().any(|o| o.contains("rms_norm")), "{ops:?}");
}

/// A user's CNN with traced stages and ResNet's stem pool (kernel 3,
/// stride 2): candle cannot differentiate it, and the finding names the
/// stage that holds it.
struct OverlappingPool {
    conv: candle_nn::Conv2d,
    head: candle_nn::Linear,
}

impl Model for OverlappingPool {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("stem.conv", self.conv.forward(x)?)?;
        let p = tr.record("stem.pool", h.max_pool2d_with_stride(3, 2)?)?;
        tr.record("head", self.head.forward(&p.flatten_from(1)?)?)
    }
}

#[test]
fn an_overlapping_max_pool_is_a_finding_at_the_stage_that_holds_it() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(OverlappingPool {
            conv: candle_nn::conv2d(3, 4, 3, Default::default(), vb.pp("stem.conv"))?,
            head: candle_nn::linear(4 * 6 * 6, CLASSES, vb.pp("head"))?,
        }))
    };
    let mut case = case_of(&models()[2]);
    if let ModelSpec::Custom(c) = &mut case.model {
        c.name = "pooled".into();
    }
    let outcome = run_model(&case, &factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("a finding");
    assert_eq!(
        (f.kind, f.stage.as_str()),
        (FindingKind::NoGradient, "stem.pool"),
        "{f:?}"
    );
    assert!(
        f.detail
            .contains("inside stage `stem.pool`, after stage `stem.conv`"),
        "{}",
        f.detail
    );
}

#[test]
fn mistral_is_cut_at_its_rms_norms_and_attention_scores_in_run_gradcheck_and_the_guard() {
    let m = mistral();
    let (cuts, ops) = cuts_of(&m);
    // Per layer: the scores' branch (queries and keys; a fused softmax or
    // the rope it applies) and its two RMS norms' own ops.
    let per_layer: Vec<(CutKind, &str)> = cuts
        .iter()
        .filter(|c| c.1.starts_with("model.layers.0."))
        .map(|c| (c.0, c.1.as_str()))
        .collect();
    assert_eq!(
        per_layer,
        [
            (CutKind::Branch, "model.layers.0.self_attn"),
            (CutKind::NormOp, "model.layers.0.input_layernorm"),
            (CutKind::NormOp, "model.layers.0.post_attention_layernorm"),
        ]
    );
    assert_eq!(cuts.len(), 6, "{cuts:?}");
    assert!(ops.iter().any(|o| o.contains("rms_norm")), "{ops:?}");
    assert!(!ops.iter().any(|o| o.contains("layer_norm")), "{ops:?}");
    let report = nanhunt::gradcheck::check_model(&case_of(&m), &m.factory).unwrap();
    assert!(!report.passed);
    let frozen = report.with_verdict(Verdict::NoGradient).len();
    use nanhunt::guard::{Guard, GuardOptions};
    let varmap = VarMap::new();
    let model = (m.factory)(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default().named("mistral")).unwrap();
    let mut opt = guard.optimizer(crate::support::sgd(1e-2)).unwrap();
    let err = guard
        .step(0, &token_batch(), &mut opt, |b| token_loss(&*model, b))
        .unwrap_err();
    let cov = err.finding().unwrap().coverage.clone().unwrap();
    assert_eq!(cov.frozen_tensors, frozen);
    assert_eq!(cov.cuts.len(), 6);
}
