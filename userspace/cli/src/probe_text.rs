//! The probe's values as the text report and the watch print them.

use pcieipc::probe::{HealthBasis, LinkSpeed};

/// A score and what it rests on: AER counters, or the link alone.
pub(crate) fn health_text(score: Option<f64>, basis: Option<HealthBasis>) -> String {
    match (score, basis) {
        (Some(score), Some(HealthBasis::LinkState)) => {
            format!("{score:.4} (link state; AER not reported)")
        }
        (Some(score), _) => format!("{score:.4}"),
        (None, _) => "? (no AER counters, link state unknown)".to_string(),
    }
}

/// A link speed, `?` where unknown.
pub(crate) fn speed_text(speed: Option<LinkSpeed>) -> String {
    speed.map_or("?".to_string(), |speed| {
        format!("{:.1} GT/s", speed.gigatransfers_per_second())
    })
}
