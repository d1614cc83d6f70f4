//! Parsers for the text of sysfs PCI attributes. No I/O: each takes the file's
//! text and returns a typed value; the I/O layer adds the path to errors.

use serde::Serialize;

use super::link::LinkSpeed;

/// Why a sysfs attribute's text could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("expected {expected}, found {found:?}")]
    Unexpected {
        expected: &'static str,
        found: String,
    },
}

fn unexpected(expected: &'static str, found: &str) -> ParseError {
    ParseError::Unexpected {
        expected,
        found: found.to_string(),
    }
}

/// `current_link_speed` / `max_link_speed`: "16.0 GT/s PCIe" (kernels since
/// 5.x), "8 GT/s" (older kernels). "Unknown" and the older "Unknown speed"
/// mean the kernel could not tell: `None`.
pub fn parse_link_speed(text: &str) -> Result<Option<LinkSpeed>, ParseError> {
    const EXPECTED: &str = "a link speed like \"16.0 GT/s PCIe\" or \"8 GT/s\"";
    let text = text.trim();
    if text.starts_with("Unknown") {
        return Ok(None);
    }
    let number = text
        .strip_suffix(" PCIe")
        .unwrap_or(text)
        .strip_suffix(" GT/s")
        .ok_or_else(|| unexpected(EXPECTED, text))?;
    let speed = match number {
        "2.5" => LinkSpeed::Gt2_5,
        "5" | "5.0" => LinkSpeed::Gt5,
        "8" | "8.0" => LinkSpeed::Gt8,
        "16" | "16.0" => LinkSpeed::Gt16,
        "32" | "32.0" => LinkSpeed::Gt32,
        "64" | "64.0" => LinkSpeed::Gt64,
        _ => return Err(unexpected(EXPECTED, text)),
    };
    Ok(Some(speed))
}

/// `current_link_width` / `max_link_width`: "16" (what the kernel prints) or
/// "x16". Width 0 (link down) is kept: it is below any capability.
pub fn parse_link_width(text: &str) -> Result<u8, ParseError> {
    let text = text.trim();
    let digits = text.strip_prefix('x').unwrap_or(text);
    match digits.parse::<u8>() {
        Ok(width) if width <= 32 => Ok(width),
        _ => Err(unexpected("a link width like \"16\" or \"x16\"", text)),
    }
}

/// `class`: "0x030200" (class, subclass, programming interface).
pub fn parse_class(text: &str) -> Result<u32, ParseError> {
    let text = text.trim();
    text.strip_prefix("0x")
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .filter(|class| *class <= 0xff_ffff)
        .ok_or_else(|| unexpected("a class code like \"0x030200\"", text))
}

/// `vendor`, `device`: "0x10de".
pub fn parse_id(text: &str) -> Result<u16, ParseError> {
    let text = text.trim();
    text.strip_prefix("0x")
        .and_then(|hex| u16::from_str_radix(hex, 16).ok())
        .ok_or_else(|| unexpected("an id like \"0x10de\"", text))
}

/// `numa_node`: "-1" when the firmware gives no affinity: `None`.
pub fn parse_numa_node(text: &str) -> Result<Option<u32>, ParseError> {
    let text = text.trim();
    match text.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(node) if (0..=i64::from(u16::MAX)).contains(&node) => Ok(Some(node as u32)),
        _ => Err(unexpected("a NUMA node number or -1", text)),
    }
}

/// `local_cpulist`: "0-31,64-95". Checked for shape and kept as text.
pub fn parse_cpu_list(text: &str) -> Result<String, ParseError> {
    let text = text.trim();
    let well_formed = text.split(',').all(|range| {
        let mut ends = range.splitn(2, '-');
        ends.all(|end| !end.is_empty() && end.bytes().all(|b| b.is_ascii_digit()))
    });
    if text.is_empty() || !well_formed {
        return Err(unexpected("a CPU list like \"0-31,64-95\"", text));
    }
    Ok(text.to_string())
}

/// One file of AER counters (`aer_dev_correctable`, `aer_dev_nonfatal`,
/// `aer_dev_fatal`): one "Name count" line per error type, then the total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AerCounterFile {
    /// The error types with a non-zero count, in the kernel's order (zero
    /// counts, the usual case, are not kept).
    pub nonzero_counts: Vec<(String, u64)>,
    /// The TOTAL_ERR_* line.
    pub total: u64,
}

/// Parses an `aer_dev_*` file; its last line must be `TOTAL_ERR_*`.
pub fn parse_aer_counters(text: &str) -> Result<AerCounterFile, ParseError> {
    const EXPECTED: &str = "lines \"Name count\" ending with TOTAL_ERR_*";
    let mut nonzero_counts = Vec::new();
    let mut total = None;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if total.is_some() {
            return Err(unexpected(EXPECTED, line));
        }
        let mut fields = line.split_whitespace();
        let (Some(name), Some(count), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(unexpected(EXPECTED, line));
        };
        let count = count
            .parse::<u64>()
            .map_err(|_| unexpected(EXPECTED, line))?;
        if name.starts_with("TOTAL_ERR_") {
            total = Some(count);
        } else if count > 0 {
            nonzero_counts.push((name.to_string(), count));
        }
    }
    let total = total.ok_or_else(|| unexpected(EXPECTED, text.trim()))?;
    Ok(AerCounterFile {
        nonzero_counts,
        total,
    })
}

/// `aer_rootport_total_err_cor` and friends: one decimal count.
pub fn parse_count(text: &str) -> Result<u64, ParseError> {
    let text = text.trim();
    text.parse()
        .map_err(|_| unexpected("a decimal count", text))
}

/// A memory or I/O BAR from the `resource` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bar {
    /// BAR number, 0 to 5.
    pub index: u8,
    pub size_bytes: u64,
    pub is_memory: bool,
    pub is_64bit: bool,
    pub prefetchable: bool,
}

// IORESOURCE_* flags of include/linux/ioport.h, as printed in `resource`.
const IORESOURCE_MEM: u64 = 0x0000_0200;
const IORESOURCE_PREFETCH: u64 = 0x0000_2000;
const IORESOURCE_MEM_64: u64 = 0x0010_0000;

/// `resource`: one "0xstart 0xend 0xflags" line per resource; the first six
/// are the BARs. Unassigned BARs (all zero) are left out.
pub fn parse_resource(text: &str) -> Result<Vec<Bar>, ParseError> {
    const EXPECTED: &str = "lines \"0xstart 0xend 0xflags\"";
    let mut bars = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace().map(|field| {
            field
                .strip_prefix("0x")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        });
        let (Some(Some(start)), Some(Some(end)), Some(Some(flags)), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(unexpected(EXPECTED, line));
        };
        if index >= 6 || (start == 0 && end == 0) {
            continue;
        }
        if end < start {
            return Err(unexpected(EXPECTED, line));
        }
        bars.push(Bar {
            index: index as u8,
            size_bytes: end - start + 1,
            is_memory: flags & IORESOURCE_MEM != 0,
            is_64bit: flags & IORESOURCE_MEM_64 != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
        });
    }
    Ok(bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speed_in_both_kernel_formats() {
        assert_eq!(
            parse_link_speed("16.0 GT/s PCIe\n"),
            Ok(Some(LinkSpeed::Gt16))
        );
        assert_eq!(
            parse_link_speed("2.5 GT/s PCIe\n"),
            Ok(Some(LinkSpeed::Gt2_5))
        );
        assert_eq!(parse_link_speed("8 GT/s\n"), Ok(Some(LinkSpeed::Gt8)));
        assert_eq!(parse_link_speed("5 GT/s\n"), Ok(Some(LinkSpeed::Gt5)));
        assert_eq!(
            parse_link_speed("64.0 GT/s PCIe"),
            Ok(Some(LinkSpeed::Gt64))
        );
        assert_eq!(parse_link_speed("Unknown\n"), Ok(None));
        assert_eq!(parse_link_speed("Unknown speed\n"), Ok(None));
        assert!(parse_link_speed("fast").is_err());
        assert!(parse_link_speed("12 GT/s").is_err());
    }

    #[test]
    fn link_width_with_and_without_x() {
        assert_eq!(parse_link_width("16\n"), Ok(16));
        assert_eq!(parse_link_width("x8"), Ok(8));
        assert_eq!(parse_link_width("0\n"), Ok(0));
        assert!(parse_link_width("wide").is_err());
        assert!(parse_link_width("64").is_err());
    }

    #[test]
    fn ids_class_numa_cpus() {
        assert_eq!(parse_class("0x030200\n"), Ok(0x030200));
        assert!(parse_class("030200").is_err());
        assert_eq!(parse_id("0x10de\n"), Ok(0x10de));
        assert!(parse_id("0x10de0").is_err());
        assert_eq!(parse_numa_node("-1\n"), Ok(None));
        assert_eq!(parse_numa_node("1\n"), Ok(Some(1)));
        assert!(parse_numa_node("-2").is_err());
        assert_eq!(parse_cpu_list("0-31,64-95\n"), Ok("0-31,64-95".to_string()));
        assert_eq!(parse_cpu_list("3"), Ok("3".to_string()));
        assert!(parse_cpu_list("0-").is_err());
    }

    #[test]
    fn aer_counter_file() {
        let text = "RxErr 12\nBadTLP 3\nBadDLLP 0\nRollover 0\nTimeout 1\nNonFatalErr 0\n\
                    CorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 16\n";
        let parsed = parse_aer_counters(text).unwrap();
        assert_eq!(parsed.total, 16);
        assert_eq!(
            parsed.nonzero_counts,
            [
                ("RxErr".to_string(), 12),
                ("BadTLP".to_string(), 3),
                ("Timeout".to_string(), 1)
            ]
        );
        assert!(parse_aer_counters("RxErr 1\n").is_err(), "no total line");
        assert!(parse_aer_counters("RxErr x\nTOTAL_ERR_COR 0\n").is_err());
        assert!(parse_aer_counters("TOTAL_ERR_COR 0\nRxErr 1\n").is_err());
        assert_eq!(parse_count("42\n"), Ok(42));
    }

    #[test]
    fn resource_bars() {
        let text = "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n\
                    0x0000382000000000 0x0000382fffffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000383000000000 0x0000383001ffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x000000000000e000 0x000000000000e07f 0x0000000000040101\n\
                    0x00000000fb000000 0x00000000fb07ffff 0x0000000000046200\n";
        let bars = parse_resource(text).unwrap();
        assert_eq!(bars.len(), 4);
        assert_eq!(bars[0].size_bytes, 16 << 20);
        assert!(bars[0].is_memory && !bars[0].prefetchable && !bars[0].is_64bit);
        assert_eq!(bars[1].index, 1);
        assert_eq!(bars[1].size_bytes, 64 << 30);
        assert!(bars[1].prefetchable && bars[1].is_64bit);
        assert_eq!(bars[3].index, 5);
        assert!(!bars[3].is_memory);
        assert!(parse_resource("0x0 0x1\n").is_err());
    }
}
