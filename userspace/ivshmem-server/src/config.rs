//! The server's configuration and its validation: values only, no I/O.

use std::path::PathBuf;

use crate::Error;

/// Vectors per peer, as in QEMU's contrib/ivshmem-server (IVSHMEM_SERVER_MAX_VECTORS).
pub const MAX_VECTORS: u16 = 64;
/// Peer limit used by the binary when `--max-peers` is not given.
pub const DEFAULT_MAX_PEERS: u16 = 64;
/// Smallest shared memory accepted: QEMU maps the memfd into the guest, which needs whole pages.
pub const MIN_SHM_SIZE: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// UNIX socket QEMU's `-chardev socket,path=...` connects to.
    pub socket_path: PathBuf,
    /// Bytes of shared memory (BAR2 of every ivshmem-doorbell device); a power of two.
    pub shm_size: u64,
    /// Interrupt vectors (eventfds) per peer; match the device's `vectors=` property.
    pub vectors: u16,
    /// Peers served at once; peer ids are 0..max_peers, further connections are refused.
    pub max_peers: u16,
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), Error> {
        // QEMU's pci_register_bar asserts a power-of-two size and would abort the VM.
        if !self.shm_size.is_power_of_two() {
            return Err(Error::ShmSizeNotPowerOfTwo {
                size: self.shm_size,
            });
        }
        if self.shm_size < MIN_SHM_SIZE {
            return Err(Error::ShmSizeTooSmall {
                size: self.shm_size,
                min: MIN_SHM_SIZE,
            });
        }
        if self.vectors == 0 || self.vectors > MAX_VECTORS {
            return Err(Error::VectorCountOutOfRange {
                vectors: self.vectors,
                max: MAX_VECTORS,
            });
        }
        if self.max_peers == 0 {
            return Err(Error::MaxPeersZero);
        }
        Ok(())
    }
}

/// Parses a byte count such as `4096`, `64K`, `4M` or `1G` (binary multiples, either case),
/// the way QEMU's ivshmem-server `-l` option reads sizes.
pub fn parse_size(text: &str) -> Result<u64, Error> {
    let invalid = || Error::InvalidSizeText {
        text: text.to_owned(),
    };
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'k' | b'K') => (&text[..text.len() - 1], 10),
        Some(b'm' | b'M') => (&text[..text.len() - 1], 20),
        Some(b'g' | b'G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let count: u64 = digits.parse().map_err(|_| invalid())?;
    count.checked_mul(1 << shift).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(shm_size: u64, vectors: u16, max_peers: u16) -> ServerConfig {
        ServerConfig {
            socket_path: PathBuf::from("/run/ivshmem.sock"),
            shm_size,
            vectors,
            max_peers,
        }
    }

    #[test]
    fn parse_size_reads_plain_bytes_and_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65_536);
        assert_eq!(parse_size("4M").unwrap(), 4_194_304);
        assert_eq!(parse_size("4m").unwrap(), 4_194_304);
        assert_eq!(parse_size("1G").unwrap(), 1_073_741_824);
        assert_eq!(parse_size("2g").unwrap(), 2_147_483_648);
    }

    #[test]
    fn parse_size_rejects_malformed_text_naming_it() {
        for text in [
            "",
            "M",
            "4T",
            "-4M",
            "4 M",
            "1.5G",
            "0x10",
            "99999999999999999999G",
        ] {
            match parse_size(text) {
                Err(Error::InvalidSizeText { text: reported }) => assert_eq!(reported, text),
                other => panic!("{text:?}: expected InvalidSizeText, got {other:?}"),
            }
        }
    }

    #[test]
    fn parse_size_rejects_overflow() {
        assert!(matches!(
            parse_size("17179869184G"),
            Err(Error::InvalidSizeText { .. })
        ));
    }

    #[test]
    fn validate_accepts_a_power_of_two_size_and_sane_counts() {
        config(4 << 20, 4, 64).validate().unwrap();
        config(MIN_SHM_SIZE, MAX_VECTORS, 1).validate().unwrap();
    }

    #[test]
    fn validate_rejects_zero_and_non_power_of_two_sizes() {
        assert!(matches!(
            config(0, 1, 1).validate(),
            Err(Error::ShmSizeNotPowerOfTwo { size: 0 })
        ));
        assert!(matches!(
            config(3 << 20, 1, 1).validate(),
            Err(Error::ShmSizeNotPowerOfTwo { size: 3_145_728 })
        ));
    }

    #[test]
    fn validate_rejects_sizes_below_a_page() {
        assert!(matches!(
            config(2048, 1, 1).validate(),
            Err(Error::ShmSizeTooSmall {
                size: 2048,
                min: 4096
            })
        ));
    }

    #[test]
    fn validate_rejects_vector_counts_outside_one_to_max() {
        assert!(matches!(
            config(4096, 0, 1).validate(),
            Err(Error::VectorCountOutOfRange {
                vectors: 0,
                max: 64
            })
        ));
        assert!(matches!(
            config(4096, 65, 1).validate(),
            Err(Error::VectorCountOutOfRange {
                vectors: 65,
                max: 64
            })
        ));
    }

    #[test]
    fn validate_rejects_a_zero_peer_limit() {
        assert!(matches!(
            config(4096, 1, 0).validate(),
            Err(Error::MaxPeersZero)
        ));
    }
}
