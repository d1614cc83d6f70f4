// SPDX-License-Identifier: GPL-2.0

//! A text module parameter that root may change at run time through
//! `/sys/module/pcieipc/parameters/NAME`, with its own parse and print.
//!
//! 7.3's `module!` macro declares only integer and bool parameters, read-only
//! and absent from sysfs. [`text_param!`] declares one the way that macro
//! does (a `kernel_param` in the `__param` section and its `modinfo` lines),
//! with `kernel_param_ops` that hand the text to a [`TextParam`]. The kernel
//! calls those ops under the module's parameter lock, at load and on every
//! sysfs read or write; [`with_param_lock`] takes the same lock for the
//! module's own readers. This is the one place that touches the raw
//! parameter bindings.

use kernel::{bindings, prelude::*};

/// What a text parameter is: how its text is parsed into the value in force
/// and printed back. Both run under the module's parameter lock.
pub(crate) trait TextParam {
    /// Replaces the value with `text` (a write's bytes, without the NUL), or
    /// fails and leaves it as it was.
    fn store(text: &[u8]) -> Result;
    /// Prints the value (a sysfs read).
    fn show(out: &mut ParamWriter<'_>) -> core::fmt::Result;
}

/// The page a parameter's value is printed into; output past its end is
/// an error, never written.
pub(crate) struct ParamWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl core::fmt::Write for ParamWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(core::fmt::Error)?;
        self.buf
            .get_mut(self.len..end)
            .ok_or(core::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The `set` op: `val` parsed by `P`.
///
/// # Safety
///
/// `val` is NULL or a NUL-terminated string valid for the call, as the
/// kernel passes it to `kernel_param_ops.set`.
pub(crate) unsafe fn set<P: TextParam>(val: *const c_char) -> c_int {
    if val.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: by this function's requirement, `val` is a NUL-terminated
    // string valid for the duration of the call.
    let text = unsafe { CStr::from_char_ptr(val) };
    match P::store(text.to_bytes()) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// The `get` op: `P`'s value printed into `buffer`.
///
/// # Safety
///
/// `buffer` is the kernel's page for `kernel_param_ops.get`: writable for
/// `PAGE_SIZE` bytes for the call.
pub(crate) unsafe fn get<P: TextParam>(buffer: *mut c_char) -> c_int {
    // SAFETY: by this function's requirement.
    let buf =
        unsafe { core::slice::from_raw_parts_mut(buffer.cast::<u8>(), kernel::page::PAGE_SIZE) };
    let mut out = ParamWriter { buf, len: 0 };
    match P::show(&mut out) {
        Ok(()) => out.len as c_int,
        Err(_) => ENOSPC.to_errno(),
    }
}

/// Runs `f` under the module's parameter lock, so that it reads a value no
/// sysfs write is changing.
pub(crate) fn with_param_lock<T>(f: impl FnOnce() -> T) -> T {
    // `__this_module` is this module's `struct module`, alive while its
    // code runs.
    let module = (&raw const bindings::__this_module).cast_mut();
    // SAFETY: `module` is valid (above); the lock is a mutex, and callers
    // are in process context.
    unsafe { bindings::kernel_param_lock(module) };
    let value = f();
    // SAFETY: taken above by this thread.
    unsafe { bindings::kernel_param_unlock(module) };
    value
}

/// Declares the text parameter `$name` (mode 0644: root writes it), parsed
/// and printed by `$param: TextParam`, described by `$description` in
/// `modinfo`. A hardware parameter: the kernel refuses to set it while
/// locked down.
macro_rules! text_param {
    ($name:literal, $param:ty, $description:literal) => {
        const _: () = {
            /// # Safety
            ///
            /// Called by the kernel as `kernel_param_ops.set`.
            unsafe extern "C" fn set_op(
                val: *const ::kernel::ffi::c_char,
                _kp: *const ::kernel::bindings::kernel_param,
            ) -> ::kernel::ffi::c_int {
                // SAFETY: the kernel passes a NUL-terminated string or NULL.
                unsafe { $crate::text_param::set::<$param>(val) }
            }

            /// # Safety
            ///
            /// Called by the kernel as `kernel_param_ops.get`.
            unsafe extern "C" fn get_op(
                buffer: *mut ::kernel::ffi::c_char,
                _kp: *const ::kernel::bindings::kernel_param,
            ) -> ::kernel::ffi::c_int {
                // SAFETY: the kernel passes its page for the value.
                unsafe { $crate::text_param::get::<$param>(buffer) }
            }

            static OPS: ::kernel::bindings::kernel_param_ops =
                ::kernel::bindings::kernel_param_ops {
                    flags: 0,
                    set: Some(set_op),
                    get: Some(get_op),
                    free: None,
                };

            #[repr(transparent)]
            struct Param(::kernel::bindings::kernel_param);
            // SAFETY: the kernel serialises every use of the parameter; this
            // module never touches it.
            unsafe impl Sync for Param {}

            #[link_section = "__param"]
            #[used(compiler)]
            static PARAM: Param = Param(::kernel::bindings::kernel_param {
                name: ::kernel::str::as_char_ptr_in_const_context(
                    match ::core::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
                        Ok(name) => name,
                        Err(_) => panic!("a parameter name has no NUL inside"),
                    },
                ),
                // `__this_module` is constructed by the kernel at load time
                // and lives until the module is unloaded.
                mod_: (&raw const ::kernel::bindings::__this_module).cast_mut(),
                ops: &OPS,
                perm: 0o644,
                level: -1,
                flags: ::kernel::bindings::KERNEL_PARAM_FL_HWPARAM as u8,
                __bindgen_anon_1: ::kernel::bindings::kernel_param__bindgen_ty_1 {
                    arg: ::core::ptr::null_mut(),
                },
            });

            // The `modinfo` lines (`modinfo pcieipc.ko`), as `module!` writes
            // them for a loadable module.
            #[link_section = ".modinfo"]
            #[used(compiler)]
            static PARMTYPE: [u8; concat!("parmtype=", $name, ":charp\0").len()] =
                match concat!("parmtype=", $name, ":charp\0")
                    .as_bytes()
                    .first_chunk()
                {
                    Some(bytes) => *bytes,
                    None => panic!("sized by its own length"),
                };
            #[link_section = ".modinfo"]
            #[used(compiler)]
            static PARM: [u8; concat!("parm=", $name, ":", $description, "\0").len()] =
                match concat!("parm=", $name, ":", $description, "\0")
                    .as_bytes()
                    .first_chunk()
                {
                    Some(bytes) => *bytes,
                    None => panic!("sized by its own length"),
                };
        };
    };
}
pub(crate) use text_param;
