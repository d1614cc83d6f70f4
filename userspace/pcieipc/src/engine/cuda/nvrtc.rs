//! The reduce kernels' module image for one GPU: a cubin for its own
//! architecture, from the kernel store when an earlier process compiled the
//! same source for the same architecture and driver, else compiled
//! by NVRTC and stored; PTX for NVRTC's default architecture (which the
//! driver finishes compiling) for a capability this table does not know.

use std::ffi::{c_char, c_int, CStr, CString};

use cudarc::driver::sys as driver_sys;
use cudarc::nvrtc::{compile_ptx_with_opts, result, sys, CompileOptions, Ptx};

use super::error::CudaError;
use super::kernel_store::KernelStore;

/// NVRTC's real architecture for a compute capability it is known to
/// handle.
fn real_architecture(capability: (i32, i32)) -> Option<&'static str> {
    Some(match capability {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => return None,
    })
}

/// The driver's version, as the store's key takes it. NVRTC's is left
/// out: learning it loads NVRTC, which took 6 to 8 ms of the 8 ms a warm
/// first call took on the H200 host, the whole cost the store exists to
/// save. A cubin NVRTC built for the GPU's architecture runs on any driver
/// that loads it; a new driver (CUDA upgrades bring one) makes every key
/// new, and so does a new crate version.
fn driver_version() -> [u8; 4] {
    let mut driver: c_int = 0;
    // SAFETY: the call writes the integer it is given; a failure leaves 0,
    // which only makes the key differ from a working install's.
    unsafe {
        let _ = driver_sys::cuDriverGetVersion(&mut driver);
    }
    driver.to_le_bytes()
}

/// The module image of `source` (named `name` in NVRTC's messages) for a
/// GPU of `capability`, GPU `ordinal` in errors.
pub(crate) fn module_image(
    source: &str,
    name: &str,
    capability: (i32, i32),
    ordinal: usize,
) -> Result<Ptx, CudaError> {
    let compile_error = |log: String| CudaError::Compile { ordinal, log };
    let Some(real) = real_architecture(capability) else {
        return compile_ptx_with_opts(
            source,
            CompileOptions {
                name: Some(name.to_owned()),
                ..CompileOptions::default()
            },
        )
        .map_err(|error| compile_error(error.to_string()));
    };
    let store = KernelStore::from_env();
    let key = KernelStore::key(&[source.as_bytes(), real.as_bytes(), &driver_version()]);
    if let Some(image) = store.load(&key) {
        return Ok(Ptx::from_binary(image));
    }
    let image = compile_cubin(source, name, real).map_err(compile_error)?;
    store.save(&key, &image);
    Ok(Ptx::from_binary(image))
}

/// NVRTC's cubin of `source` for the real architecture `arch`, or its log.
fn compile_cubin(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, String> {
    let (source, name) = (
        CString::new(source).map_err(|_| "a NUL byte in the kernels' source".to_owned())?,
        CString::new(name).map_err(|_| "a NUL byte in the kernels' name".to_owned())?,
    );
    let program = result::create_program(&source, Some(&name)).map_err(|e| e.to_string())?;
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: `program` was just created and is destroyed once, below; the
    // size NVRTC reports is the buffer it fills.
    let outcome = unsafe {
        match result::compile_program(program, &options) {
            Err(error) => Err(match result::get_program_log(program) {
                Ok(log) => CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned(),
                Err(_) => error.to_string(),
            }),
            Ok(()) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(program, &mut size)
                    .result()
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        let mut image = vec![0u8; size];
                        sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast::<c_char>())
                            .result()
                            .map(|()| image)
                            .map_err(|e| e.to_string())
                    })
            }
        }
    };
    // SAFETY: created above and not destroyed before.
    let _ = unsafe { result::destroy_program(program) };
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_capabilities_get_their_real_architecture() {
        assert_eq!(real_architecture((9, 0)), Some("sm_90"));
        assert_eq!(real_architecture((8, 6)), Some("sm_86"));
        // Unknown: PTX with NVRTC's default, finished by the driver.
        assert_eq!(real_architecture((6, 1)), None);
    }
}
