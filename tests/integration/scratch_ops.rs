use crate::support::sgd;
use candle_core::{Module, Tensor, D};
use candle_nn::{linear, linear_no_bias, Linear, VarBuilder};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, Outcome, RunOptions};

fn vector(name: &str) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 8 }, 4));
    c.optimizer = sgd(0.05);
    c.steps = 30;
    c
}

struct Net { fc1: Linear, fc2: Linear, which: u8 }

impl Model for Net {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor, _tr: &mut Tracer) -> candle_core::Result<Tensor> {
        match self.which {
            0 => {
                let h = self.fc1.forward(x)?.relu()?;
                let norm = h.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
                let h = h.broadcast_div(&norm)?;
                self.fc2.forward(&h)
            }
            1 => {
                let h = self.fc1.forward(x)?;
                let s = h.relu()?.sqrt()?;
                self.fc2.forward(&s)
            }
            2 => {
                let h = self.fc1.forward(x)?;
                let gate = (h.neg()?.exp()? + 1.0)?.recip()?;
                self.fc2.forward(&gate)
            }
            _ => {
                let h = self.fc1.forward(x)?.relu()?;
                let z = (self.fc2.forward(&h)? * 60.0)?;
                candle_nn::ops::softmax(&z, D::Minus1)?.log()
            }
        }
    }
}

#[test]
fn scratch_ops() {
    for which in 0..4u8 {
        let mut c = vector("net");
        if which == 0 {
            c.data.pathologies = vec![Pathology::AllZero { fraction: 0.1, from_step: 0 }];
        }
        if which == 2 { c.data.scale = 30.0; }
        let factory = move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
            let fc1 = if which == 0 { linear_no_bias(8, 16, vb.pp("fc1"))? } else { linear(8, 16, vb.pp("fc1"))? };
            Ok(Box::new(Net { fc1, fc2: linear(16, 4, vb.pp("fc2"))?, which }))
        };
        let o = run_model(&c, &factory, &RunOptions::default()).unwrap();
        match o {
            Outcome::Unstable { finding } => {
                println!("== {which}: {} {:?} at {} site {:?}\n  detail: {}", finding.kind.as_str(), finding.phase, finding.stage, finding.site.as_ref().map(|s| s.to_string()), finding.detail);
                if let Some(e) = &finding.explanation { println!("  {:?}: {}\n  repair: {}", e.pattern, e.sentence, e.repair); }
                println!("  sig {}", finding.signature.slug());
            }
            other => println!("== {which}: {}", other.verdict()),
        }
    }
}
