//! The checksum a message carries across a device link (pure).
//!
//! Fletcher's sums over 64-bit words in four independent lanes (so the loop
//! runs at memory speed), seeded with the message's number: a flipped bit
//! changes a lane's plain sum, reordered or zeroed words its weighted sum, and
//! a message whose write never arrived (the slot still holding an earlier
//! message, with that message's checksum) fails because the seed differs. It
//! guards against damage on a link, not against a peer that lies.

/// Bits of the checksum: it shares the stamp's chunk-size word with a flag.
pub(crate) const CHECKSUM_BITS: u32 = 31;

const LANES: usize = 4;
const BLOCK: usize = LANES * 8;

/// The checksum of `bytes` as message `seed`, in [`CHECKSUM_BITS`] bits.
pub(crate) fn checksum(seed: u64, bytes: &[u8]) -> u32 {
    let mut plain = [seed, !seed, seed.rotate_left(17), seed.rotate_left(41)];
    let mut weighted = [0u64; LANES];
    let mut add = |block: &[u8]| {
        for lane in 0..LANES {
            let word = u64::from_le_bytes(block[lane * 8..lane * 8 + 8].try_into().unwrap());
            plain[lane] = plain[lane].wrapping_add(word);
            weighted[lane] = weighted[lane].wrapping_add(plain[lane]);
        }
    };
    let blocks = bytes.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    blocks.for_each(&mut add);
    if !tail.is_empty() {
        let mut last = [0u8; BLOCK];
        last[..tail.len()].copy_from_slice(tail);
        add(&last);
    }
    // The length goes in so that trailing zero bytes count; a multiply-xorshift
    // finish spreads every lane over every output bit.
    let mut hash = (bytes.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for lane in 0..LANES {
        for word in [plain[lane], weighted[lane]] {
            hash = (hash ^ word).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            hash ^= hash >> 31;
        }
    }
    (hash ^ hash >> 32) as u32 & ((1 << CHECKSUM_BITS) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 + 7) as u8).collect()
    }

    #[test]
    fn every_single_bit_flip_changes_it() {
        for len in [1, 7, 8, 31, 32, 33, 200, 4096] {
            let data = pattern(len);
            let sum = checksum(5, &data);
            for bit in 0..len * 8 {
                let mut damaged = data.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert_ne!(checksum(5, &damaged), sum, "len {len}, bit {bit}");
            }
        }
    }

    #[test]
    fn swapped_zeroed_and_stale_data_change_it() {
        let data = pattern(4096);
        let sum = checksum(9, &data);
        // Two different words of one lane, swapped.
        let mut swapped = data.clone();
        let (first, second) = swapped.split_at_mut(BLOCK);
        first[..8].swap_with_slice(&mut second[..8]);
        assert_ne!(swapped, data);
        assert_ne!(checksum(9, &swapped), sum);
        // A cache line lost (zeroed).
        let mut zeroed = data.clone();
        zeroed[640..704].fill(0);
        assert_ne!(checksum(9, &zeroed), sum);
        // The same bytes as another message: an earlier message left in the slot.
        assert_ne!(checksum(8, &data), sum);
        assert_ne!(checksum(9 + (1 << 32), &data), sum);
        // Trailing zeros are not free.
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(checksum(9, &longer), sum);
        assert!(sum < 1 << CHECKSUM_BITS);
        assert_eq!(checksum(9, &data), sum);
    }
}
