//! `pcieipc probe --watch`: each device's health recomputed from the AER
//! errors that arrived within a sliding window of samples, not from lifetime
//! totals, so a link that starts collecting errors while a job runs turns
//! sub-healthy then, and healthy again once the errors have left the window;
//! and link speed or width changes between samples. No I/O: a sample is
//! taken from a probed `Topology` (`Sample::of_topology`), or written by a
//! test.

use std::time::Duration;

use serde::Serialize;

use super::bdf::Bdf;
use super::health::{AerTotals, HealthBasis, HealthModel};
use super::link::{LinkSpeed, LinkState};
use super::topology::Topology;

/// The link above a device as one sample saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinkSample {
    pub current_speed_gts: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub state: LinkState,
    /// `Link::state_score`: the health of a device without AER counters.
    pub state_score: Option<f64>,
}

impl LinkSample {
    /// Slower or narrower than `before`. A speed or width that became
    /// unknown is a change, not a downshift.
    pub fn is_downshift_from(&self, before: &LinkSample) -> bool {
        fn lower<T: PartialOrd>(now: Option<T>, then: Option<T>) -> bool {
            now.zip(then).is_some_and(|(now, then)| now < then)
        }
        lower(self.current_speed_gts, before.current_speed_gts)
            || lower(self.current_width, before.current_width)
    }

    fn trained_differently_from(&self, before: &LinkSample) -> bool {
        (self.current_speed_gts, self.current_width, self.state)
            != (before.current_speed_gts, before.current_width, before.state)
    }
}

/// One device in one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSample {
    pub bdf: Bdf,
    /// Its AER counter totals; `None` when the kernel shows no `aer_dev_*` files.
    pub aer: Option<AerTotals>,
    /// The link above it; `None` when it has none (root bus, inside a switch).
    pub link: Option<LinkSample>,
}

/// The counters and links of every device at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Since the watch began.
    pub at: Duration,
    /// In bus-id order.
    pub devices: Vec<DeviceSample>,
}

impl Sample {
    pub fn of_topology(topology: &Topology, at: Duration) -> Sample {
        let devices = topology
            .devices
            .iter()
            .enumerate()
            .map(|(index, device)| DeviceSample {
                bdf: device.bdf,
                aer: device.aer_totals(),
                link: topology.link_above(index).map(|link| LinkSample {
                    current_speed_gts: link.current_speed,
                    current_width: link.current_width,
                    state: link.state,
                    state_score: link.state_score(),
                }),
            })
            .collect();
        Sample { at, devices }
    }

    fn device(&self, bdf: Bdf) -> Option<&DeviceSample> {
        self.devices
            .binary_search_by_key(&bdf, |device| device.bdf)
            .ok()
            .map(|index| &self.devices[index])
    }
}

/// A device's health over the window that ends at the latest sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceWindow {
    pub bdf: Bdf,
    /// From the AER errors within the window by the health model; without
    /// AER counters, the link's state score; `None` when neither is known.
    pub health: Option<f64>,
    pub health_basis: Option<HealthBasis>,
    pub sub_healthy: bool,
    /// The AER errors that arrived within the window; `None` without AER counters.
    pub window_errors: Option<AerTotals>,
    /// The latest sample's counters are below the one before: the kernel
    /// keeps them per enumerated device, so a device removed and found
    /// again (hot plug, rescan) counts from zero. Its errors since then are
    /// the new values.
    pub counters_reset: bool,
    pub link: Option<LinkSample>,
}

/// Every device's windowed health at the latest sample.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowedHealth {
    /// The time the counted errors were gathered over: from the sample
    /// before the first one within the window to the latest. Shorter than
    /// the window while the watch is young.
    pub span: Duration,
    /// The devices of the latest sample, in bus-id order.
    pub devices: Vec<DeviceWindow>,
}

/// Errors between two readings of one device's counters. A counter below
/// its earlier reading was reset, and its value is what arrived since.
fn errors_between(before: &AerTotals, after: &AerTotals) -> AerTotals {
    let since = |before: u64, after: u64| after.checked_sub(before).unwrap_or(after);
    AerTotals {
        correctable: since(before.correctable, after.correctable),
        nonfatal: since(before.nonfatal, after.nonfatal),
        fatal: since(before.fatal, after.fatal),
    }
}

fn went_back(before: &AerTotals, after: &AerTotals) -> bool {
    after.correctable < before.correctable
        || after.nonfatal < before.nonfatal
        || after.fatal < before.fatal
}

/// The health of each device of the latest of `samples` (in time order)
/// from the errors seen at the samples taken within `window` of it: the
/// sum of each such sample's increase over the sample before it.
pub fn windowed_health(
    samples: &[Sample],
    window: Duration,
    model: &HealthModel,
) -> WindowedHealth {
    let Some(latest) = samples.last() else {
        return WindowedHealth {
            span: Duration::ZERO,
            devices: Vec::new(),
        };
    };
    let window_start = latest.at.saturating_sub(window);
    // Samples strictly inside the window, and the one before them as the
    // base of the first increase.
    let first_inside = samples
        .iter()
        .position(|sample| sample.at > window_start)
        .unwrap_or(samples.len() - 1);
    let counted = &samples[first_inside.saturating_sub(1)..];
    let span = latest.at - counted[0].at;
    let previous = samples.len().checked_sub(2).map(|index| &samples[index]);
    let devices = latest
        .devices
        .iter()
        .map(|device| {
            let aer_of = |sample: &Sample| sample.device(device.bdf).and_then(|found| found.aer);
            let window_errors = device.aer.map(|_| {
                counted
                    .windows(2)
                    .filter_map(|pair| Some(errors_between(&aer_of(&pair[0])?, &aer_of(&pair[1])?)))
                    .fold(AerTotals::default(), |sum, errors| AerTotals {
                        correctable: sum.correctable + errors.correctable,
                        nonfatal: sum.nonfatal + errors.nonfatal,
                        fatal: sum.fatal + errors.fatal,
                    })
            });
            let counters_reset = device
                .aer
                .zip(previous.and_then(aer_of))
                .is_some_and(|(now, before)| went_back(&before, &now));
            let (health, health_basis) = match (window_errors, device.link) {
                (Some(errors), _) => (
                    Some(model.score_totals(&errors)),
                    Some(HealthBasis::AerCounters),
                ),
                (None, Some(link)) => (
                    link.state_score,
                    link.state_score.map(|_| HealthBasis::LinkState),
                ),
                (None, None) => (None, None),
            };
            DeviceWindow {
                bdf: device.bdf,
                health,
                health_basis,
                sub_healthy: health.is_some_and(|score| model.is_sub_healthy(score)),
                window_errors,
                counters_reset,
                link: device.link,
            }
        })
        .collect();
    WindowedHealth { span, devices }
}

/// What changed for a device from one sample to the next.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Its windowed health moved: errors arrived or left the window, or the
    /// link state it rests on changed.
    Health { from: Option<f64>, to: Option<f64> },
    /// The link above it trained to another speed, width or state.
    Link {
        from: LinkSample,
        to: LinkSample,
        downshift: bool,
    },
    /// Its AER counters went back (see `DeviceWindow::counters_reset`).
    CountersReset,
    /// New in this sample (hot plug, rescan).
    Appeared,
    /// Gone since the last sample (removal).
    Gone,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceChange {
    pub bdf: Bdf,
    #[serde(flatten)]
    pub change: Change,
}

/// The changes from one windowed health to the next, in bus-id order.
pub fn changes(before: &[DeviceWindow], after: &[DeviceWindow]) -> Vec<DeviceChange> {
    let find = |devices: &[DeviceWindow], bdf: Bdf| {
        devices
            .binary_search_by_key(&bdf, |device| device.bdf)
            .ok()
            .map(|index| devices[index].clone())
    };
    let mut found = Vec::new();
    for now in after {
        let Some(then) = find(before, now.bdf) else {
            found.push((now.bdf, Change::Appeared));
            continue;
        };
        if now.counters_reset {
            found.push((now.bdf, Change::CountersReset));
        }
        if let (Some(from), Some(to)) = (then.link, now.link) {
            if to.trained_differently_from(&from) {
                found.push((
                    now.bdf,
                    Change::Link {
                        from,
                        to,
                        downshift: to.is_downshift_from(&from),
                    },
                ));
            }
        }
        if now.health != then.health {
            found.push((
                now.bdf,
                Change::Health {
                    from: then.health,
                    to: now.health,
                },
            ));
        }
    }
    for then in before {
        if find(after, then.bdf).is_none() {
            found.push((then.bdf, Change::Gone));
        }
    }
    // Stable: a device's own changes keep the order above.
    found.sort_by_key(|(bdf, _)| *bdf);
    found
        .into_iter()
        .map(|(bdf, change)| DeviceChange { bdf, change })
        .collect()
}

/// The result of one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchStep {
    pub health: WindowedHealth,
    /// Empty for the first sample, which has nothing to change from.
    pub changes: Vec<DeviceChange>,
}

/// The samples a window needs, and the last windowed health to compare the
/// next against.
#[derive(Debug, Clone)]
pub struct Watch {
    window: Duration,
    model: HealthModel,
    samples: Vec<Sample>,
    last: Option<Vec<DeviceWindow>>,
}

impl Watch {
    pub fn new(window: Duration, model: HealthModel) -> Watch {
        Watch {
            window,
            model,
            samples: Vec::new(),
            last: None,
        }
    }

    /// Adds a sample taken after the previous one; older samples that no
    /// window will count again are dropped.
    pub fn push(&mut self, sample: Sample) -> WatchStep {
        let window_start = sample.at.saturating_sub(self.window);
        self.samples.push(sample);
        let first_inside = self
            .samples
            .iter()
            .position(|kept| kept.at > window_start)
            .unwrap_or(self.samples.len() - 1);
        self.samples.drain(..first_inside.saturating_sub(1));
        let health = windowed_health(&self.samples, self.window, &self.model);
        let changes = self
            .last
            .as_deref()
            .map_or_else(Vec::new, |last| changes(last, &health.devices));
        self.last = Some(health.devices.clone());
        WatchStep { health, changes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "0000:05:00.0";
    const NIC: &str = "0000:06:00.0";

    fn bdf(text: &str) -> Bdf {
        text.parse().unwrap()
    }

    fn gen4_x16() -> LinkSample {
        LinkSample {
            current_speed_gts: Some(LinkSpeed::Gt16),
            current_width: Some(16),
            state: LinkState::Full,
            state_score: Some(1.0),
        }
    }

    fn gen4_x8() -> LinkSample {
        LinkSample {
            current_width: Some(8),
            state: LinkState::Degraded,
            state_score: Some(0.5),
            ..gen4_x16()
        }
    }

    /// The GPU with `correctable` errors so far and the NIC without AER
    /// counters, at second `second`.
    fn sample(second: u64, correctable: u64, nic_link: LinkSample) -> Sample {
        Sample {
            at: Duration::from_secs(second),
            devices: vec![
                DeviceSample {
                    bdf: bdf(GPU),
                    aer: Some(AerTotals {
                        correctable,
                        ..AerTotals::default()
                    }),
                    link: Some(gen4_x16()),
                },
                DeviceSample {
                    bdf: bdf(NIC),
                    aer: None,
                    link: Some(nic_link),
                },
            ],
        }
    }

    /// 37 correctable errors take a device to 0.63 at this scale.
    fn strict_model() -> HealthModel {
        HealthModel {
            correctable_scale: 100.0,
            ..HealthModel::default()
        }
    }

    fn gpu(step: &WatchStep) -> &DeviceWindow {
        &step.health.devices[0]
    }

    #[test]
    fn a_burst_turns_a_device_sub_healthy_for_the_window_only() {
        let mut watch = Watch::new(Duration::from_secs(10), strict_model());
        // 1,000 lifetime errors before the watch began do not count.
        let mut steps = Vec::new();
        for second in 0..=20 {
            let total = if second < 5 { 1_000 } else { 1_037 };
            steps.push(watch.push(sample(second, total, gen4_x16())));
        }
        assert_eq!(gpu(&steps[0]).health, Some(1.0));
        assert!(steps[0].changes.is_empty());
        assert_eq!(gpu(&steps[4]).health, Some(1.0));
        // The 37 errors seen at second 5 count while second 5 is within
        // the last 10 s: seconds 5 to 14.
        for step in &steps[5..15] {
            let window = gpu(step);
            assert!((window.health.unwrap() - 0.63).abs() < 1e-12);
            assert!(window.sub_healthy);
            assert_eq!(
                window.window_errors,
                Some(AerTotals {
                    correctable: 37,
                    nonfatal: 0,
                    fatal: 0
                })
            );
            assert_eq!(window.health_basis, Some(HealthBasis::AerCounters));
        }
        assert_eq!(
            steps[5].changes,
            [DeviceChange {
                bdf: bdf(GPU),
                change: Change::Health {
                    from: Some(1.0),
                    to: Some(1.0 - 0.37)
                }
            }]
        );
        assert!(steps[6].changes.is_empty());
        assert_eq!(steps[5].health.span, Duration::from_secs(5));
        assert_eq!(steps[14].health.span, Duration::from_secs(10));
        for step in &steps[15..] {
            assert_eq!(gpu(step).health, Some(1.0));
            assert!(!gpu(step).sub_healthy);
            assert_eq!(gpu(step).window_errors, Some(AerTotals::default()));
        }
        assert_eq!(
            steps[15].changes,
            [DeviceChange {
                bdf: bdf(GPU),
                change: Change::Health {
                    from: Some(1.0 - 0.37),
                    to: Some(1.0)
                }
            }]
        );
        // Only the window's samples (and the base before them) are kept.
        assert_eq!(watch.samples.len(), 11);
    }

    #[test]
    fn errors_add_up_across_the_samples_of_a_window() {
        let samples: Vec<Sample> = [(0, 0), (3, 10), (6, 25), (9, 30), (12, 30)]
            .into_iter()
            .map(|(second, total)| sample(second, total, gen4_x16()))
            .collect();
        let health = windowed_health(&samples, Duration::from_secs(10), &strict_model());
        // Seen at seconds 3, 6, 9 and 12 (within 10 s of 12), counted from
        // second 0: all 30, over 12 s.
        assert_eq!(health.devices[0].window_errors.unwrap().correctable, 30);
        assert_eq!(health.span, Duration::from_secs(12));
        let health = windowed_health(&samples, Duration::from_secs(6), &strict_model());
        // Seen at seconds 9 and 12: 5, counted from second 6.
        assert_eq!(health.devices[0].window_errors.unwrap().correctable, 5);
        assert_eq!(health.span, Duration::from_secs(6));
        assert!((health.devices[0].health.unwrap() - 0.95).abs() < 1e-12);
    }

    #[test]
    fn counters_that_go_back_count_from_zero() {
        let mut watch = Watch::new(Duration::from_secs(10), strict_model());
        watch.push(sample(0, 500, gen4_x16()));
        watch.push(sample(1, 510, gen4_x16()));
        // Reset (the device was removed and found again), then 4 new errors.
        let reset = watch.push(sample(2, 4, gen4_x16()));
        let window = gpu(&reset);
        assert!(window.counters_reset);
        assert_eq!(window.window_errors.unwrap().correctable, 14);
        assert!((window.health.unwrap() - 0.86).abs() < 1e-12);
        assert_eq!(reset.changes[0].change, Change::CountersReset);
        let after = watch.push(sample(3, 6, gen4_x16()));
        assert!(!gpu(&after).counters_reset);
        assert_eq!(gpu(&after).window_errors.unwrap().correctable, 16);

        let each_severity = errors_between(
            &AerTotals {
                correctable: 9,
                nonfatal: 5,
                fatal: 1,
            },
            &AerTotals {
                correctable: 12,
                nonfatal: 2,
                fatal: 1,
            },
        );
        assert_eq!(
            each_severity,
            AerTotals {
                correctable: 3,
                nonfatal: 2,
                fatal: 0
            }
        );
    }

    #[test]
    fn a_link_downshift_is_reported_and_scores_a_device_without_aer() {
        let mut watch = Watch::new(Duration::from_secs(10), HealthModel::default());
        let first = watch.push(sample(0, 0, gen4_x16()));
        let nic = &first.health.devices[1];
        assert_eq!(nic.health, Some(1.0));
        assert_eq!(nic.health_basis, Some(HealthBasis::LinkState));
        assert_eq!(nic.window_errors, None);
        let narrowed = watch.push(sample(1, 0, gen4_x8()));
        assert_eq!(
            narrowed.changes,
            [
                DeviceChange {
                    bdf: bdf(NIC),
                    change: Change::Link {
                        from: gen4_x16(),
                        to: gen4_x8(),
                        downshift: true
                    }
                },
                DeviceChange {
                    bdf: bdf(NIC),
                    change: Change::Health {
                        from: Some(1.0),
                        to: Some(0.5)
                    }
                },
            ]
        );
        assert!(narrowed.health.devices[1].sub_healthy);
        let retrained = watch.push(sample(2, 0, gen4_x16()));
        assert_eq!(
            retrained.changes[0].change,
            Change::Link {
                from: gen4_x8(),
                to: gen4_x16(),
                downshift: false
            }
        );
        let slower = LinkSample {
            current_speed_gts: Some(LinkSpeed::Gt8),
            ..gen4_x16()
        };
        assert!(slower.is_downshift_from(&gen4_x16()));
        let unknown = LinkSample {
            current_speed_gts: None,
            ..gen4_x16()
        };
        assert!(!unknown.is_downshift_from(&gen4_x16()));
    }

    #[test]
    fn devices_that_come_and_go_are_changes() {
        let mut watch = Watch::new(Duration::from_secs(10), HealthModel::default());
        watch.push(sample(0, 0, gen4_x16()));
        let mut without_nic = sample(1, 0, gen4_x16());
        without_nic.devices.pop();
        let gone = watch.push(without_nic);
        assert_eq!(
            gone.changes,
            [DeviceChange {
                bdf: bdf(NIC),
                change: Change::Gone
            }]
        );
        let back = watch.push(sample(2, 0, gen4_x16()));
        assert_eq!(
            back.changes,
            [DeviceChange {
                bdf: bdf(NIC),
                change: Change::Appeared
            }]
        );
    }
}
