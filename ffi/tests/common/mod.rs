//! Helpers shared by the integration tests of the C ABI.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository root (`ffi/..`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `include/care.h` as text.
pub fn header() -> String {
    std::fs::read_to_string(repo_root().join("include").join("care.h")).expect("include/care.h")
}

/// A paper fixture, from the repository's bundled copies in `cli/data`.
pub fn fixture(name: &str) -> Vec<u8> {
    let p = repo_root().join("cli").join("data").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Function names declared in the header: every `care_*(` that starts a declaration line
/// (cbindgen writes one declaration per line start; continuation lines are indented).
pub fn declared_functions(header: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in header.lines() {
        let t = line.trim_start();
        if t.starts_with("//") || t.starts_with('*') || t.starts_with("/*") || t.starts_with('#') {
            continue;
        }
        if line.starts_with(' ') {
            continue;
        }
        let Some(open) = line.find('(') else { continue };
        let before = &line[..open];
        let name = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next();
        if let Some(name) = name
            && name.starts_with("care_")
        {
            names.insert(name.to_string());
        }
    }
    names
}

/// The directory holding a fresh `libcare.so` and `libcare.a`.
///
/// `cargo test` builds the library only as an rlib, so the C-facing artifacts are built here
/// with a nested `cargo build` into a separate target directory (under `CARGO_TARGET_TMPDIR`;
/// a separate directory, because the outer cargo holds the lock of its own). Incremental after
/// the first run; once per test process.
pub fn libcare_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libcare");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let out = std::process::Command::new(cargo)
            .args(["build", "-p", "libcare", "--target-dir"])
            .arg(&target)
            .current_dir(repo_root())
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p libcare failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug")
    })
    .clone()
}

/// `care_last_error_detail` as a string: the calling thread's detail of its last failed call.
pub fn last_error_detail() -> String {
    let mut buf = vec![0u8; 2048];
    let mut n = usize::MAX;
    // SAFETY: `buf` holds `buf.len()` writable bytes and `n` is a valid output.
    let r = unsafe {
        care_ffi::detail::care_last_error_detail(buf.as_mut_ptr().cast(), buf.len(), &mut n)
    };
    assert_eq!(r, care_ffi::care_result::CARE_OK, "care_last_error_detail");
    buf.truncate(n);
    String::from_utf8(buf).expect("the detail is UTF-8")
}

/// `care_loss_inputs` over host `f32` slices: `logp`, `logp_old`, CSR `seq` offsets, a mask,
/// one advantage per sequence and optionally the rollout log-probs (no reference log-probs).
/// The struct points into the slices, which must outlive its use.
pub fn f32_loss_inputs(
    logp: &[f32],
    old: &[f32],
    seq: &[u32],
    mask: &[u8],
    adv: &[f32],
    rollout: Option<&[f32]>,
) -> care_ffi::loss::care_loss_inputs {
    use care_ffi::loss::{care_advantages_kind, care_dtype, care_loss_inputs};
    care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: care_dtype::CARE_DTYPE_F32 as u32,
        logp: logp.as_ptr().cast(),
        logp_len: logp.len(),
        logp_old: old.as_ptr().cast(),
        logp_old_len: old.len(),
        logp_ref: std::ptr::null(),
        logp_ref_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: seq.len(),
        mask: mask.as_ptr(),
        mask_len: mask.len(),
        advantages: adv.as_ptr(),
        advantages_len: adv.len(),
        advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
        max_seq_len: 0,
        logp_rollout: rollout.map_or(std::ptr::null(), |r| r.as_ptr().cast()),
        logp_rollout_len: rollout.map_or(0, <[f32]>::len),
    }
}
