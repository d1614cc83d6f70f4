//! Where NVML's answers come from: the NVIDIA driver's libnvidia-ml, opened at
//! run time (no build-time CUDA or NVML), or a JSON file of answers recorded
//! on another machine. `nvlink` decodes them; this is the only NVML I/O.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

use super::nvlink::{
    Answer, NvmlAnswers, NvmlGpuAnswers, NvmlLinkAnswers, NvmlReturn, NVLINK_ERROR_COUNTERS,
};

/// Why NVML's answers could not be had.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// No NVIDIA driver library on this machine.
    #[error("cannot open {library}")]
    Open {
        library: &'static str,
        source: libloading::Error,
    },
    /// The library lacks a function every NVML since CUDA 9 has.
    #[error("{library} has no {symbol}")]
    Symbol {
        library: &'static str,
        symbol: &'static str,
        source: libloading::Error,
    },
    /// A call without which nothing can be asked failed (no driver loaded, ...).
    #[error("{function} returned {code}")]
    Call {
        function: &'static str,
        code: NvmlReturn,
    },
    #[error("{path}: cannot read NVML answers")]
    ReadFixture {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a file of NVML answers")]
    FixtureFormat {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// What the probe asks NVML. Implemented by the driver's library and by
/// recorded answers, so that tests run the whole probe on a fixture.
pub trait NvlinkSource {
    fn answers(&self) -> Result<NvmlAnswers, NvmlError>;
}

/// NVML answers recorded in a JSON file (`pcieipc probe --capture-nvml`).
pub struct NvmlFixture {
    pub path: PathBuf,
}

impl NvlinkSource for NvmlFixture {
    fn answers(&self) -> Result<NvmlAnswers, NvmlError> {
        let text =
            std::fs::read_to_string(&self.path).map_err(|source| NvmlError::ReadFixture {
                path: self.path.clone(),
                source,
            })?;
        serde_json::from_str(&text).map_err(|source| NvmlError::FixtureFormat {
            path: self.path.clone(),
            source,
        })
    }
}

impl NvmlFixture {
    pub fn new(path: &Path) -> NvmlFixture {
        NvmlFixture {
            path: path.to_path_buf(),
        }
    }
}

/// The driver's NVML, opened.
pub struct NvmlLibrary {
    library: Library,
    name: &'static str,
}

/// `NVML_NVLINK_MAX_LINKS` of current nvml.h (18 on Hopper and Blackwell);
/// links a GPU lacks answer INVALID_ARGUMENT or NOT_SUPPORTED.
const MAX_LINKS: c_uint = 18;
/// NVML's buffer sizes for versions (80) and names (96), rounded up.
const TEXT_BUFFER: usize = 128;

/// `nvmlPciInfo_t` as `nvmlDeviceGetPciInfo_v3` and
/// `nvmlDeviceGetNvLinkRemotePciInfo_v2` fill it.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Device = *mut c_void;
type NoArguments = unsafe extern "C" fn() -> NvmlReturnCode;
type SystemText = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturnCode;
type DeviceCount = unsafe extern "C" fn(*mut c_uint) -> NvmlReturnCode;
type DeviceByIndex = unsafe extern "C" fn(c_uint, *mut Device) -> NvmlReturnCode;
type DeviceText = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> NvmlReturnCode;
type DevicePci = unsafe extern "C" fn(Device, *mut PciInfo) -> NvmlReturnCode;
type LinkValue = unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> NvmlReturnCode;
type LinkPci = unsafe extern "C" fn(Device, c_uint, *mut PciInfo) -> NvmlReturnCode;
type LinkCounter = unsafe extern "C" fn(Device, c_uint, c_uint, *mut c_ulonglong) -> NvmlReturnCode;
type NvmlReturnCode = c_uint;

/// The answer a function that this driver's NVML lacks gives.
const FUNCTION_NOT_FOUND: NvmlReturn = NvmlReturn(13);

impl NvmlLibrary {
    /// Opens libnvidia-ml (the driver installs `.so.1`; `.so` comes with
    /// development packages only).
    pub fn open() -> Result<NvmlLibrary, NvmlError> {
        const DRIVER_NAME: &str = "libnvidia-ml.so.1";
        let open = |name| {
            // SAFETY: opening NVML runs no initialisers beyond the library's
            // own, which do not depend on this process's state.
            unsafe { Library::new(name) }
        };
        // The driver's name is the one to report when neither opens.
        let driver_error = match open(DRIVER_NAME) {
            Ok(library) => {
                return Ok(NvmlLibrary {
                    library,
                    name: DRIVER_NAME,
                })
            }
            Err(error) => error,
        };
        match open("libnvidia-ml.so") {
            Ok(library) => Ok(NvmlLibrary {
                library,
                name: "libnvidia-ml.so",
            }),
            Err(_) => Err(NvmlError::Open {
                library: DRIVER_NAME,
                source: driver_error,
            }),
        }
    }

    /// A function every NVML has.
    fn required<T: Copy>(&self, symbol: &'static str) -> Result<T, NvmlError> {
        // SAFETY: each call site names T as the C prototype of `symbol` in nvml.h.
        unsafe { self.library.get::<T>(symbol) }
            .map(|function| *function)
            .map_err(|source| NvmlError::Symbol {
                library: self.name,
                symbol,
                source,
            })
    }

    /// A function older drivers may lack: its calls then answer FUNCTION_NOT_FOUND.
    fn optional<T: Copy>(&self, symbol: &'static str) -> Option<T> {
        // SAFETY: as in `required`.
        unsafe { self.library.get::<T>(symbol) }
            .ok()
            .map(|function| *function)
    }
}

/// NVML's text out of a fixed buffer.
fn text_answer(code: NvmlReturnCode, buffer: &[c_char]) -> Answer<String> {
    if code != 0 {
        return Answer::Error(NvmlReturn(code));
    }
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&byte| byte != 0)
        .map(|&byte| byte as u8)
        .collect();
    Answer::Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn value_answer<T>(code: NvmlReturnCode, value: T) -> Answer<T> {
    if code == 0 {
        Answer::Ok(value)
    } else {
        Answer::Error(NvmlReturn(code))
    }
}

fn empty_pci_info() -> PciInfo {
    PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pci_device_id: 0,
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    }
}

impl NvlinkSource for NvmlLibrary {
    fn answers(&self) -> Result<NvmlAnswers, NvmlError> {
        let init: NoArguments = self.required("nvmlInit_v2")?;
        let shutdown: NoArguments = self.required("nvmlShutdown")?;
        // SAFETY: nvmlInit_v2 takes no arguments; it is reference counted
        // with nvmlShutdown, which is called below on every path.
        let code = unsafe { init() };
        if code != 0 {
            return Err(NvmlError::Call {
                function: "nvmlInit_v2",
                code: NvmlReturn(code),
            });
        }
        let answers = self.ask();
        // SAFETY: pairs the successful nvmlInit_v2 above.
        unsafe { shutdown() };
        answers
    }
}

impl NvmlLibrary {
    /// Every question, between nvmlInit and nvmlShutdown.
    fn ask(&self) -> Result<NvmlAnswers, NvmlError> {
        let system_text = |symbol: &'static str| -> Answer<String> {
            let Some(function) = self.optional::<SystemText>(symbol) else {
                return Answer::Error(FUNCTION_NOT_FOUND);
            };
            let mut buffer = [0 as c_char; TEXT_BUFFER];
            // SAFETY: the buffer is writable for the length passed.
            let code = unsafe { function(buffer.as_mut_ptr(), TEXT_BUFFER as c_uint) };
            text_answer(code, &buffer)
        };
        let count: DeviceCount = self.required("nvmlDeviceGetCount_v2")?;
        let by_index: DeviceByIndex = self.required("nvmlDeviceGetHandleByIndex_v2")?;
        let pci: DevicePci = self.required("nvmlDeviceGetPciInfo_v3")?;
        let name = self.optional::<DeviceText>("nvmlDeviceGetName");
        let link_state = self.optional::<LinkValue>("nvmlDeviceGetNvLinkState");
        let link_version = self.optional::<LinkValue>("nvmlDeviceGetNvLinkVersion");
        let remote_pci = self.optional::<LinkPci>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
        let remote_type = self.optional::<LinkValue>("nvmlDeviceGetNvLinkRemoteDeviceType");
        let error_counter = self.optional::<LinkCounter>("nvmlDeviceGetNvLinkErrorCounter");

        let mut devices: c_uint = 0;
        // SAFETY: writes one unsigned int.
        let code = unsafe { count(&mut devices) };
        if code != 0 {
            return Err(NvmlError::Call {
                function: "nvmlDeviceGetCount_v2",
                code: NvmlReturn(code),
            });
        }
        let link_value = |function: Option<LinkValue>, device: Device, link: c_uint| {
            let Some(function) = function else {
                return Answer::Error(FUNCTION_NOT_FOUND);
            };
            let mut value: c_uint = 0;
            // SAFETY: `device` is a handle NVML gave; writes one unsigned int.
            let code = unsafe { function(device, link, &mut value) };
            value_answer(code, value)
        };
        let mut gpus = Vec::new();
        for index in 0..devices {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: writes one handle.
            let code = unsafe { by_index(index, &mut device) };
            if code != 0 {
                // A GPU NVML cannot open (lost, no permission) is recorded
                // with its code and no links.
                gpus.push(NvmlGpuAnswers {
                    index,
                    name: Answer::Error(NvmlReturn(code)),
                    pci_bus_id: Answer::Error(NvmlReturn(code)),
                    links: Vec::new(),
                });
                continue;
            }
            let mut info = empty_pci_info();
            // SAFETY: `info` is an nvmlPciInfo_t as the _v3 call expects.
            let pci_code = unsafe { pci(device, &mut info) };
            let name = match name {
                Some(function) => {
                    let mut buffer = [0 as c_char; TEXT_BUFFER];
                    // SAFETY: the buffer is writable for the length passed.
                    let code =
                        unsafe { function(device, buffer.as_mut_ptr(), TEXT_BUFFER as c_uint) };
                    text_answer(code, &buffer)
                }
                None => Answer::Error(FUNCTION_NOT_FOUND),
            };
            let links = (0..MAX_LINKS)
                .map(|link| {
                    let remote_pci_bus_id = match remote_pci {
                        Some(function) => {
                            let mut remote = empty_pci_info();
                            // SAFETY: `remote` is an nvmlPciInfo_t as the _v2 call expects.
                            let code = unsafe { function(device, link, &mut remote) };
                            text_answer(code, &remote.bus_id)
                        }
                        None => Answer::Error(FUNCTION_NOT_FOUND),
                    };
                    NvmlLinkAnswers {
                        link,
                        // nvmlEnableState_t: NVML_FEATURE_ENABLED is 1.
                        state: match link_value(link_state, device, link) {
                            Answer::Ok(state) => Answer::Ok(state == 1),
                            Answer::Error(code) => Answer::Error(code),
                        },
                        version: link_value(link_version, device, link),
                        remote_pci_bus_id,
                        remote_device_type: link_value(remote_type, device, link),
                        error_counters: (0..NVLINK_ERROR_COUNTERS.len() as c_uint)
                            .map(|counter| {
                                let Some(function) = error_counter else {
                                    return Answer::Error(FUNCTION_NOT_FOUND);
                                };
                                let mut value: c_ulonglong = 0;
                                // SAFETY: `device` is a handle NVML gave;
                                // `counter` is an nvmlNvLinkErrorCounter_t;
                                // writes one unsigned long long.
                                let code = unsafe { function(device, link, counter, &mut value) };
                                value_answer(code, value)
                            })
                            .collect(),
                    }
                })
                .collect();
            gpus.push(NvmlGpuAnswers {
                index,
                name,
                pci_bus_id: text_answer(pci_code, &info.bus_id),
                links,
            });
        }
        Ok(NvmlAnswers {
            driver_version: system_text("nvmlSystemGetDriverVersion"),
            nvml_version: system_text("nvmlSystemGetNVMLVersion"),
            gpus,
        })
    }
}
