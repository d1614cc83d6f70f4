//! Splitting a buffer into per-rank segments and a segment into chunks.

use std::ops::Range;

/// Element range `s` of `count` split into `parts` near-equal parts (the first
/// `count % parts` one longer).
pub fn part(count: usize, parts: usize, s: usize) -> Range<usize> {
    let (base, extra) = (count / parts, count % parts);
    let start = s * base + s.min(extra);
    start..start + base + usize::from(s < extra)
}

/// Part `s` of `count` split into `parts` parts of whole groups of `align`
/// elements (the last group may be short): the groups are shared out as
/// `part` shares elements, so parts differ by at most one group and every
/// boundary between parts falls on a group boundary. `align` 1 is `part`.
/// The GPU hand-off cuts its segments so, in 16-byte vectors.
pub fn part_aligned(count: usize, parts: usize, s: usize, align: usize) -> Range<usize> {
    let align = align.max(1);
    let groups = part(count.div_ceil(align), parts, s);
    (groups.start * align).min(count)..(groups.end * align).min(count)
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
    fn aligned_parts_cover_the_count_on_group_boundaries() {
        for (count, parts, align) in [
            (0, 1, 4),
            (5, 4, 4),
            (10, 3, 4),
            (4099, 2, 4),
            (1_048_579, 7, 16),
            (37, 8, 2),
            (100, 3, 1),
        ] {
            let ranges: Vec<_> = (0..parts)
                .map(|s| part_aligned(count, parts, s, align))
                .collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[parts - 1].end, count);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(
                    pair[0].end == count || pair[0].end % align == 0,
                    "{ranges:?}"
                );
            }
            // At most one group apart, and no part longer than the share
            // of groups rounded up.
            let most = count.div_ceil(align).div_ceil(parts) * align;
            assert!(ranges.iter().all(|range| range.len() <= most), "{ranges:?}");
            if align == 1 {
                let plain: Vec<_> = (0..parts).map(|s| part(count, parts, s)).collect();
                assert_eq!(ranges, plain);
            }
        }
        // 5 elements in groups of 4 over 4 parts: one whole group, the short
        // one, then nothing.
        let table = [(0, 0..4), (1, 4..5), (2, 5..5), (3, 5..5)];
        for (s, expected) in table {
            assert_eq!(part_aligned(5, 4, s, 4), expected, "part {s}");
        }
        assert_eq!(part_aligned(10, 3, 0, 4), 0..4);
        assert_eq!(part_aligned(10, 3, 1, 4), 4..8);
        assert_eq!(part_aligned(10, 3, 2, 4), 8..10);
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
