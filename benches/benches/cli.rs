//! `care validate` and `care score` on a generated JSON Lines file (default 1 GiB; set
//! `CARE_BENCH_JSONL_MB`), all cores, output to `/dev/null`. Needs the release binary: run
//! `cargo build --release -p care-cli` first (or point `CARE_BIN` at a `care` binary); the
//! benchmark is skipped with a note otherwise. Files are cached in `target/care-bench/`.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use care_benches::{write_score_jsonl, write_validate_jsonl};
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

/// Generates `name` once per size (the size is part of the name) and returns (path, lines, bytes).
fn data_file(
    name: &str,
    mb: u64,
    write: impl Fn(&mut BufWriter<File>, u64) -> std::io::Result<(u64, u64)>,
) -> std::io::Result<(PathBuf, u64, u64)> {
    let dir = target_dir().join("care-bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}-{mb}MiB.jsonl"));
    let meta = dir.join(format!("{name}-{mb}MiB.lines"));
    if let (Ok(l), Ok(m)) = (std::fs::read_to_string(&meta), std::fs::metadata(&path))
        && let Ok(lines) = l.trim().parse()
    {
        return Ok((path, lines, m.len()));
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
    let (lines, bytes) = write(&mut w, mb << 20)?;
    w.flush()?;
    std::fs::write(&meta, lines.to_string())?;
    Ok((path, lines, bytes))
}

fn run_care(bin: &Path, sub: &str, file: &Path) -> std::io::Result<bool> {
    let st = Command::new(bin)
        .args([sub, "--no-progress", "--threads", "0"])
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
    type Writer = fn(&mut BufWriter<File>, u64) -> std::io::Result<(u64, u64)>;
    let files: [(&str, Writer); 2] = [
        ("validate", |w, t| write_validate_jsonl(w, t, SEED)),
        ("score", |w, t| write_score_jsonl(w, t, 6, SEED)),
    ];
    for (sub, write) in files {
        let (path, lines, bytes) = match data_file(sub, mb, write) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("cli/{sub} skipped: cannot write the input file: {e}");
                continue;
            }
        };
        match run_care(&bin, sub, &path) {
            Ok(true) => {}
            other => {
                eprintln!(
                    "cli/{sub} skipped: `care {sub}` failed on {}: {other:?}",
                    path.display()
                );
                continue;
            }
        }
        // Lines/s is lines divided by the reported time; criterion reports the bytes.
        eprintln!(
            "cli/{sub}: {} holds {lines} lines, {bytes} bytes",
            path.display()
        );
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new(sub, format!("{mb}MiB")), |b| {
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
