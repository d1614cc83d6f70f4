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

    /// A tag of the secret for the socket's name: FNV-1a, so the name says
    /// which job it is without carrying the secret itself (abstract socket
    /// names are listed in /proc/net/unix for every user).
    pub(crate) fn name_tag(&self) -> u64 {
        self.0.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }
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
}
