//! The direct all_reduce: rank r owns segment r. It reads that segment from
//! every peer's input, piece by piece, and reduces each piece into its own
//! output (the reduce-scatter), then reads every other segment from its
//! owner's output (the all-gather). Each element is reduced by one rank, so
//! all ranks hold bit-identical results. Three meetings per call: the
//! buffers' addresses are published, the segment is reduced, all are done.

use std::ops::Range;

use super::partition::{clip, part, part_aligned};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Direct {
    pub count: usize,
    pub nranks: usize,
}

impl Direct {
    /// The segment `rank` reduces, and later every other rank reads from it.
    pub fn owned(&self, rank: usize) -> Range<usize> {
        part(self.count, self.nranks, rank)
    }

    /// The segment `rank` owns when segments are cut in whole groups of
    /// `align` elements (`part_aligned`): the GPU hand-off's two-shot
    /// all_reduce cuts them in 16-byte vectors, which its kernels copy and
    /// reduce whole. `align` 1 is [`owned`](Self::owned).
    pub fn owned_aligned(&self, rank: usize, align: usize) -> Range<usize> {
        part_aligned(self.count, self.nranks, rank, align)
    }

    /// `rank`'s segment in pieces of `piece_elements`, each read from every
    /// peer and reduced before the next.
    pub fn pieces(&self, rank: usize, piece_elements: usize) -> impl Iterator<Item = Range<usize>> {
        let owned = self.owned(rank);
        let piece_elements = piece_elements.max(1);
        (0..owned.len().div_ceil(piece_elements))
            .map(move |index| clip(&owned, index, piece_elements))
    }

    /// Every rank but `rank`, in rank order: the order peers' pieces are
    /// reduced in, and the order segments are gathered in.
    pub fn peers(&self, rank: usize) -> impl Iterator<Item = usize> {
        (0..self.nranks).filter(move |peer| *peer != rank)
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // tables of ranges, one entry long
mod tests {
    use super::*;

    #[test]
    fn owned_segments_and_pieces_tile_the_buffer() {
        let direct = Direct {
            count: 10,
            nranks: 3,
        };
        assert_eq!(direct.owned(0), 0..4);
        assert_eq!(direct.owned(2), 7..10);
        assert_eq!(direct.pieces(0, 3).collect::<Vec<_>>(), [0..3, 3..4]);
        assert_eq!(direct.pieces(1, 8).collect::<Vec<_>>(), [4..7]);
        assert_eq!(direct.peers(1).collect::<Vec<_>>(), [0, 2]);
        let empty = Direct {
            count: 1,
            nranks: 3,
        };
        assert_eq!(empty.pieces(2, 4).count(), 0);
    }

    #[test]
    fn aligned_segments_are_whole_groups_but_the_last() {
        let direct = Direct {
            count: 4099,
            nranks: 3,
        };
        // 1025 vectors of 4: 342, 342 and 341 of them, the last one short.
        assert_eq!(direct.owned_aligned(0, 4), 0..1368);
        assert_eq!(direct.owned_aligned(1, 4), 1368..2736);
        assert_eq!(direct.owned_aligned(2, 4), 2736..4099);
        for rank in 0..3 {
            assert_eq!(direct.owned_aligned(rank, 1), direct.owned(rank));
        }
    }
}
