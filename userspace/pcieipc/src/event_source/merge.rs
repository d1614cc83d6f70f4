//! One ordered stream from several sources: events wait a short window (a
//! source may deliver an event later than another source delivers a newer
//! one) and leave in CLOCK_MONOTONIC order. No I/O.

use crate::events::Event;

/// Orders events of several sources by time.
#[derive(Debug, Default)]
pub struct Merger {
    pending: Vec<Event>,
    window_ns: u64,
}

impl Merger {
    /// Events leave once they are `window_ns` old.
    pub fn new(window_ns: u64) -> Self {
        Merger {
            pending: Vec::new(),
            window_ns,
        }
    }

    pub fn push(&mut self, events: impl IntoIterator<Item = Event>) {
        self.pending.extend(events);
    }

    /// The events at least the window old at `now_ns`, oldest first (same
    /// time: module, tracefs, counters; then each source's order).
    pub fn ready(&mut self, now_ns: u64) -> Vec<Event> {
        let cutoff = now_ns.saturating_sub(self.window_ns);
        self.sort();
        let keep = self
            .pending
            .iter()
            .position(|e| e.timestamp_ns > cutoff)
            .unwrap_or(self.pending.len());
        self.pending.drain(..keep).collect()
    }

    /// Everything still waiting, oldest first.
    pub fn drain(&mut self) -> Vec<Event> {
        self.sort();
        std::mem::take(&mut self.pending)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn sort(&mut self) {
        // Stable: events of one source with one time keep their order.
        self.pending
            .sort_by_key(|e| (e.timestamp_ns, e.source, e.seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, EventSource};

    fn event(source: EventSource, seq: u64, at: u64) -> Event {
        let mut e = Event::new(source, EventKind::Aer, "0000:00:10.0".into(), at);
        e.seq = seq;
        e
    }

    fn order(events: &[Event]) -> Vec<(EventSource, u64)> {
        events.iter().map(|e| (e.source, e.seq)).collect()
    }

    #[test]
    fn sources_interleave_by_time_after_the_window() {
        let mut merger = Merger::new(100);
        merger.push([
            event(EventSource::Module, 0, 1_000),
            event(EventSource::Module, 1, 1_300),
        ]);
        // tracefs delivers later an event older than the module's second.
        merger.push([event(EventSource::Tracefs, 0, 1_200)]);
        assert_eq!(
            order(&merger.ready(1_250)),
            [(EventSource::Module, 0)],
            "1_200 is not yet 100 ns old at 1_250"
        );
        assert_eq!(order(&merger.ready(1_300)), [(EventSource::Tracefs, 0)]);
        merger.push([event(EventSource::Counters, 0, 1_300)]);
        assert_eq!(
            order(&merger.drain()),
            [(EventSource::Module, 1), (EventSource::Counters, 0)]
        );
        assert!(merger.is_empty());
    }
}
