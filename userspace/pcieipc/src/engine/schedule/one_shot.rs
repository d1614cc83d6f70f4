//! The one-shot all_reduce: every rank publishes its whole buffer, in rounds
//! of one window each, and reduces all N buffers itself in rank order, so
//! every rank computes bit-identical results.

use std::ops::Range;

use super::partition::clip;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneShot {
    pub count: usize,
    /// Elements one published window holds.
    pub window_elements: usize,
}

impl OneShot {
    /// Rounds the call takes (at least one, so that empty calls still meet).
    pub fn rounds(&self) -> usize {
        self.count.div_ceil(self.window_elements.max(1)).max(1)
    }

    /// The elements published and reduced in `round`.
    pub fn round(&self, round: usize) -> Range<usize> {
        clip(&(0..self.count), round, self.window_elements.max(1))
    }

    /// Which of the two windows a rank's `published`-th round (counting
    /// from 0 over the communicator's life) uses: they alternate, so a rank
    /// can publish a round while a slow peer still reads the one before.
    pub fn window_parity(published: u64) -> usize {
        (published % 2) as usize
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // tables of ranges, one entry long
mod tests {
    use super::*;

    #[test]
    fn rounds_cover_the_buffer_in_windows() {
        // (count, window, expected rounds)
        let table: [(usize, usize, &[Range<usize>]); 4] = [
            (0, 8, &[0..0]),
            (8, 8, &[0..8]),
            (9, 8, &[0..8, 8..9]),
            (20, 7, &[0..7, 7..14, 14..20]),
        ];
        for (count, window_elements, expected) in table {
            let one_shot = OneShot {
                count,
                window_elements,
            };
            let rounds: Vec<_> = (0..one_shot.rounds()).map(|r| one_shot.round(r)).collect();
            assert_eq!(rounds, expected, "{count} in windows of {window_elements}");
        }
        assert_eq!(OneShot::window_parity(0), 0);
        assert_eq!(OneShot::window_parity(7), 1);
    }
}
