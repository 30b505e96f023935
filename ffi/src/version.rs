//! Library and ABI versions.

/// Major version of the library (semver); equals the crate version.
pub const CARE_VERSION_MAJOR: u32 = 0;
/// Minor version of the library (semver).
pub const CARE_VERSION_MINOR: u32 = 1;
/// Patch version of the library (semver).
pub const CARE_VERSION_PATCH: u32 = 0;
/// Version of the C ABI described by this header. Bumped on every incompatible change to a
/// signature, struct layout or code meaning; compare with `care_abi_version()` at startup.
/// Version 2: inputs in size-versioned structs shared by the CPU and GPU entry points, one
/// `care_policy_loss` for every log-prob dtype, names that follow one rule, boolean fields
/// checked (`CARE_ERR_INVALID_BOOL`).
pub const CARE_ABI_VERSION: u32 = 2;

/// The library version as a static NUL-terminated string (`"0.1.0"`). Never NULL; do not free.
#[unsafe(no_mangle)]
pub extern "C" fn care_version() -> *const core::ffi::c_char {
    ffi_panic_boundary! {
        VERSION.as_ptr()
    }
}

/// The ABI version of the loaded library; a program built against `care.h` should check that
/// it equals `CARE_ABI_VERSION`.
#[unsafe(no_mangle)]
pub extern "C" fn care_abi_version() -> u32 {
    ffi_panic_boundary! {
        CARE_ABI_VERSION
    }
}

const VERSION: &core::ffi::CStr = {
    match core::ffi::CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes())
    {
        Ok(s) => s,
        Err(_) => panic!("the crate version holds no NUL byte"),
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_constants_match_the_crate_version() {
        let want = format!("{CARE_VERSION_MAJOR}.{CARE_VERSION_MINOR}.{CARE_VERSION_PATCH}");
        assert_eq!(want, env!("CARGO_PKG_VERSION"));
        // SAFETY: static NUL-terminated string.
        let got = unsafe { core::ffi::CStr::from_ptr(care_version()) };
        assert_eq!(got.to_str().ok(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(care_abi_version(), CARE_ABI_VERSION);
    }
}
