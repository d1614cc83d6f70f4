//! The rendezvous's messages: a joiner's hello, rank 0's welcome or
//! refusal. Little-endian words; every length is fixed or follows from the
//! rank count both sides already agree on.

use super::super::WindowSizes;

pub(super) const MAGIC: u32 = 0x5043_4945; // "PCIE"
/// 2: the hello carries the job's secret and no pid (rank 0 takes pids
/// from the kernel). 3: the welcome carries the backend area's size.
pub(super) const VERSION: u32 = 3;
pub(super) const HELLO_BYTES: usize = 32;
/// Bytes of a welcome before its pids, and of a refusal.
pub(super) const WELCOME_HEAD_BYTES: usize = 48;
pub(super) const REFUSAL_BYTES: usize = 24;

pub(super) const WELCOME_OK: u32 = 0;
pub(super) const REFUSED_NEVER_JOINED: u32 = 1;
pub(super) const REFUSED_DUPLICATE: u32 = 2;
pub(super) const REFUSED_RANK_COUNT: u32 = 3;
pub(super) const REFUSED_HOST_FAILED: u32 = 4;
pub(super) const REFUSED_SECRET: u32 = 5;

/// Who a joiner says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) rank: usize,
    pub(super) nranks: usize,
    /// The job's secret, zeros without one.
    pub(super) secret: [u8; 16],
}

fn put_u32(bytes: &mut Vec<u8>, value: u32) {
    bytes.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut Vec<u8>, value: u64) {
    bytes.extend_from_slice(&value.to_le_bytes());
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HELLO_BYTES);
        for word in [MAGIC, VERSION, self.rank as u32, self.nranks as u32] {
            put_u32(&mut bytes, word);
        }
        bytes.extend_from_slice(&self.secret);
        bytes
    }

    /// `None` for anything but a hello of this version.
    pub(super) fn decode(bytes: &[u8]) -> Option<Hello> {
        if bytes.len() != HELLO_BYTES || u32_at(bytes, 0) != MAGIC || u32_at(bytes, 4) != VERSION {
            return None;
        }
        Some(Hello {
            rank: u32_at(bytes, 8) as usize,
            nranks: u32_at(bytes, 12) as usize,
            secret: bytes[16..32].try_into().expect("16 bytes"),
        })
    }
}

pub(super) fn welcome(sizes: WindowSizes, pids: &[u32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(WELCOME_HEAD_BYTES + 4 * pids.len());
    put_u32(&mut bytes, MAGIC);
    put_u32(&mut bytes, WELCOME_OK);
    for size in [
        sizes.slot_bytes,
        sizes.raw_slots,
        sizes.relay_slots,
        sizes.one_shot_bytes,
        sizes.backend_bytes,
    ] {
        put_u64(&mut bytes, size as u64);
    }
    for pid in pids {
        put_u32(&mut bytes, *pid);
    }
    bytes
}

/// The window sizes and pids of a whole welcome for `nranks` ranks; any
/// u64 is taken as it is, for the caller to check.
pub(super) fn welcome_contents(bytes: &[u8], nranks: usize) -> (WindowSizes, Vec<u32>) {
    let size = |at: usize| usize::try_from(u64_at(bytes, at)).unwrap_or(usize::MAX);
    let sizes = WindowSizes {
        slot_bytes: size(8),
        raw_slots: size(16),
        relay_slots: size(24),
        one_shot_bytes: size(32),
        backend_bytes: size(40),
    };
    let pids = (0..nranks)
        .map(|peer| u32_at(bytes, WELCOME_HEAD_BYTES + 4 * peer))
        .collect();
    (sizes, pids)
}

pub(super) fn refusal(reason: u32, rank: usize, detail: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(REFUSAL_BYTES);
    put_u32(&mut bytes, MAGIC);
    put_u32(&mut bytes, reason);
    put_u64(&mut bytes, rank as u64);
    put_u64(&mut bytes, detail);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_round_trip_and_foreign_bytes_are_not_hellos() {
        let hello = Hello {
            rank: 3,
            nranks: 8,
            secret: [7; 16],
        };
        assert_eq!(Hello::decode(&hello.encode()), Some(hello));
        let mut old = hello.encode();
        old[4] = 1;
        assert_eq!(Hello::decode(&old), None);
        assert_eq!(Hello::decode(&hello.encode()[..20]), None);
        assert_eq!(Hello::decode(&[0u8; HELLO_BYTES]), None);
    }
}
