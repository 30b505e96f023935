//! The CUDA source's mirrors of the loss statistics and the rollout diagnostics against their
//! field lists.
//!
//! Relation checked: the members of `struct CareLossStats` in `kernels/cuda/grpo_loss.cu`
//! (name and C type, in declaration order) are exactly
//! `care_kernels::params::LOSS_STATS_DEVICE_LAYOUT`, whose names are those of
//! `care_core::grpo::LOSS_STATS_LAYOUT` (unit test in `params.rs`). The C compiler's offsets of
//! the same struct are compared with the Rust mirror by the emulator's layout test; this test
//! adds the names and types, which offsets alone cannot tell apart (two swapped `u32` counters
//! have the same offsets). The same for `struct CareRolloutStats` and
//! `care_kernels::params::ROLLOUT_STATS_DEVICE_LAYOUT`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::grpo::FieldKind;
use care_kernels::params::{LOSS_STATS_DEVICE_LAYOUT, ROLLOUT_STATS_DEVICE_LAYOUT};

/// The `(name, C type)` members of `struct NAME { ... };` in `src`, in order; comments dropped.
fn struct_members(src: &str, name: &str) -> Vec<(String, String)> {
    let head = format!("struct {name} {{");
    let start = src.find(&head).unwrap_or_else(|| panic!("no `{head}`")) + head.len();
    let body = &src[start..start + src[start..].find("};").expect("unterminated struct")];
    body.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let decl = l
                .strip_suffix(';')
                .unwrap_or_else(|| panic!("not a member: {l}"));
            let (ty, field) = decl.trim().rsplit_once(' ').expect("type and name");
            (field.trim().to_owned(), ty.trim().to_owned())
        })
        .collect()
}

fn c_type(kind: FieldKind) -> &'static str {
    match kind {
        FieldKind::F32 => "float",
        FieldKind::U32 => "care_u32",
        FieldKind::F64 => "double",
    }
}

#[test]
fn cuda_loss_stats_struct_is_the_device_layout() {
    let src = include_str!("../cuda/grpo_loss.cu");
    let got = struct_members(src, "CareLossStats");
    let want: Vec<(String, String)> = LOSS_STATS_DEVICE_LAYOUT
        .iter()
        .map(|f| (f.name.to_owned(), c_type(f.kind).to_owned()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn cuda_rollout_stats_struct_is_the_device_layout() {
    let src = include_str!("../cuda/grpo_loss.cu");
    let got = struct_members(src, "CareRolloutStats");
    let want: Vec<(String, String)> = ROLLOUT_STATS_DEVICE_LAYOUT
        .iter()
        .map(|f| (f.name.to_owned(), c_type(f.kind).to_owned()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn parser_reads_members_and_skips_comments() {
    let src = "struct A {\n    float x;   // a comment; with a semicolon\n    // only a comment\n\
               care_u32 y;\n};\nstruct B {\n};\n";
    assert_eq!(
        struct_members(src, "A"),
        vec![
            ("x".to_owned(), "float".to_owned()),
            ("y".to_owned(), "care_u32".to_owned())
        ]
    );
    assert!(struct_members(src, "B").is_empty());
}
