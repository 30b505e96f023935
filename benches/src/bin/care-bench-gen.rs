//! `care-bench-gen`: writes the benchmark inputs that the comparison script feeds to `care` and
//! to the Python baselines, so both sides read the same bytes.
//!
//! ```text
//! care-bench-gen validate-jsonl OUT MB        # {"text": ...} lines, 100-rubric mix
//! care-bench-gen score-jsonl OUT MB GROUP     # {"rubric": .., "responses": [..]} lines
//! care-bench-gen shape OUT MB NAME          # one input shape of care_benches::SHAPES
//! care-bench-gen rubric-mix OUT               # the 100 rubric texts, one JSON string a line
//! care-bench-gen rewards OUT N                # N little-endian f32 rewards
//! care-bench-gen loss OUT_PREFIX TOKENS SEQ   # .logp .logp_old .mask .offsets .adv raw files
//! ```
use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use care_benches::{
    loss_data, push_json_str, rewards, rubric_mix, write_score_jsonl, write_shape_jsonl,
    write_validate_jsonl,
};

const SEED: u64 = 20_260_101;

fn arg_num(args: &[String], i: usize) -> Result<u64, String> {
    args.get(i)
        .ok_or_else(|| format!("missing argument {i}"))?
        .parse()
        .map_err(|e| format!("argument {i}: {e}"))
}

fn create(path: &str) -> Result<BufWriter<File>, String> {
    File::create(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|e| format!("{path}: {e}"))
}

fn write_raw<T: Copy>(
    path: &str,
    data: &[T],
    to_bytes: impl Fn(T) -> Vec<u8>,
) -> Result<(), String> {
    let mut w = create(path)?;
    for &x in data {
        w.write_all(&to_bytes(x)).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}

fn run(args: &[String]) -> Result<(), String> {
    let what = args.get(1).map(String::as_str).unwrap_or("");
    let out = args.get(2).ok_or("missing OUT")?.as_str();
    match what {
        "validate-jsonl" => {
            let mut w = create(out)?;
            let (lines, bytes) = write_validate_jsonl(&mut w, arg_num(args, 3)? << 20, SEED)
                .map_err(|e| e.to_string())?;
            w.flush().map_err(|e| e.to_string())?;
            println!("{lines} lines, {bytes} bytes");
        }
        "score-jsonl" => {
            let mut w = create(out)?;
            let group = arg_num(args, 4)? as usize;
            let (lines, bytes) = write_score_jsonl(&mut w, arg_num(args, 3)? << 20, group, SEED)
                .map_err(|e| e.to_string())?;
            w.flush().map_err(|e| e.to_string())?;
            println!("{lines} lines, {bytes} bytes");
        }
        "shape" => {
            let mut w = create(out)?;
            let name = args.get(4).ok_or("missing shape NAME")?;
            let (lines, bytes) = write_shape_jsonl(&mut w, name, arg_num(args, 3)? << 20, SEED)
                .map_err(|e| e.to_string())?;
            w.flush().map_err(|e| e.to_string())?;
            println!("{lines} lines, {bytes} bytes");
        }
        "rubric-mix" => {
            let mut w = create(out)?;
            for t in rubric_mix(100, SEED) {
                let mut s = String::new();
                push_json_str(&mut s, &t);
                s.push('\n');
                w.write_all(s.as_bytes()).map_err(|e| e.to_string())?;
            }
            w.flush().map_err(|e| e.to_string())?;
        }
        "rewards" => {
            let r = rewards(arg_num(args, 3)? as usize, SEED);
            write_raw(out, &r, |x| x.to_le_bytes().to_vec())?;
        }
        "loss" => {
            let d = loss_data(arg_num(args, 3)? as usize, arg_num(args, 4)? as usize, SEED);
            write_raw(&format!("{out}.logp"), &d.logp, |x| {
                x.to_le_bytes().to_vec()
            })?;
            write_raw(&format!("{out}.logp_old"), &d.logp_old, |x| {
                x.to_le_bytes().to_vec()
            })?;
            write_raw(&format!("{out}.mask"), &d.mask, |x| vec![x])?;
            write_raw(&format!("{out}.offsets"), &d.seq_offsets, |x| {
                x.to_le_bytes().to_vec()
            })?;
            write_raw(&format!("{out}.adv"), &d.advantages, |x| {
                x.to_le_bytes().to_vec()
            })?;
        }
        _ => return Err(format!("unknown kind {what:?} (see the source header)")),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("care-bench-gen: {e}");
            ExitCode::from(2)
        }
    }
}
