//! The session's batch and forward pass: the batch of a step made on the
//! host and checked after the data and every augmentation, uploaded, run
//! through the model and the loss.

use super::{Failure, Session};
use crate::augment;
use crate::checks;
use crate::data::{apply_pathologies, apply_pathology, DataSource, HostBatch, HostInput};
use crate::error::{Error, Result};
use crate::finding::{FindingKind, Phase};
use crate::losses;
use crate::models::Tracer;
use crate::probe::{scan_host, TensorStats};
use candle_core::{DType, Tensor};

/// A batch on the device: inputs in the compute dtype, dense targets (and
/// mixup's λ with its second target set) in the loss dtype.
pub(super) struct DeviceBatch {
    input: Tensor,
    targets: Tensor,
    mix: Option<(f64, Tensor)>,
}

/// The forward pass of one batch.
pub struct Forward {
    /// The batch's inputs as the model received them.
    pub input: Tensor,
    /// The model output as returned by the model.
    pub output: Tensor,
    /// The output as (rows × classes) in the loss dtype.
    pub logits: Tensor,
    /// The scalar loss.
    pub loss: Tensor,
}

impl Session<'_> {
    /// The batch of `step` after pathologies and augmentation, or the
    /// failure the probe saw while making it.
    pub fn batch(&self, step: usize) -> Result<std::result::Result<HostBatch, Box<Failure>>> {
        self.batch_checked(step, false)
    }

    /// The batch of `step` before pathologies and augmentation.
    pub fn raw_batch(&self, step: usize) -> Result<HostBatch> {
        self.source.batch(step, self.case.batch_size)
    }

    /// The batch of `step` without any check (for dumps).
    pub fn batch_unchecked(&self, step: usize) -> Result<HostBatch> {
        let case = &self.case;
        let mut batch = self.raw_batch(step)?;
        apply_pathologies(&mut batch, &case.data.pathologies, case.seed, step);
        augment::apply_all(&mut batch, &case.augment, case.seed, step);
        Ok(batch)
    }

    /// The run's data source.
    pub fn source(&self) -> &dyn DataSource {
        &*self.source
    }

    /// Makes the batch, checking it after the data and after every
    /// augmentation; `fine` also checks the source's output and each
    /// pathology on its own (localization).
    pub(super) fn batch_checked(
        &self,
        step: usize,
        fine: bool,
    ) -> Result<std::result::Result<HostBatch, Box<Failure>>> {
        let case = &self.case;
        let mut batch = self.raw_batch(step)?;
        Ok((|| {
            if fine {
                self.check_batch(&batch, Phase::Data, case.data.source.stage())?;
                for (i, p) in case.data.pathologies.iter().enumerate() {
                    apply_pathology(&mut batch, i, p, case.seed, step);
                    self.check_batch(
                        &batch,
                        Phase::Data,
                        &format!("data.pathologies[{i}].{}", p.name()),
                    )?;
                }
            } else {
                apply_pathologies(&mut batch, &case.data.pathologies, case.seed, step);
            }
            if self.probe {
                self.check_batch(&batch, Phase::Data, "input")?;
            }
            for (i, aug) in case.augment.iter().enumerate() {
                augment::apply(&mut batch, aug, case.seed, i, step);
                if self.probe {
                    self.check_batch(
                        &batch,
                        Phase::Augment,
                        &format!("augment[{i}].{}", aug.name()),
                    )?;
                }
            }
            Ok(batch)
        })())
    }

    /// " (samples 3 and 9 of train.safetensors)" for a batch drawn from a
    /// dataset; nothing for synthetic data.
    fn samples_named(&self, batch: &HostBatch, bad: &[usize]) -> String {
        match self.source.dataset() {
            Some(d) if !bad.is_empty() => {
                let ids: Vec<usize> = bad
                    .iter()
                    .filter_map(|&s| batch.samples.get(s).copied())
                    .collect();
                format!(" ({} of {})", crate::data::samples_phrase(&ids), d.name())
            }
            _ => String::new(),
        }
    }

    /// The dtype a batch must fit: the compute dtype, or the half dtype a
    /// PyTorch user casts it to in the framework check's emulation (a run
    /// computed in f32 with half-precision storage).
    fn batch_dtype(&self) -> DType {
        let storage = self.intervention.as_ref().and_then(|i| i.storage);
        storage.map_or(self.compute, |h| h.dtype())
    }

    fn check_batch(
        &self,
        batch: &HostBatch,
        phase: Phase,
        stage: &str,
    ) -> std::result::Result<(), Box<Failure>> {
        if phase == Phase::Data {
            if let Some((row, label)) = checks::bad_label(&batch.labels, batch.classes) {
                let at = if stage == "input" { "labels" } else { stage };
                let per_sample = (batch.labels.len() / batch.samples.len().max(1)).max(1);
                return Err(Box::new(Failure::new(
                    FindingKind::InvalidLabel,
                    phase,
                    at,
                    format!(
                        "label {label} in row {row}{} is outside the {} classes",
                        self.samples_named(batch, &[row / per_sample]),
                        batch.classes
                    ),
                )));
            }
        }
        let HostInput::Real { values, dims } = &batch.input else {
            return Ok(());
        };
        let Some(bad) = checks::batch_values(&scan_host(values), self.batch_dtype()) else {
            return Ok(());
        };
        let samples = self.samples_named(batch, &bad_samples(values, dims, |v| bad.flags(v)));
        Err(Box::new(
            bad.failure(phase, stage, "the batch inputs", &samples)
                .with_stats(TensorStats::of_host(dims, values)),
        ))
    }

    fn upload(&self, batch: &HostBatch) -> Result<DeviceBatch> {
        let input = match &batch.input {
            HostInput::Real { values, dims } => {
                Tensor::from_slice(values, dims.as_slice(), &self.device)?.to_dtype(self.compute)?
            }
            HostInput::Tokens { ids, dims } => {
                Tensor::from_slice(ids, dims.as_slice(), &self.device)?
            }
        };
        let shape = (batch.rows(), batch.classes);
        let targets =
            Tensor::from_slice(&batch.targets, shape, &self.device)?.to_dtype(self.loss_dtype)?;
        let mix = match &batch.mix {
            Some((lam, t2)) => Some((
                *lam,
                Tensor::from_slice(t2, shape, &self.device)?.to_dtype(self.loss_dtype)?,
            )),
            None => None,
        };
        Ok(DeviceBatch {
            input,
            targets,
            mix,
        })
    }

    /// Builds the model from the current parameters and computes the loss of
    /// a batch: (model output, logits as rows × classes, loss).
    pub fn forward_loss(&self, batch: &HostBatch, tracer: &mut Tracer) -> Result<Forward> {
        let uploaded = self.upload(batch)?;
        self.forward_uploaded(uploaded, tracer)
    }

    /// Like [`Session::forward_loss`], with the model's input given as a
    /// tensor in the compute dtype (a variable, for gradients with respect
    /// to the input); the batch gives the targets.
    pub fn forward_with_input(
        &self,
        batch: &HostBatch,
        input: Tensor,
        tracer: &mut Tracer,
    ) -> Result<Forward> {
        let uploaded = DeviceBatch {
            input,
            ..self.upload(batch)?
        };
        self.forward_uploaded(uploaded, tracer)
    }

    /// The compute dtype the model's inputs and activations are in.
    pub fn compute_dtype(&self) -> candle_core::DType {
        self.compute
    }

    fn forward_uploaded(&self, uploaded: DeviceBatch, tracer: &mut Tracer) -> Result<Forward> {
        let DeviceBatch {
            input,
            targets,
            mix,
        } = uploaded;
        let model = self.factory.build_with(
            self.params.compute_builder(self.compute),
            &self.case.model,
            &self.knobs,
        )?;
        let output = model.forward(&input, tracer)?;
        let logits = match output.rank() {
            3 => output.flatten(0, 1)?,
            _ => output.clone(),
        }
        .to_dtype(self.loss_dtype)?;
        if logits.dims() != targets.dims() {
            let hint = if output.rank() == 3 && !self.case.model.per_token() {
                "; for one prediction per position set the model's `per_token: true`"
            } else if output.rank() == 2 && self.case.model.per_token() {
                "; a per-token model returns (batch, positions, outputs)"
            } else {
                ""
            };
            return Err(Error::invalid(
                "model",
                format!(
                    "the model returned shape {:?}, which gives logits {:?}; the loss takes {:?} (rows x classes){hint}",
                    output.dims(),
                    logits.dims(),
                    targets.dims()
                ),
            ));
        }
        let mix = mix.as_ref().map(|(l, t)| (*l, t));
        let loss = losses::batch_loss(
            &self.case.loss,
            self.user_loss.as_deref(),
            &logits,
            &targets,
            mix,
        )?;
        Ok(Forward {
            input,
            output,
            logits,
            loss,
        })
    }
}

/// The batch rows (samples) with a value that `bad` flags.
fn bad_samples(values: &[f32], dims: &[usize], bad: impl Fn(f32) -> bool) -> Vec<usize> {
    let per = values.len() / dims.first().copied().unwrap_or(1).max(1);
    values
        .chunks(per.max(1))
        .enumerate()
        .filter(|(_, row)| row.iter().any(|&v| bad(v)))
        .map(|(i, _)| i)
        .collect()
}

/// A host batch as named CPU tensors, as a scene saves it: `inputs`,
/// `targets`, `labels`, `samples` (dataset indices, when drawn from a
/// dataset), and a mixed batch's `mix_targets` and `mix_lambda` (one f64).
pub(super) fn tensors(batch: &HostBatch) -> Result<Vec<(String, Tensor)>> {
    let cpu = candle_core::Device::Cpu;
    let input = match &batch.input {
        HostInput::Real { values, dims } => Tensor::from_slice(values, dims.as_slice(), &cpu)?,
        HostInput::Tokens { ids, dims } => Tensor::from_slice(ids, dims.as_slice(), &cpu)?,
    };
    let shape = (batch.rows(), batch.classes);
    let mut out = vec![
        ("inputs".to_string(), input),
        (
            "targets".into(),
            Tensor::from_slice(&batch.targets, shape, &cpu)?,
        ),
        (
            "labels".into(),
            Tensor::from_slice(&batch.labels, batch.rows(), &cpu)?,
        ),
    ];
    if !batch.samples.is_empty() {
        let samples: Vec<i64> = batch.samples.iter().map(|&s| s as i64).collect();
        out.push((
            "samples".into(),
            Tensor::from_slice(&samples, samples.len(), &cpu)?,
        ));
    }
    if let Some((lambda, t2)) = &batch.mix {
        out.push(("mix_targets".into(), Tensor::from_slice(t2, shape, &cpu)?));
        out.push((
            "mix_lambda".into(),
            Tensor::from_slice(&[*lambda], 1, &cpu)?,
        ));
    }
    Ok(out)
}
