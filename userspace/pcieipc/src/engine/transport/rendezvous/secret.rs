//! A job's secret: the launcher makes one and hands it to every rank
//! (`PCIEIPC_JOB_SECRET`, or a file only the user can read); the rendezvous
//! admits only ranks that present it. It also goes into the socket's name,
//! so jobs that share a name but not a secret never meet.

use std::fmt;

/// 128 random bits, shown as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JobSecret([u8; 16]);

/// Text that is not 32 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("a job secret is 32 hex digits ({SECRET_ENV}), got {length} characters that are not")]
pub struct BadSecret {
    length: usize,
}

/// The environment variable a launcher hands the secret in.
pub const SECRET_ENV: &str = "PCIEIPC_JOB_SECRET";

impl JobSecret {
    /// A new secret from the kernel's random source.
    pub fn generate() -> std::io::Result<JobSecret> {
        let mut bytes = [0u8; 16];
        let mut filled = 0;
        while filled < bytes.len() {
            // SAFETY: getrandom writes at most the given length into the
            // rest of `bytes`, which we hold mutably.
            let got = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
            };
            match got {
                ..0 if std::io::Error::last_os_error().kind()
                    == std::io::ErrorKind::Interrupted => {}
                ..0 => return Err(std::io::Error::last_os_error()),
                got => filled += got as usize,
            }
        }
        Ok(JobSecret(bytes))
    }

    /// The secret in `PCIEIPC_JOB_SECRET`, if it is set.
    pub fn from_env() -> Result<Option<JobSecret>, BadSecret> {
        match std::env::var(SECRET_ENV) {
            Ok(text) => text.parse().map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(text)) => Err(BadSecret { length: text.len() }),
        }
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    pub(crate) fn bytes(&self) -> [u8; 16] {
        self.0
    }

    /// A tag of the secret for the socket's name, so the name says which
    /// job it is without carrying the secret (abstract socket names are
    /// listed in /proc/net/unix for every user): the first 64 bits of
    /// SHA-256 over a label and the secret. Finding a secret with a given
    /// tag costs 2^64 hashes, and one found is the job's with odds of
    /// 2^-64; every rank, of any build, derives the same name.
    pub(crate) fn name_tag(&self) -> u64 {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"pcieipc rendezvous socket tag\0")
            .chain_update(self.0)
            .finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes"))
    }
}

/// Whether a presented secret is ours, in a time that does not depend on
/// where the two differ: all 16 bytes are compared whatever the first
/// difference, and `black_box` keeps the compiler from ending early.
pub(crate) fn same_bytes(ours: &[u8; 16], presented: &[u8; 16]) -> bool {
    let difference = ours
        .iter()
        .zip(presented)
        .fold(0u8, |difference, (a, b)| difference | (a ^ b));
    std::hint::black_box(difference) == 0
}

impl std::str::FromStr for JobSecret {
    type Err = BadSecret;
    fn from_str(text: &str) -> Result<JobSecret, BadSecret> {
        let bad = || BadSecret { length: text.len() };
        if text.len() != 32 || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(JobSecret(bytes))
    }
}

/// Never printed: a secret in a log is no secret.
impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_through_hex_and_differ() {
        let one = JobSecret::generate().unwrap();
        let two = JobSecret::generate().unwrap();
        assert_ne!(one, two);
        assert_eq!(one.to_hex().parse::<JobSecret>().unwrap(), one);
        assert_ne!(one.name_tag(), two.name_tag());
        assert_eq!(format!("{one:?}"), "JobSecret(..)");
        for bad in ["", "00", &"g".repeat(32), &"0".repeat(33), &"é".repeat(16)] {
            assert!(bad.parse::<JobSecret>().is_err(), "{bad:?}");
        }
    }

    /// The tag is SHA-256's, not a hash that can be run backwards: known
    /// answers computed apart (Python: hashlib.sha256(b"pcieipc rendezvous
    /// socket tag\0" + secret).hexdigest()[:16]).
    #[test]
    fn the_socket_tag_is_a_truncated_sha256_of_the_secret() {
        let answers = [
            ("00000000000000000000000000000000", 0xdd3b_f1ae_a2db_f878),
            ("000102030405060708090a0b0c0d0e0f", 0x5a11_2346_9633_397b),
        ];
        for (hex, tag) in answers {
            assert_eq!(hex.parse::<JobSecret>().unwrap().name_tag(), tag, "{hex}");
        }
    }

    #[test]
    fn a_secret_is_only_itself_in_every_byte_and_bit() {
        let secret: JobSecret = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
        assert!(same_bytes(&secret.bytes(), &secret.bytes()));
        for byte in 0..16 {
            for bit in 0..8 {
                let mut presented = secret.bytes();
                presented[byte] ^= 1 << bit;
                assert!(
                    !same_bytes(&secret.bytes(), &presented),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }
}
