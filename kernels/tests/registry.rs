//! The static check the emulator cannot do: every `.entry` of the checked-in PTX against the
//! registry (`care_kernels::kernel`).
//!
//! Relations checked: (1) every `kernels/cuda/*.cu` has a `kernels/ptx/*.ptx` and a [`Module`],
//! and every module's PTX text is that file; (2) every [`Kernel`] is an `.entry` of its
//! module's PTX, and every `.entry` of a module is a registered kernel of that module; (3) for
//! every kernel, the parameters of the `.entry` (count, order, size and alignment of each
//! `.param`) equal [`Kernel::params`], the layout of the argument tuple that the kernel's typed
//! `Entry` makes its launcher pass. The emulator compiles the `.cu` as host C++ and is called
//! through its own C shims, so a launcher passing one argument too few, a struct that grew on
//! one side only, or two swapped arguments would pass every emulated test and fail only on a
//! GPU (a driver error or garbage reads).
//!
//! The `planted_*` tests run the same check on PTX text with one mismatch planted each, and
//! assert that it is reported. Planted on the Rust side by hand: adding a field to
//! `LogSoftmaxParams` fails `every_entry_matches_its_launcher` for all six log-softmax kernels
//! (size 128 against the PTX's 120); declaring `GrpoLossDenoms` with `(LossParams)` only in the
//! `registry!` table does not compile while its plan passes `(p, out)` (the `Entry` type), and
//! once the plan passes `(p,)` as well, the test fails with `grpo_loss_denoms` named.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

use care_kernels::geometry::{self, Tuning};
use care_kernels::{Access, Kernel, Module, ParamLayout};

/// One `.entry` of a PTX module: its name and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PtxEntry {
    name: String,
    params: Vec<ParamLayout>,
}

/// Bytes of a PTX fundamental type (`.u64`, `.b8`, `.f32`, `.pred`...).
fn type_size(t: &str) -> Result<usize, String> {
    let bits: usize = t
        .trim_start_matches('.')
        .get(1..)
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| format!("unknown PTX type {t}"))?;
    if !matches!(t.as_bytes().get(1), Some(b'b' | b'u' | b's' | b'f')) || !bits.is_multiple_of(8) {
        return Err(format!("unknown PTX type {t}"));
    }
    Ok(bits / 8)
}

/// One kernel parameter declaration: `.param [.align N] .type name[[count]]`.
fn parse_param(decl: &str) -> Result<ParamLayout, String> {
    let mut toks = decl.split_whitespace();
    if toks.next() != Some(".param") {
        return Err(format!("not a .param: {decl}"));
    }
    let mut tok = toks.next().ok_or_else(|| format!("empty .param: {decl}"))?;
    let mut align = None;
    if tok == ".align" {
        let n = toks.next().and_then(|n| n.parse::<usize>().ok());
        align = Some(n.ok_or_else(|| format!("bad .align in {decl}"))?);
        tok = toks.next().ok_or_else(|| format!("no type in {decl}"))?;
    }
    let elem = type_size(tok)?;
    let name = toks.next().ok_or_else(|| format!("no name in {decl}"))?;
    if toks.next().is_some() {
        return Err(format!("unexpected tokens in {decl}"));
    }
    let count = match name.split_once('[') {
        None => 1,
        Some((_, rest)) => rest
            .strip_suffix(']')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| format!("bad array in {decl}"))?,
    };
    Ok(ParamLayout {
        size: elem * count,
        align: align.unwrap_or(elem),
    })
}

/// Every `.entry` of a PTX module, in order.
fn parse_entries(ptx: &str) -> Result<Vec<PtxEntry>, String> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry ") {
        let after = &rest[at + ".entry ".len()..];
        let open = after.find('(').ok_or("`.entry` without `(`")?;
        let close = after.find(')').ok_or("`.entry` without `)`")?;
        if close < open {
            return Err("`)` before `(` in an `.entry`".into());
        }
        let name = after[..open].trim().to_owned();
        let params = after[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(parse_param)
            .collect::<Result<Vec<_>, _>>()?;
        out.push(PtxEntry { name, params });
        rest = &after[close..];
    }
    Ok(out)
}

/// Every mismatch between the registry and the PTX of each module (`ptx(m)`), as messages.
fn mismatches(ptx: impl Fn(Module) -> String) -> Vec<String> {
    let mut errors = Vec::new();
    for &m in Module::ALL {
        let entries = match parse_entries(&ptx(m)) {
            Ok(e) => e,
            Err(e) => {
                errors.push(format!("{}.ptx: {e}", m.stem()));
                continue;
            }
        };
        for e in &entries {
            match Kernel::ALL.iter().find(|k| k.name() == e.name) {
                None => errors.push(format!(
                    "{}.ptx: .entry {} is not a registered Kernel",
                    m.stem(),
                    e.name
                )),
                Some(k) if k.module() != m => errors.push(format!(
                    "{}.ptx: .entry {} is registered in module {:?}",
                    m.stem(),
                    e.name,
                    k.module()
                )),
                Some(k) if k.params() != e.params.as_slice() => errors.push(format!(
                    "{}: the launcher passes {:?}, the PTX entry takes {:?}",
                    e.name,
                    k.params(),
                    e.params
                )),
                Some(_) => {}
            }
        }
        for k in Kernel::ALL.iter().filter(|k| k.module() == m) {
            match entries.iter().filter(|e| e.name == k.name()).count() {
                1 => {}
                n => errors.push(format!(
                    "{:?} ({}): {n} `.entry` in {}.ptx, want 1",
                    k,
                    k.name(),
                    m.stem()
                )),
            }
        }
    }
    errors
}

fn kernels_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn stems(dir: &str, ext: &str) -> BTreeSet<String> {
    std::fs::read_dir(kernels_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn every_source_is_a_module_with_its_ptx() {
    let modules: BTreeSet<String> = Module::ALL.iter().map(|m| m.stem().to_owned()).collect();
    assert_eq!(
        stems("cuda", "cu"),
        modules,
        "kernels/cuda/*.cu vs Module::ALL"
    );
    assert_eq!(
        stems("ptx", "ptx"),
        modules,
        "kernels/ptx/*.ptx vs Module::ALL"
    );
    for &m in Module::ALL {
        let path = kernels_dir().join("ptx").join(format!("{}.ptx", m.stem()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), m.ptx(), "{m:?}");
        // NVRTC 12.2: PTX ISA 8.2 for compute_80 (loads on CUDA 12.2+ drivers).
        assert!(m.ptx().contains("\n.version 8.2\n"), "{m:?}");
        assert!(m.ptx().contains("\n.target sm_80\n"), "{m:?}");
    }
}

#[test]
fn every_entry_matches_its_launcher() {
    let errors = mismatches(|m| m.ptx().to_owned());
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The parser saw every kernel's parameters (not an empty list from a parse slip).
    let entries: usize = Module::ALL
        .iter()
        .map(|m| parse_entries(m.ptx()).unwrap().len())
        .sum();
    assert_eq!(entries, Kernel::ALL.len());
}

/// The real PTX with one edit in one module.
fn planted(module: Module, from: &str, to: &str) -> Vec<String> {
    assert!(module.ptx().contains(from), "plant site {from:?} not found");
    mismatches(|m| {
        if m == module {
            m.ptx().replacen(from, to, 1)
        } else {
            m.ptx().to_owned()
        }
    })
}

#[test]
fn planted_struct_size_mismatch_is_reported() {
    // The C struct grew by 8 bytes, the Rust mirror did not.
    let e = planted(
        Module::LogSoftmax,
        "logsoftmax_bwd_bf16_param_0[120]",
        "logsoftmax_bwd_bf16_param_0[128]",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("logsoftmax_bwd_bf16: the launcher passes"),
        "{e:?}"
    );
}

#[test]
fn planted_missing_or_extra_argument_is_reported() {
    // The kernel lost its second parameter: the launcher still passes two.
    let e = planted(
        Module::GrpoLoss,
        "grpo_loss_denoms_param_0[376],\n\t.param .u64 grpo_loss_denoms_param_1",
        "grpo_loss_denoms_param_0[376]",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("grpo_loss_denoms: the launcher passes"),
        "{e:?}"
    );
    // A kernel gained a parameter.
    let e = planted(
        Module::Advantages,
        "batch_std_f32_param_0[64]",
        "batch_std_f32_param_0[64],\n\t.param .u32 batch_std_f32_param_1",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("batch_std_f32: the launcher passes"),
        "{e:?}"
    );
}

#[test]
fn planted_swapped_arguments_are_reported() {
    let e = planted(
        Module::GrpoLoss,
        ".param .align 8 .b8 grpo_loss_denoms_param_0[376],\n\t.param .u64 grpo_loss_denoms_param_1",
        ".param .u64 grpo_loss_denoms_param_1,\n\t.param .align 8 .b8 grpo_loss_denoms_param_0[376]",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("grpo_loss_denoms: the launcher passes"),
        "{e:?}"
    );
}

#[test]
fn planted_unregistered_or_missing_entry_is_reported() {
    // A new kernel in the source that nobody registered.
    let e = planted(
        Module::Advantages,
        ".visible .entry batch_std_f32(",
        ".visible .entry batch_std_f64(",
    );
    assert!(
        e.iter()
            .any(|x| x == "advantages.ptx: .entry batch_std_f64 is not a registered Kernel"),
        "{e:?}"
    );
    // ...and the registered kernel it replaced is now missing.
    assert!(
        e.iter()
            .any(|x| x.starts_with("BatchStdF32 (batch_std_f32): 0 `.entry`")),
        "{e:?}"
    );
}

#[test]
fn parser_reads_every_param_form() {
    let ptx = ".visible .entry k(\n\t.param .align 8 .b8 k_param_0[136],\n\t.param .u64 \
               k_param_1,\n\t.param .f32 k_param_2,\n\t.param .align 16 .b32 k_param_3[3]\n)\n\
               .entry empty()\n{\n}\n";
    let e = parse_entries(ptx).unwrap();
    let l = |size, align| ParamLayout { size, align };
    assert_eq!(
        e,
        vec![
            PtxEntry {
                name: "k".into(),
                params: vec![l(136, 8), l(8, 8), l(4, 4), l(12, 16)],
            },
            PtxEntry {
                name: "empty".into(),
                params: vec![],
            },
        ]
    );
    assert!(parse_param(".param .q64 x").is_err());
    assert!(parse_param(".param .align 8 .b8 x[1").is_err());
}

/// The text of `.entry name` in `ptx`, up to the next `.entry` (or the end).
fn entry_text<'a>(ptx: &'a str, name: &str) -> &'a str {
    let head = format!(".entry {name}(");
    let at = ptx
        .find(&head)
        .unwrap_or_else(|| panic!("no .entry {name}"));
    let rest = &ptx[at + head.len()..];
    &rest[..rest.find(".entry ").unwrap_or(rest.len())]
}

/// Every breach of the static performance rules by one kernel's PTX, as messages: launch
/// bounds equal to the registry's (`.maxntid threads, 1, 1` and `.minnctapersm min_blocks`);
/// for [`Access::Stream`], 128-bit global loads (and stores, but in the forward), the hardware
/// `cvt.f32.f16` in the
/// f16 entries and never the software widening (its subnormal scale `2^-24`, `0f33800000`), and
/// no global atomics but the status `or` and the slot merge's ticket (`atom.global.add.u32`);
/// for [`Access::Elementwise`], no float atomics (the statistics go through slots).
fn static_breaches(k: Kernel, body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = k.bounds();
    if !body.contains(&format!("\n.maxntid {}, 1, 1\n", b.threads)) {
        out.push(format!("{}: .maxntid is not {}, 1, 1", k.name(), b.threads));
    }
    if !body.contains(&format!("\n.minnctapersm {}\n", b.min_blocks)) {
        out.push(format!(
            "{}: .minnctapersm is not {}",
            k.name(),
            b.min_blocks
        ));
    }
    let atomics: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("atom.global") || l.starts_with("red.global"))
        .collect();
    match k.access() {
        Access::Stream => {
            let v4 = [
                "ld.global.v4.",
                "ld.global.nc.v4.",
                "ld.global.L2::cache_hint.v4.",
            ];
            if !v4.iter().any(|l| body.contains(l)) {
                out.push(format!("{}: no 128-bit global load", k.name()));
            }
            let st4 = ["st.global.v4.", "st.global.L2::cache_hint.v4."];
            if !st4.iter().any(|l| body.contains(l)) && !k.name().contains("fwd") {
                out.push(format!("{}: no 128-bit global store", k.name()));
            }
            if k.name().ends_with("_f16") && !body.contains("cvt.f32.f16") {
                out.push(format!("{}: no hardware cvt.f32.f16", k.name()));
            }
            if body.contains("0f33800000") {
                out.push(format!("{}: the software f16 widening", k.name()));
            }
            for a in atomics {
                let status =
                    a.starts_with("atom.global.or.b32") || a.starts_with("red.global.or.b32");
                if !(status || a.starts_with("atom.global.add.u32")) {
                    out.push(format!("{}: global atomic on the hot path: {a}", k.name()));
                }
            }
        }
        Access::Elementwise => {
            for a in atomics {
                if a.contains(".f32") || a.contains(".f64") {
                    out.push(format!("{}: float atomic {a}", k.name()));
                }
            }
        }
        Access::Small => {}
    }
    out
}

#[test]
fn every_entry_meets_the_static_performance_rules() {
    let mut errors = Vec::new();
    for &k in Kernel::ALL {
        errors.extend(static_breaches(k, entry_text(k.module().ptx(), k.name())));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn planted_performance_breaches_are_reported() {
    let k = Kernel::LogSoftmaxFwdF16;
    let body = entry_text(k.module().ptx(), k.name()).to_owned();
    let cases = [
        (".maxntid 256, 1, 1", ".maxntid 1024, 1, 1", ".maxntid"),
        (".minnctapersm 6", ".minnctapersm 1", ".minnctapersm"),
        ("ld.global.v4.", "ld.global.v2.", "128-bit global load"),
        ("cvt.f32.f16", "cvt.f32.s16", "cvt.f32.f16"),
    ];
    for (from, to, what) in cases {
        assert!(body.contains(from), "plant site {from:?}");
        let errs = static_breaches(k, &body.replace(from, to));
        assert!(errs.iter().any(|e| e.contains(what)), "{what}: {errs:?}");
    }
    let errs = static_breaches(k, &format!("{body}\n\tmov.f32 %f1, 0f33800000;\n"));
    assert!(errs.iter().any(|e| e.contains("software")), "{errs:?}");
    let errs = static_breaches(
        k,
        &format!("{body}\n\tatom.global.add.f32 %f1, [%rd1], %f2;\n"),
    );
    assert!(errs.iter().any(|e| e.contains("atomic")), "{errs:?}");
    let g = Kernel::GrpoLossF32;
    let body = entry_text(g.module().ptx(), g.name());
    let errs = static_breaches(g, &format!("{body}\n\tred.global.add.f32 [%rd1], %f2;\n"));
    assert!(errs.iter().any(|e| e.contains("float atomic")), "{errs:?}");
}

/// The plans' default block sizes are the launch bounds' (an override beyond them is refused
/// by the plan, tested in the emulator's tests).
#[test]
fn default_geometry_uses_the_launch_bounds() {
    let t = Tuning::default();
    let threads = |k: Kernel| k.bounds().threads;
    let (g, _) = geometry::advantages_geometry(64, 8, false, t);
    assert_eq!(g.block.0, threads(Kernel::GroupAdvantagesF32));
    let (g, _) = geometry::advantages_geometry(1 << 20, 1, true, t);
    assert_eq!(g.block.0, threads(Kernel::GroupAdvantagesF32));
    assert_eq!(
        geometry::batch_std_geometry(1 << 20, false, t).block.0,
        threads(Kernel::BatchStdF32)
    );
    assert_eq!(
        geometry::group_alpha_geometry(t).block.0,
        threads(Kernel::GroupAlphaF32)
    );
    let g = geometry::loss_geometry(8, 8000, 0, false, t);
    for d in care_kernels::Dtype::ALL {
        assert_eq!(g.block.0, threads(Kernel::grpo_loss(d).kernel()));
        let (g, _) = geometry::log_softmax_geometry(8, 151_936, t);
        assert_eq!(g.block.0, threads(Kernel::log_softmax_forward(d).kernel()));
        assert_eq!(g.block.0, threads(Kernel::log_softmax_backward(d).kernel()));
    }
    assert_eq!(
        geometry::denoms_geometry(9, t).block.0,
        threads(Kernel::GrpoLossDenoms)
    );
    assert_eq!(
        geometry::cov_geometry(9, t).block.0,
        threads(Kernel::GrpoCovMeans)
    );
    assert_eq!(
        geometry::cov_geometry(9, t).block.0,
        threads(Kernel::GrpoCovKeys)
    );
    assert_eq!(
        geometry::cov_radix_geometry(9, t).block.0,
        threads(Kernel::GrpoCovRadix)
    );
    assert_eq!(
        geometry::cov_cut_geometry().block.0,
        threads(Kernel::GrpoCovCut)
    );
    let g = geometry::returns_geometry(9, t);
    assert_eq!(g.block.0, threads(Kernel::DiscountedReturnsF32));
    assert_eq!(g.block.0, threads(Kernel::GaeF32));
    assert_eq!(
        geometry::whiten_apply_geometry(9, t).block.0,
        threads(Kernel::WhitenApplyF32)
    );
    let g = geometry::whiten_stats_geometry(1 << 20, t);
    assert_eq!(g.block.0, threads(Kernel::WhitenStatsF32));
    for d in care_kernels::Dtype::ALL {
        let g = geometry::logits_loss_geometry(9000, t);
        assert_eq!(g.block.0, threads(Kernel::logits_loss(d).kernel()));
    }
    for &k in Kernel::ALL {
        let b = k.bounds();
        assert!(
            b.threads % 32 == 0 && b.threads <= 1024 && b.min_blocks >= 1,
            "{k:?}"
        );
        assert!(
            b.threads * b.min_blocks <= 2048,
            "{k:?}: more threads than an SM holds"
        );
    }
}
