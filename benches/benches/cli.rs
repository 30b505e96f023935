//! `care validate` and `care score` on a generated JSON Lines file (default 1 GiB; set
//! `CARE_BENCH_JSONL_MB`), all cores, output to `/dev/null`. Needs the release binary: run
//! `cargo build --release -p care-cli` first (or point `CARE_BIN` at a `care` binary); the
//! benchmark is skipped with a note otherwise. Files are cached in `target/care-bench/`.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use care_benches::{SHAPES, write_score_jsonl, write_shape_jsonl, write_validate_jsonl};
use criterion::{BenchmarkId, Criterion, Throughput};

const SEED: u64 = 20_260_101;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn care_bin() -> PathBuf {
    std::env::var_os("CARE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("release/care"))
}

/// The input file for `name` (generated once per size, cached; the size is in the name).
fn data_file(name: &str, target_bytes: u64, write: Writer) -> std::io::Result<PathBuf> {
    let dir = target_dir().join("care-bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}-{target_bytes}.jsonl"));
    let done = dir.join(format!("{name}-{target_bytes}.done"));
    if done.exists() && path.exists() {
        return Ok(path);
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
    write(&mut w, target_bytes)?;
    w.flush()?;
    File::create(&done)?;
    Ok(path)
}

type Writer = fn(&mut dyn Write, u64) -> std::io::Result<(u64, u64)>;

fn run_care(bin: &Path, sub: &str, file: &Path) -> std::io::Result<bool> {
    run_care_threads(bin, sub, file, "0")
}

fn run_care_threads(bin: &Path, sub: &str, file: &Path, threads: &str) -> std::io::Result<bool> {
    let st = Command::new(bin)
        .args([sub, "--no-progress", "--threads", threads])
        .arg(file)
        .stdout(Stdio::null())
        .status()?;
    Ok(st.success())
}

pub fn register_benches(c: &mut Criterion) {
    let bin = care_bin();
    if !bin.exists() {
        eprintln!(
            "cli benches skipped: {} not found (cargo build --release -p care-cli, or set CARE_BIN)",
            bin.display()
        );
        return;
    }
    let mb: u64 = std::env::var("CARE_BENCH_JSONL_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let mut g = c.benchmark_group("cli/jsonl");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    let files: [(&str, Writer); 2] = [
        ("validate", |w, t| write_validate_jsonl(w, t, SEED)),
        ("score", |w, t| write_score_jsonl(w, t, 6, SEED)),
    ];
    for (sub, write) in files {
        // The generator is deterministic: count lines and bytes without writing anything, and
        // probe `care` on a small file, so that a filtered-out benchmark costs no disk.
        let (Ok((lines, bytes)), Ok(probe)) = (
            write(&mut std::io::sink(), mb << 20),
            data_file(sub, 64 << 10, write),
        ) else {
            eprintln!("cli/{sub} skipped: cannot write the probe input");
            continue;
        };
        match run_care(&bin, sub, &probe) {
            Ok(true) => {}
            other => {
                eprintln!(
                    "cli/{sub} skipped: `care {sub}` failed on {}: {other:?}",
                    probe.display()
                );
                continue;
            }
        }
        // Lines/s is lines divided by the reported time; criterion reports the bytes.
        eprintln!("cli/{sub}: {mb} MiB input holds {lines} lines, {bytes} bytes");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new(sub, format!("{mb}MiB")), |b| {
            // A disk that cannot hold the input fails the benchmark, loudly.
            let path = data_file(sub, mb << 20, write).expect("write the cli benchmark input");
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    // A failure here was ruled out by the probe run above.
                    let _ = run_care(&bin, sub, &path);
                }
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// `care validate` / `care score` on one thread, output to `/dev/null`, on each input shape of
/// [`care_benches::SHAPES`] (default 64 MiB a file; set `CARE_BENCH_SHAPE_MB`). The same files
/// as `benches/compare/shapes.sh`, which adds the Python baselines.
pub fn register_shape_benches(c: &mut Criterion) {
    let bin = care_bin();
    if !bin.exists() {
        eprintln!("cli/shape benches skipped: {} not found", bin.display());
        return;
    }
    let mb: u64 = std::env::var("CARE_BENCH_SHAPE_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let mut g = c.benchmark_group("cli/shape");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    for shape in SHAPES {
        let sub = if shape.starts_with("score") {
            "score"
        } else {
            "validate"
        };
        let write = |w: &mut dyn Write, t: u64| write_shape_jsonl(w, shape, t, SEED);
        let Ok((_, bytes)) = write(&mut std::io::sink(), mb << 20) else {
            continue;
        };
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new(shape, format!("{mb}MiB-1thread")), |b| {
            let path = shape_file(shape, mb << 20).expect("write the shape benchmark input");
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let ok = run_care_threads(&bin, sub, &path, "1");
                    assert!(
                        matches!(ok, Ok(true)),
                        "care {sub} failed on {}",
                        path.display()
                    );
                }
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// The cached input of `shape` (see [`data_file`]).
fn shape_file(shape: &str, target_bytes: u64) -> std::io::Result<PathBuf> {
    let dir = target_dir().join("care-bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("shape-{shape}-{target_bytes}.jsonl"));
    let done = dir.join(format!("shape-{shape}-{target_bytes}.done"));
    if done.exists() && path.exists() {
        return Ok(path);
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
    write_shape_jsonl(&mut w, shape, target_bytes, SEED)?;
    w.flush()?;
    File::create(&done)?;
    Ok(path)
}
