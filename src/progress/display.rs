//! [`Display`]: a [`Progress`] drawn on stderr with indicatif, one line for the
//! listing and downloads and one per UDF operator (a `MultiProgress`).
//!
//! Guarantees: nothing is drawn unless stderr is a terminal and `CI` is unset
//! ([`draw_on_stderr`]); nothing ever goes to stdout; the lines are cleared when
//! the display is finished or dropped (a cancelled run leaves no stale bar).

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Progress;

/// Whether a live display may be drawn: stderr is a terminal and the `CI`
/// environment variable is unset.
pub fn draw_on_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("CI").is_none()
}

/// A live display of a run's [`Progress`] (or nothing, when off).
#[derive(Debug)]
#[must_use]
pub struct Display {
    lines: Option<(MultiProgress, Vec<ProgressBar>)>,
}

impl Display {
    /// A display that draws when `on` and [`draw_on_stderr`].
    pub fn new(on: bool) -> Self {
        let lines = (on && draw_on_stderr()).then(|| {
            (
                MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
                Vec::new(),
            )
        });
        Self { lines }
    }

    /// Shows `p` (adds a line per UDF the first time it is seen).
    pub fn update(&mut self, p: &Progress) {
        let Some((multi, bars)) = &mut self.lines else {
            return;
        };
        let lines = p.lines();
        while bars.len() < lines.len() {
            // A spinner on the first line (it turns on every sample), the UDF
            // lines indented under it.
            let template = if bars.is_empty() {
                "{spinner} {msg}"
            } else {
                "  {msg}"
            };
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bars.push(multi.add(bar));
        }
        for (bar, line) in bars.iter().zip(lines) {
            bar.set_message(line);
        }
        if let Some(first) = bars.first() {
            first.tick();
        }
    }

    /// Clears the lines.
    pub fn finish(mut self) {
        self.clear();
    }

    fn clear(&mut self) {
        if let Some((multi, bars)) = self.lines.take() {
            for bar in &bars {
                bar.finish_and_clear();
            }
            let _ = multi.clear();
        }
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.clear();
    }
}
