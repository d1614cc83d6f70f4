//! Splitting a buffer into per-rank segments and a segment into chunks.

use std::ops::Range;

/// Element range `s` of `count` split into `parts` near-equal parts (the first
/// `count % parts` one longer).
pub fn part(count: usize, parts: usize, s: usize) -> Range<usize> {
    let (base, extra) = (count / parts, count % parts);
    let start = s * base + s.min(extra);
    start..start + base + usize::from(s < extra)
}

/// Chunk number `chunk` of `range` in chunks of `chunk_elements` (empty past
/// its end; the last one may be shorter).
pub fn clip(range: &Range<usize>, chunk: usize, chunk_elements: usize) -> Range<usize> {
    let start = (range.start + chunk * chunk_elements).min(range.end);
    start..(start + chunk_elements).min(range.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_count_in_order_and_differ_by_at_most_one() {
        for (count, parts) in [(0, 1), (7, 3), (8, 4), (1, 7), (1_048_579, 7)] {
            let ranges: Vec<_> = (0..parts).map(|s| part(count, parts, s)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[parts - 1].end, count);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[0].len() >= pair[1].len() && pair[0].len() - pair[1].len() <= 1);
            }
        }
        assert_eq!(part(7, 3, 0), 0..3);
        assert_eq!(part(7, 3, 1), 3..5);
        assert_eq!(part(7, 3, 2), 5..7);
    }

    #[test]
    fn clip_cuts_chunks_and_is_empty_past_the_end() {
        let table = [
            (10..20, 0, 4, 10..14),
            (10..20, 2, 4, 18..20),
            (10..20, 3, 4, 20..20),
            (0..0, 0, 4, 0..0),
        ];
        for (range, chunk, elements, expected) in table {
            assert_eq!(
                clip(&range, chunk, elements),
                expected,
                "{range:?} chunk {chunk}"
            );
        }
    }
}
