//! NVLink between GPUs from NVML's answers. No I/O: `NvmlAnswers` is what
//! NVML said (read live by `probe::nvml`, or from a fixture file in the same
//! format), and this module turns it into each GPU's active links and the
//! NVLink connection of each GPU pair, named as `nvidia-smi topo -m` names
//! it (`NV18`: a bonded set of 18 links).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::bdf::Bdf;

/// An NVML return code (`nvmlReturn_t`), kept as NVML numbers it so that
/// fixtures record exactly what a machine answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NvmlReturn(pub u32);

impl NvmlReturn {
    pub const INVALID_ARGUMENT: NvmlReturn = NvmlReturn(2);
    pub const NOT_SUPPORTED: NvmlReturn = NvmlReturn(3);

    /// The name of the code in nvml.h, without its `NVML_ERROR_` prefix.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "SUCCESS",
            1 => "UNINITIALIZED",
            2 => "INVALID_ARGUMENT",
            3 => "NOT_SUPPORTED",
            4 => "NO_PERMISSION",
            6 => "NOT_FOUND",
            9 => "DRIVER_NOT_LOADED",
            12 => "LIBRARY_NOT_FOUND",
            13 => "FUNCTION_NOT_FOUND",
            15 => "GPU_IS_LOST",
            17 => "OPERATING_SYSTEM",
            18 => "LIB_RM_VERSION_MISMATCH",
            _ => "UNKNOWN",
        }
    }
}

impl fmt::Display for NvmlReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NVML error {} ({})", self.0, self.name())
    }
}

/// One NVML call's answer: its value, or the code it returned instead.
/// In JSON `{"ok": value}` or `{"error": code}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer<T> {
    Ok(T),
    Error(NvmlReturn),
}

impl<T> Answer<T> {
    pub fn ok(&self) -> Option<&T> {
        match self {
            Answer::Ok(value) => Some(value),
            Answer::Error(_) => None,
        }
    }
}

/// NVML's answers for one link of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlLinkAnswers {
    pub link: u32,
    /// `nvmlDeviceGetNvLinkState`: active or not.
    pub state: Answer<bool>,
    /// `nvmlDeviceGetNvLinkVersion`, as NVML encodes it (`nvmlNvlinkVersion_t`).
    pub version: Answer<u32>,
    /// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: `busId` of the other end.
    pub remote_pci_bus_id: Answer<String>,
    /// `nvmlDeviceGetNvLinkRemoteDeviceType` (`nvmlIntNvLinkDeviceType_t`).
    pub remote_device_type: Answer<u32>,
    /// `nvmlDeviceGetNvLinkErrorCounter`, one answer per counter in
    /// `NVLINK_ERROR_COUNTERS` order; empty in captures made before pcieipc
    /// asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_counters: Vec<Answer<u64>>,
}

/// The NVLink error counters NVML keeps per link, named as the metrics name
/// them, in `nvmlNvLinkErrorCounter_t` order: data link transmit replays and
/// recoveries, receive flit and data CRC errors, data ECC errors.
pub const NVLINK_ERROR_COUNTERS: [&str; 5] =
    ["replay", "recovery", "crc_flit", "crc_data", "ecc_data"];

/// NVML's answers for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlGpuAnswers {
    /// NVML's device index.
    pub index: u32,
    pub name: Answer<String>,
    /// `nvmlDeviceGetPciInfo_v3`'s `busId`, e.g. `00000000:00:06.0`.
    pub pci_bus_id: Answer<String>,
    pub links: Vec<NvmlLinkAnswers>,
}

/// Everything the probe asks NVML, as answered: the live reader fills it,
/// `pcieipc probe --capture-nvml` writes it, fixtures hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlAnswers {
    pub driver_version: Answer<String>,
    pub nvml_version: Answer<String>,
    pub gpus: Vec<NvmlGpuAnswers>,
}

/// `nvmlIntNvLinkDeviceType_t` values.
const REMOTE_GPU: u32 = 0;
const REMOTE_IBM_NPU: u32 = 1;
const REMOTE_SWITCH: u32 = 2;

/// What the far end of an NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "bdf")]
pub enum NvlinkRemote {
    Gpu(Bdf),
    /// An NVSwitch: every GPU on the same switches is reached through it.
    Switch(Bdf),
    /// An IBM POWER NPU (the CPU).
    Npu(Bdf),
    /// NVML named no type and the bus id is not one of its GPUs'.
    Unknown(Option<Bdf>),
}

/// NVLink generation from NVML's `nvmlNvlinkVersion_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum NvlinkVersion {
    #[serde(rename = "1.0")]
    V1_0,
    #[serde(rename = "2.0")]
    V2_0,
    #[serde(rename = "2.2")]
    V2_2,
    #[serde(rename = "3.0")]
    V3_0,
    #[serde(rename = "3.1")]
    V3_1,
    #[serde(rename = "4.0")]
    V4_0,
    #[serde(rename = "5.0")]
    V5_0,
}

impl NvlinkVersion {
    pub fn from_nvml(code: u32) -> Option<NvlinkVersion> {
        Some(match code {
            1 => NvlinkVersion::V1_0,
            2 => NvlinkVersion::V2_0,
            3 => NvlinkVersion::V2_2,
            4 => NvlinkVersion::V3_0,
            5 => NvlinkVersion::V3_1,
            6 => NvlinkVersion::V4_0,
            7 => NvlinkVersion::V5_0,
            _ => return None,
        })
    }

    /// Data bandwidth of one link per direction, in GB/s, by NVIDIA's
    /// published figures: 20 (P100), 25 (V100 to H100/H200), 50 (B200).
    pub fn link_gigabytes_per_second(self) -> f64 {
        match self {
            NvlinkVersion::V1_0 => 20.0,
            NvlinkVersion::V2_0
            | NvlinkVersion::V2_2
            | NvlinkVersion::V3_0
            | NvlinkVersion::V3_1
            | NvlinkVersion::V4_0 => 25.0,
            NvlinkVersion::V5_0 => 50.0,
        }
    }
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ActiveNvlink {
    pub link: u32,
    /// `None` when NVML did not say or named an unknown version.
    pub version: Option<NvlinkVersion>,
    pub remote: NvlinkRemote,
    /// Per direction; `None` with an unknown version.
    pub bandwidth_gbps: Option<f64>,
}

/// What NVML said of one GPU's NVLinks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum GpuNvlinkState {
    /// The state query answered for at least one link.
    Read { active: Vec<ActiveNvlink> },
    /// Every link's state query returned NOT_SUPPORTED (a GPU without NVLink,
    /// or a VM that does not pass NVLink through).
    NotSupported,
    /// The state queries failed otherwise: the first code.
    Failed { code: NvmlReturn },
}

/// The NVLink view of the machine that the probe reports and the planner uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nvlinks {
    pub status: NvlinkStatus,
    pub driver_version: Option<String>,
    /// By the GPUs' PCI addresses.
    pub gpus: BTreeMap<Bdf, GpuNvlinkState>,
}

/// One-line summary of what is known of NVLink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum NvlinkStatus {
    /// NVML was not asked (a copied sysfs tree without NVML answers).
    NotRead,
    /// NVML could not be used: the reason.
    Unavailable(String),
    /// NVML answered but no GPU's NVLink queries are supported.
    NotSupported,
    /// Supported, but no link is active.
    NoActiveLinks,
    Active,
}

impl NvlinkStatus {
    /// The probe's one line about NVLink.
    pub fn describe(&self) -> String {
        match self {
            NvlinkStatus::NotRead => {
                "not read (a copied sysfs tree: give its NVML answers with --nvml-fixture)".into()
            }
            NvlinkStatus::Unavailable(reason) => format!("NVML not available: {reason}"),
            NvlinkStatus::NotSupported => "not supported by this GPU/driver".into(),
            NvlinkStatus::NoActiveLinks => "no active links".into(),
            NvlinkStatus::Active => "active".into(),
        }
    }
}

/// The NVLink connection between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NvlinkConnection {
    /// Links bonded between the pair: direct links, or through NVSwitches
    /// the lower of the two GPUs' switch links (as nvidia-smi counts them).
    pub links: u32,
    pub through_switch: bool,
    /// The older of the two ends' versions.
    pub version: Option<NvlinkVersion>,
    /// Per direction: links × per-link bandwidth; `None` with an unknown version.
    pub bandwidth_gbps: Option<f64>,
}

impl NvlinkConnection {
    /// As `nvidia-smi topo -m` prints it: `NV18`.
    pub fn label(&self) -> String {
        format!("NV{}", self.links)
    }

    /// NVLink hops: one direct, two through a switch.
    pub fn hops(&self) -> usize {
        if self.through_switch {
            2
        } else {
            1
        }
    }
}

impl Nvlinks {
    /// Nothing known, for the stated reason.
    pub fn without(status: NvlinkStatus) -> Nvlinks {
        Nvlinks {
            status,
            driver_version: None,
            gpus: BTreeMap::new(),
        }
    }

    /// Decodes NVML's answers. A GPU or remote whose bus id does not parse
    /// is left out: NVML's bus ids are the PCI addresses sysfs uses.
    pub fn from_answers(answers: &NvmlAnswers) -> Nvlinks {
        let gpu_bdfs: Vec<Bdf> = answers
            .gpus
            .iter()
            .filter_map(|gpu| gpu.pci_bus_id.ok()?.parse().ok())
            .collect();
        let mut gpus = BTreeMap::new();
        for gpu in &answers.gpus {
            let Some(bdf) = gpu.pci_bus_id.ok().and_then(|id| id.parse::<Bdf>().ok()) else {
                continue;
            };
            gpus.insert(bdf, gpu_state(gpu, &gpu_bdfs));
        }
        let states = || gpus.values();
        let status = if states()
            .any(|state| matches!(state, GpuNvlinkState::Read { active } if !active.is_empty()))
        {
            NvlinkStatus::Active
        } else if states().any(|state| matches!(state, GpuNvlinkState::Read { .. })) {
            NvlinkStatus::NoActiveLinks
        } else if let Some(code) = states().find_map(|state| match state {
            GpuNvlinkState::Failed { code } => Some(*code),
            _ => None,
        }) {
            NvlinkStatus::Unavailable(format!("the NVLink state queries returned {code}"))
        } else {
            NvlinkStatus::NotSupported
        };
        Nvlinks {
            status,
            driver_version: answers.driver_version.ok().cloned(),
            gpus,
        }
    }

    /// The active links of a GPU (empty when none or unknown).
    pub fn active(&self, gpu: Bdf) -> &[ActiveNvlink] {
        match self.gpus.get(&gpu) {
            Some(GpuNvlinkState::Read { active }) => active,
            _ => &[],
        }
    }

    /// The NVLink connection between two GPUs: their direct links, else
    /// their links to NVSwitches; `None` when they share neither.
    pub fn connection(&self, a: Bdf, b: Bdf) -> Option<NvlinkConnection> {
        let direct: Vec<&ActiveNvlink> = self
            .active(a)
            .iter()
            .filter(|link| link.remote == NvlinkRemote::Gpu(b))
            .collect();
        if !direct.is_empty() {
            return Some(connection(&direct, false));
        }
        let switch_links = |gpu: Bdf| -> Vec<&ActiveNvlink> {
            self.active(gpu)
                .iter()
                .filter(|link| matches!(link.remote, NvlinkRemote::Switch(_)))
                .collect()
        };
        let (from_a, from_b) = (switch_links(a), switch_links(b));
        if from_a.is_empty() || from_b.is_empty() {
            return None;
        }
        let fewer = if from_a.len() <= from_b.len() {
            from_a
        } else {
            from_b
        };
        Some(connection(&fewer, true))
    }

    /// Whether a GPU has an active NVLink to another GPU or a switch: its
    /// ring traffic can then leave it over NVLink rather than PCIe.
    pub fn reaches_peers(&self, gpu: Bdf) -> bool {
        self.active(gpu)
            .iter()
            .any(|link| matches!(link.remote, NvlinkRemote::Gpu(_) | NvlinkRemote::Switch(_)))
    }
}

fn connection(links: &[&ActiveNvlink], through_switch: bool) -> NvlinkConnection {
    let version = links.iter().map(|link| link.version).min().flatten();
    let bandwidth_gbps = links
        .iter()
        .map(|link| link.bandwidth_gbps)
        .sum::<Option<f64>>();
    NvlinkConnection {
        links: links.len() as u32,
        through_switch,
        version,
        bandwidth_gbps,
    }
}

fn gpu_state(gpu: &NvmlGpuAnswers, gpu_bdfs: &[Bdf]) -> GpuNvlinkState {
    let mut active = Vec::new();
    let mut answered = false;
    let mut failure = None;
    for link in &gpu.links {
        match link.state {
            Answer::Ok(is_active) => {
                answered = true;
                if is_active {
                    active.push(active_link(link, gpu_bdfs));
                }
            }
            // Links past the GPU's count answer INVALID_ARGUMENT: not a failure.
            Answer::Error(NvmlReturn::NOT_SUPPORTED | NvmlReturn::INVALID_ARGUMENT) => {}
            Answer::Error(code) => {
                failure.get_or_insert(code);
            }
        }
    }
    match (answered, failure) {
        (true, _) => GpuNvlinkState::Read { active },
        (false, Some(code)) => GpuNvlinkState::Failed { code },
        (false, None) => GpuNvlinkState::NotSupported,
    }
}

fn active_link(link: &NvmlLinkAnswers, gpu_bdfs: &[Bdf]) -> ActiveNvlink {
    let version = link
        .version
        .ok()
        .and_then(|&code| NvlinkVersion::from_nvml(code));
    let remote_bdf = link
        .remote_pci_bus_id
        .ok()
        .and_then(|id| id.parse::<Bdf>().ok());
    let remote = match (link.remote_device_type.ok(), remote_bdf) {
        (Some(&REMOTE_GPU), Some(bdf)) => NvlinkRemote::Gpu(bdf),
        (Some(&REMOTE_SWITCH), Some(bdf)) => NvlinkRemote::Switch(bdf),
        (Some(&REMOTE_IBM_NPU), Some(bdf)) => NvlinkRemote::Npu(bdf),
        // Drivers without the type query: a bus id of one of NVML's GPUs is a GPU.
        (None, Some(bdf)) if gpu_bdfs.contains(&bdf) => NvlinkRemote::Gpu(bdf),
        (_, bdf) => NvlinkRemote::Unknown(bdf),
    };
    ActiveNvlink {
        link: link.link,
        version,
        remote,
        bandwidth_gbps: version.map(NvlinkVersion::link_gigabytes_per_second),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(number: u32, remote: &str, remote_type: u32) -> NvmlLinkAnswers {
        NvmlLinkAnswers {
            link: number,
            state: Answer::Ok(true),
            version: Answer::Ok(6),
            remote_pci_bus_id: Answer::Ok(remote.to_string()),
            remote_device_type: Answer::Ok(remote_type),
            error_counters: Vec::new(),
        }
    }

    fn not_supported(number: u32) -> NvmlLinkAnswers {
        NvmlLinkAnswers {
            link: number,
            state: Answer::Error(NvmlReturn::NOT_SUPPORTED),
            version: Answer::Error(NvmlReturn::NOT_SUPPORTED),
            remote_pci_bus_id: Answer::Error(NvmlReturn::NOT_SUPPORTED),
            remote_device_type: Answer::Error(NvmlReturn::NOT_SUPPORTED),
            error_counters: Vec::new(),
        }
    }

    fn gpu(index: u32, bus_id: &str, links: Vec<NvmlLinkAnswers>) -> NvmlGpuAnswers {
        NvmlGpuAnswers {
            index,
            name: Answer::Ok("NVIDIA H200".to_string()),
            pci_bus_id: Answer::Ok(bus_id.to_string()),
            links,
        }
    }

    fn answers(gpus: Vec<NvmlGpuAnswers>) -> NvmlAnswers {
        NvmlAnswers {
            driver_version: Answer::Ok("580.159.04".to_string()),
            nvml_version: Answer::Ok("13.580.159.04".to_string()),
            gpus,
        }
    }

    fn bdf(text: &str) -> Bdf {
        text.parse().unwrap()
    }

    #[test]
    fn direct_links_bond_into_nv_n() {
        let a = "00000000:00:06.0";
        let b = "00000000:00:07.0";
        let nvlinks = Nvlinks::from_answers(&answers(vec![
            gpu(0, a, (0..18).map(|n| link(n, b, REMOTE_GPU)).collect()),
            gpu(1, b, (0..18).map(|n| link(n, a, REMOTE_GPU)).collect()),
        ]));
        assert_eq!(nvlinks.status, NvlinkStatus::Active);
        let pair = nvlinks.connection(bdf(a), bdf(b)).unwrap();
        assert_eq!(pair.label(), "NV18");
        assert_eq!(pair.version, Some(NvlinkVersion::V4_0));
        assert_eq!(pair.bandwidth_gbps, Some(450.0));
        assert_eq!((pair.through_switch, pair.hops()), (false, 1));
        assert!(nvlinks.reaches_peers(bdf(a)));
    }

    #[test]
    fn switch_links_connect_every_pair_on_the_switches() {
        let switch = "00000000:c5:00.0";
        let gpus = ["00000000:05:00.0", "00000000:06:00.0"];
        let nvlinks = Nvlinks::from_answers(&answers(vec![
            gpu(
                0,
                gpus[0],
                (0..18).map(|n| link(n, switch, REMOTE_SWITCH)).collect(),
            ),
            // One link down on the second GPU: 17 bonded.
            gpu(
                1,
                gpus[1],
                (0..17).map(|n| link(n, switch, REMOTE_SWITCH)).collect(),
            ),
        ]));
        let pair = nvlinks.connection(bdf(gpus[0]), bdf(gpus[1])).unwrap();
        assert_eq!(
            (pair.label(), pair.through_switch),
            ("NV17".to_string(), true)
        );
        assert_eq!(pair.bandwidth_gbps, Some(425.0));
    }

    #[test]
    fn remote_type_unanswered_falls_back_to_nvml_gpu_list() {
        let a = "00000000:00:06.0";
        let b = "00000000:00:07.0";
        let mut first = link(0, b, REMOTE_GPU);
        first.remote_device_type = Answer::Error(NvmlReturn(13));
        let mut second = link(1, "00000000:99:00.0", REMOTE_GPU);
        second.remote_device_type = Answer::Error(NvmlReturn(13));
        let nvlinks = Nvlinks::from_answers(&answers(vec![
            gpu(0, a, vec![first, second]),
            gpu(1, b, vec![]),
        ]));
        let remotes: Vec<NvlinkRemote> = nvlinks.active(bdf(a)).iter().map(|l| l.remote).collect();
        assert_eq!(
            remotes,
            [
                NvlinkRemote::Gpu(bdf(b)),
                NvlinkRemote::Unknown(Some(bdf("0000:99:00.0")))
            ]
        );
    }

    #[test]
    fn all_not_supported_is_said_once() {
        let nvlinks = Nvlinks::from_answers(&answers(vec![gpu(
            0,
            "00000000:00:06.0",
            (0..18).map(not_supported).collect(),
        )]));
        assert_eq!(nvlinks.status, NvlinkStatus::NotSupported);
        assert_eq!(
            nvlinks.status.describe(),
            "not supported by this GPU/driver"
        );
        assert_eq!(
            nvlinks.gpus[&bdf("0000:00:06.0")],
            GpuNvlinkState::NotSupported
        );
        assert!(nvlinks.active(bdf("0000:00:06.0")).is_empty());
    }

    #[test]
    fn inactive_links_and_other_failures() {
        let mut down = link(0, "00000000:00:07.0", REMOTE_GPU);
        down.state = Answer::Ok(false);
        let inactive =
            Nvlinks::from_answers(&answers(vec![gpu(0, "00000000:00:06.0", vec![down])]));
        assert_eq!(inactive.status, NvlinkStatus::NoActiveLinks);
        let mut lost = not_supported(0);
        lost.state = Answer::Error(NvmlReturn(15));
        let failed = Nvlinks::from_answers(&answers(vec![gpu(0, "00000000:00:06.0", vec![lost])]));
        assert_eq!(
            failed.status,
            NvlinkStatus::Unavailable(
                "the NVLink state queries returned NVML error 15 (GPU_IS_LOST)".to_string()
            )
        );
    }

    #[test]
    fn versions_give_per_link_bandwidth() {
        assert_eq!(NvlinkVersion::from_nvml(6), Some(NvlinkVersion::V4_0));
        assert_eq!(NvlinkVersion::from_nvml(0), None);
        assert_eq!(NvlinkVersion::V1_0.link_gigabytes_per_second(), 20.0);
        assert_eq!(NvlinkVersion::V4_0.link_gigabytes_per_second(), 25.0);
        assert_eq!(NvlinkVersion::V5_0.link_gigabytes_per_second(), 50.0);
    }

    #[test]
    fn answers_round_trip_through_json() {
        let recorded = answers(vec![gpu(0, "00000000:00:06.0", vec![not_supported(0)])]);
        let text = serde_json::to_string(&recorded).unwrap();
        assert!(text.contains(r#""state":{"error":3}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<NvmlAnswers>(&text).unwrap(),
            recorded
        );
    }
}
