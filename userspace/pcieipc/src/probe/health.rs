//! The link health model: AER error counts to a score in [0, 1].

use serde::Serialize;

/// Turns a device's AER counters into a health score. The default is the
/// project's design: score = (1 − correctable/1e6) · (1 − uncorrectable/1e4),
/// and a score below 0.92 is sub-healthy. Uncorrectable errors weigh 100
/// times more because each one can corrupt or stall a transfer, while
/// correctable ones only cost replays.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HealthModel {
    /// Correctable errors that take the score to zero.
    pub correctable_scale: f64,
    /// Uncorrectable (non-fatal + fatal) errors that take the score to zero.
    pub uncorrectable_scale: f64,
    /// Scores below this are sub-healthy.
    pub sub_healthy_below: f64,
}

impl Default for HealthModel {
    fn default() -> Self {
        HealthModel {
            correctable_scale: 1e6,
            uncorrectable_scale: 1e4,
            sub_healthy_below: 0.92,
        }
    }
}

impl HealthModel {
    /// Each factor is floored at zero, so very large counts give 0, not a
    /// negative or flipped score.
    pub fn score(&self, correctable: u64, uncorrectable: u64) -> f64 {
        let correctable_factor = (1.0 - correctable as f64 / self.correctable_scale).max(0.0);
        let uncorrectable_factor = (1.0 - uncorrectable as f64 / self.uncorrectable_scale).max(0.0);
        correctable_factor * uncorrectable_factor
    }

    /// The score of a device's error totals (lifetime or within a window).
    pub fn score_totals(&self, totals: &AerTotals) -> f64 {
        self.score(totals.correctable, totals.uncorrectable())
    }

    pub fn is_sub_healthy(&self, score: f64) -> bool {
        score < self.sub_healthy_below
    }
}

/// A device's AER error counts by severity: the `TOTAL_ERR_*` lines of its
/// `aer_dev_*` files, or the errors among them within a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AerTotals {
    pub correctable: u64,
    pub nonfatal: u64,
    pub fatal: u64,
}

impl AerTotals {
    pub fn uncorrectable(&self) -> u64 {
        self.nonfatal + self.fatal
    }
}

/// What a device's health score rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthBasis {
    /// Its AER counters, by the model.
    AerCounters,
    /// The kernel shows no AER counters for it: the state of its link alone
    /// (`Link::state_score`).
    LinkState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_matches_the_design_formula() {
        let model = HealthModel::default();
        assert_eq!(model.score(0, 0), 1.0);
        assert!((model.score(90_000, 3) - 0.91 * 0.9997).abs() < 1e-12);
        assert!(model.is_sub_healthy(model.score(90_000, 3)));
        assert!(!model.is_sub_healthy(model.score(50_000, 100)));
        assert!((model.score(50_000, 100) - 0.95 * 0.99).abs() < 1e-12);
        assert_eq!(model.score(2_000_000, 0), 0.0);
        assert_eq!(model.score(0, 20_000), 0.0);
    }

    #[test]
    fn model_is_configurable() {
        let strict = HealthModel {
            correctable_scale: 1e3,
            uncorrectable_scale: 10.0,
            sub_healthy_below: 0.99,
        };
        assert!((strict.score(10, 0) - 0.99).abs() < 1e-12);
        assert!(strict.is_sub_healthy(strict.score(20, 0)));
    }
}
