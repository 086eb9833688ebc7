//! The command line's progress bar: [`nanhunt::progress::Progress`] drawn
//! with indicatif on stderr (hidden when stderr is not a terminal).

use crate::progress::{Progress, Reporter};
use std::sync::Arc;

#[derive(Debug)]
pub struct Bar {
    /// What is counted: `runs`, `seeds`.
    unit: &'static str,
    bar: indicatif::ProgressBar,
}

impl Bar {
    /// A bar counting `unit`, or none when `quiet`.
    pub fn unless(quiet: bool, unit: &'static str) -> Option<Reporter> {
        (!quiet).then(|| {
            Arc::new(Bar {
                unit,
                bar: indicatif::ProgressBar::no_length(),
            }) as Reporter
        })
    }
}

impl Progress for Bar {
    fn start(&self, total: Option<u64>) {
        let template = match total {
            Some(n) => {
                self.bar.set_length(n);
                format!(
                    "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {} {{msg}}",
                    self.unit
                )
            }
            None => format!(
                "{{elapsed_precise}} {{spinner}} {{pos}} {} {{msg}}",
                self.unit
            ),
        };
        self.bar.set_style(
            indicatif::ProgressStyle::with_template(&template)
                .expect("valid template")
                .progress_chars("=> "),
        );
    }

    fn update(&self, done: u64, status: &str) {
        self.bar.set_position(done);
        if !status.is_empty() {
            self.bar.set_message(status.to_string());
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
