//! The direct all_reduce: rank r owns segment r. It reads that segment from
//! every peer's input, piece by piece, and reduces each piece into its own
//! output (the reduce-scatter), then reads every other segment from its
//! owner's output (the all-gather). Each element is reduced by one rank, so
//! all ranks hold bit-identical results. Three meetings per call: the
//! buffers' addresses are published, the segment is reduced, all are done.

use std::ops::Range;

use super::partition::{clip, part};

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
}
