//! Deterministic data for the `care` benchmarks and the Python comparison.
//!
//! Everything here is generated from a seed with a small SplitMix64 generator, so the criterion
//! harness, the `care-bench-gen` binary and the comparison script all measure the same bytes on
//! every machine. The rubric generator writes rubrics the way the CARE generator model does
//! (SPEC §2), and [`rubric_mix`] adds the format-contract breaks that real generations show
//! (SPEC §3), so the validator is timed on both its accepting and its reporting paths.
#![deny(missing_docs)]

use std::fmt::Write as _;
use std::io::{self, Write};

/// The paper's first appendix rubric (valid; the bundled copy in `cli/data`).
pub const FIXTURE_1: &str = include_str!("../../cli/data/rubric_sft_1.json");
/// The paper's second appendix rubric (valid; the bundled copy in `cli/data`).
pub const FIXTURE_2: &str = include_str!("../../cli/data/rubric_sft_2.json");

/// The three category names in canonical order (SPEC §1).
pub const CATEGORIES: [&str; 3] = [
    "Cognitive Empathy",
    "Affective Empathy",
    "Proactive Empathy",
];

/// A SplitMix64 generator: tiny, seedable, and good enough to vary benchmark inputs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n > 0`; 0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A uniform `f64` in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

const WORDS: [&str; 24] = [
    "seeker",
    "feeling",
    "acknowledges",
    "validates",
    "concern",
    "specific",
    "warmly",
    "practical",
    "step",
    "reconnect",
    "friend",
    "stress",
    "explores",
    "gently",
    "names",
    "emotion",
    "offers",
    "plan",
    "context",
    "without",
    "judgement",
    "clearly",
    "support",
    "response",
];

fn words(rng: &mut Rng, n: usize, out: &mut String) {
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
}

/// Appends `s` as a JSON string literal (quotes included).
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A valid compact rubric: weights in hundredths summing to exactly 1, `per_dim` criteria per
/// dimension (2..=4 keeps it valid under the paper policy), unique titles, level anchors.
pub fn synth_rubric(rng: &mut Rng, per_dim: [usize; 3]) -> String {
    // Integer hundredths summing to 100, so the decimal weights sum to 1 exactly enough.
    let a = 20 + rng.below(40);
    let b = 10 + rng.below(90 - a);
    let w = [a, b, 100 - a - b];
    let mut s = String::with_capacity(3000);
    s.push_str("{\"categories\":[");
    let mut title_no = 0u32;
    for (d, name) in CATEGORIES.iter().enumerate() {
        if d > 0 {
            s.push(',');
        }
        s.push_str("{\"category\":");
        push_json_str(&mut s, name);
        s.push_str(",\"weight_rationale\":\"");
        words(rng, 12, &mut s);
        let _ = write!(
            s,
            ".\",\"category_weight\":{}.{:02},",
            w[d] / 100,
            w[d] % 100
        );
        s.push_str("\"criteria\":[");
        for c in 0..per_dim[d] {
            if c > 0 {
                s.push(',');
            }
            title_no += 1;
            s.push_str("{\"title\":\"");
            words(rng, 3, &mut s);
            let _ = write!(s, " {title_no}\",\"description\":\"");
            for level in 0..=5 {
                let _ = write!(s, "[{level}] ");
                words(rng, 6, &mut s);
                s.push_str(". ");
            }
            s.push_str("value: 0, 1, 2, 3, 4, 5\"}");
        }
        s.push_str("]}");
    }
    s.push_str("]}");
    s
}

/// The kinds of format-contract break that [`break_rubric`] can introduce.
pub const BREAKS: [&str; 9] = [
    "weight_sum",
    "key_order",
    "level_format",
    "duplicate_title",
    "missing_category",
    "category_order",
    "trailing_text",
    "not_json",
    "criteria_count",
];

/// Breaks a valid compact rubric in the way named by `BREAKS[kind % BREAKS.len()]`.
pub fn break_rubric(rubric: &str, kind: usize, rng: &mut Rng) -> String {
    match BREAKS[kind % BREAKS.len()] {
        // Every weight written with one digit less keeps the JSON valid but moves the sum.
        "weight_sum" => rubric.replacen("\"category_weight\":0.", "\"category_weight\":0.9", 1),
        "key_order" => {
            // `category_weight` written before `weight_rationale` in the first category.
            let seg = |from: usize, key: &str| {
                rubric
                    .get(from..)
                    .and_then(|r| r.find(key))
                    .map(|p| p + from)
            };
            match seg(0, ",\"weight_rationale\":")
                .and_then(|a| seg(a, ",\"category_weight\":").map(|b| (a, b)))
                .and_then(|(a, b)| seg(b, ",\"criteria\":").map(|c| (a, b, c)))
            {
                Some((a, b, c)) => format!(
                    "{}{}{}{}",
                    rubric.get(..a).unwrap_or(""),
                    rubric.get(b..c).unwrap_or(""),
                    rubric.get(a..b).unwrap_or(""),
                    rubric.get(c..).unwrap_or("")
                ),
                None => rubric.to_string(),
            }
        }
        "level_format" => rubric.replacen("[3] ", "[7] ", 1),
        "duplicate_title" => {
            // Give the second criterion the first one's title.
            let first = rubric
                .split("\"title\":\"")
                .nth(1)
                .and_then(|t| t.split('"').next())
                .unwrap_or("")
                .to_string();
            let mut parts = rubric.splitn(3, "\"title\":\"");
            let (a, b, c) = (parts.next(), parts.next(), parts.next());
            match (a, b, c) {
                (Some(a), Some(b), Some(c)) => {
                    let rest = c.split_once('"').map_or("", |(_, r)| r);
                    format!("{a}\"title\":\"{b}\"title\":\"{first}\"{rest}")
                }
                _ => rubric.to_string(),
            }
        }
        "missing_category" => {
            let start = rubric
                .find(",{\"category\":\"Proactive")
                .unwrap_or(rubric.len());
            let end = rubric.len().saturating_sub(2);
            if start < end {
                format!("{}]}}", rubric.get(..start).unwrap_or(""))
            } else {
                rubric.to_string()
            }
        }
        "category_order" => rubric
            .replacen("Cognitive Empathy", "@@", 1)
            .replacen("Affective Empathy", "Cognitive Empathy", 1)
            .replacen("@@", "Affective Empathy", 1),
        "trailing_text" => format!("<think>draft {}</think>\n{rubric}", rng.below(1000)),
        "not_json" => {
            // A generation cut off mid-way (a token limit).
            let cut = rubric.len() / 2 + rng.below((rubric.len() / 3) as u64) as usize;
            let mut cut = cut.min(rubric.len());
            while !rubric.is_char_boundary(cut) {
                cut -= 1;
            }
            rubric.get(..cut).unwrap_or("").to_string()
        }
        _ => {
            // A fifth criterion in the first category (criteria_count).
            let extra = "{\"title\":\"Extra criterion\",\"description\":\"[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5\"},";
            rubric.replacen(
                "\"criteria\":[",
                &format!("\"criteria\":[{extra}{extra}"),
                1,
            )
        }
    }
}

/// The compact (single-line) form of a fixture, so it fits on one JSON Lines line.
pub fn compact(text: &str) -> String {
    // The fixtures' only newlines are between tokens; strings hold no raw newline.
    let mut out = String::with_capacity(text.len());
    let mut in_str = false;
    let mut esc = false;
    for c in text.chars() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// `n` rubric texts: the two fixtures, then synthetic rubrics with 2..=4 criteria per
/// dimension, of which about one in four breaks the contract (cycling through [`BREAKS`]).
pub fn rubric_mix(n: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let text = match i {
            0 => compact(FIXTURE_1),
            1 => compact(FIXTURE_2),
            _ => {
                let per = [
                    2 + rng.below(3) as usize,
                    2 + rng.below(3) as usize,
                    2 + rng.below(3) as usize,
                ];
                let r = synth_rubric(&mut rng, per);
                if i % 4 == 3 {
                    break_rubric(&r, i / 4, &mut rng)
                } else {
                    r
                }
            }
        };
        out.push(text);
    }
    out
}

/// Criteria counts per dimension of a valid rubric text (for building score arrays).
pub fn criteria_counts(text: &str) -> Option<[usize; 3]> {
    let mut scratch = vec![0u8; text.len()];
    let v = care_core::validate(
        text.as_bytes(),
        &care_core::FormatPolicy::PAPER,
        &mut scratch,
    )
    .ok()?;
    if !v.is_valid() {
        return None;
    }
    v.rubric.map(|r| r.counts())
}

/// `m` responses' flat raw judge scores (integers `0..=5`) for a rubric with `total` criteria.
pub fn group_scores(rng: &mut Rng, total: usize, m: usize) -> Vec<f64> {
    (0..total * m).map(|_| rng.below(6) as f64).collect()
}

/// A judge answer for `rubric_text` (must be valid) with the given flat scores: a think block,
/// then a fenced json block, as reasoning judges write it.
pub fn judge_output(rubric_text: &str, scores: &[f64]) -> String {
    let mut scratch = vec![0u8; rubric_text.len()];
    // The paper policy is valid, so this is never `None`.
    let v = care_core::validate(
        rubric_text.as_bytes(),
        &care_core::FormatPolicy::PAPER,
        &mut scratch,
    )
    .ok();
    let mut s = String::from(
        "<think>Checking each criterion against the response.</think>\n```json\n{\"criterion_scores\":[",
    );
    if let Some(r) = v.and_then(|v| v.rubric) {
        for (i, ((dim, c), sc)) in r.iter_flat().zip(scores).enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"category\":");
            push_json_str(&mut s, dim.json_name());
            s.push_str(",\"criterion_title\":");
            push_json_str(&mut s, c.title);
            let _ = write!(s, ",\"score\":{sc}}}");
        }
    }
    s.push_str("]}\n```");
    s
}

/// `n` rewards as a CARE policy reward produces them (multiples of 1/30 in `[0, 1]`).
pub fn rewards(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(31) as f32 / 30.0).collect()
}

/// Inputs of one loss micro-batch of `tokens` tokens in sequences of `seq_len`: current and
/// old log-probs (the old ones perturbed so that some ratios clip), a mask with the first
/// tenth of each sequence masked out (the prompt), and one advantage per sequence.
#[derive(Clone, Debug)]
pub struct LossData {
    /// Current log-probs.
    pub logp: Vec<f32>,
    /// Rollout log-probs.
    pub logp_old: Vec<f32>,
    /// CSR sequence offsets.
    pub seq_offsets: Vec<u32>,
    /// 1 = counted token.
    pub mask: Vec<u8>,
    /// One advantage per sequence.
    pub advantages: Vec<f32>,
    /// The rollout engine's log-probs: `logp_old` plus a small mismatch (std 0.05), drawn from
    /// a second generator so that the other columns are those of earlier runs.
    pub logp_rollout: Vec<f32>,
}

/// See [`LossData`]; `tokens` is rounded down to a multiple of `seq_len` (`seq_len > 0`).
pub fn loss_data(tokens: usize, seq_len: usize, seed: u64) -> LossData {
    let mut rng = Rng::new(seed);
    let seq_len = seq_len.max(1);
    let b = tokens / seq_len;
    let t = b * seq_len;
    let mut logp = Vec::with_capacity(t);
    let mut logp_old = Vec::with_capacity(t);
    let mut mask = Vec::with_capacity(t);
    for i in 0..t {
        let lp = -(rng.unit() * 4.0) as f32;
        logp.push(lp);
        logp_old.push(lp + (0.15 * rng.normal()) as f32);
        mask.push(u8::from(i % seq_len >= seq_len / 10));
    }
    let seq_offsets = (0..=b).map(|i| (i * seq_len) as u32).collect();
    let advantages = (0..b).map(|_| rng.normal() as f32).collect();
    let mut mismatch = Rng::new(seed ^ 0x5eed);
    let logp_rollout = logp_old
        .iter()
        .map(|&o| o - (0.05 * mismatch.normal()) as f32)
        .collect();
    LossData {
        logp,
        logp_old,
        seq_offsets,
        mask,
        advantages,
        logp_rollout,
    }
}

/// Writes JSON Lines for `care validate` (`{"text": "<rubric text>"}`) until at least
/// `target_bytes` are written, cycling through a 100-rubric mix. Returns (lines, bytes).
pub fn write_validate_jsonl<W: Write + ?Sized>(
    w: &mut W,
    target_bytes: u64,
    seed: u64,
) -> io::Result<(u64, u64)> {
    let lines: Vec<String> = rubric_mix(100, seed)
        .iter()
        .map(|t| {
            let mut s = String::from("{\"text\":");
            push_json_str(&mut s, t);
            s.push_str("}\n");
            s
        })
        .collect();
    write_cycled(w, &lines, target_bytes)
}

/// Writes JSON Lines for `care score` until at least `target_bytes` are written: each line a
/// valid rubric object and a GRPO group of `group` judged responses,
/// `{"rubric": {..}, "responses": [{"scores": [[cog..],[aff..],[pro..]]}, ..]}`. Returns
/// (lines, bytes).
pub fn write_score_jsonl<W: Write + ?Sized>(
    w: &mut W,
    target_bytes: u64,
    group: usize,
    seed: u64,
) -> io::Result<(u64, u64)> {
    let mut rng = Rng::new(seed ^ 0x5C0E);
    let lines: Vec<String> = rubric_mix(100, seed)
        .into_iter()
        .filter_map(|t| criteria_counts(&t).map(|c| (t, c)))
        .map(|(t, counts)| {
            let mut s = String::from("{\"rubric\":");
            s.push_str(&t);
            s.push_str(",\"responses\":[");
            for j in 0..group {
                if j > 0 {
                    s.push(',');
                }
                s.push_str("{\"scores\":[");
                for (d, &c) in counts.iter().enumerate() {
                    if d > 0 {
                        s.push(',');
                    }
                    s.push('[');
                    for k in 0..c {
                        if k > 0 {
                            s.push(',');
                        }
                        let _ = write!(s, "{}", rng.below(6));
                    }
                    s.push(']');
                }
                s.push_str("]}");
            }
            s.push_str("]}\n");
            s
        })
        .collect();
    write_cycled(w, &lines, target_bytes)
}

/// Pretty-prints compact JSON `text` the way `json.dumps(obj, indent=2)` and most generator
/// models write it: one member or element per line, two spaces per level, `": "` after keys.
/// Empty objects and arrays stay `{}` / `[]`. Text that is not JSON is re-indented as far as
/// its brackets go (the broken rubrics of the mix stay broken the same way).
pub fn pretty(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let indent = |out: &mut String, d: usize| {
        out.push('\n');
        for _ in 0..d {
            out.push_str("  ");
        }
    };
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                if matches!(chars.peek(), Some('}' | ']')) {
                    if let Some(close) = chars.next() {
                        out.push(close);
                    }
                } else {
                    depth += 1;
                    indent(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                indent(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                indent(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// The input shapes of the command-line benchmarks, by name (`care-bench-gen shape NAME ..`,
/// `benches/compare/shapes.sh`, the criterion `cli/shape` group).
///
/// * `objects`: a valid rubric object per line (the line is the rubric).
/// * `text`: `{"text": "<compact rubric>"}`, valid.
/// * `pretty`: `{"text": "<pretty-printed rubric>"}`, valid; newlines and indentation are
///   `\n` escapes and spaces inside the string, as generators write it.
/// * `mixed30`: `{"text": "<compact rubric>"}` where 3 lines in 10 break the contract: a
///   wrong weight (`weight_sum`) or a missing level anchor (`level_format`).
/// * `score-scores`: `{"rubric": {..}, "scores": [[..],[..],[..]]}`, one response per line.
/// * `score-judge`: `{"rubric": {..}, "judge": "<judge answer text>"}`, one response per line.
/// * `score-group8`: `{"rubric": {..}, "responses": [8 x {"scores": ..}]}`, a GRPO group.
pub const SHAPES: [&str; 7] = [
    "objects",
    "text",
    "pretty",
    "mixed30",
    "score-scores",
    "score-judge",
    "score-group8",
];

/// The 100 distinct lines (newline included) that [`write_shape_jsonl`] cycles through for
/// `shape` (one of [`SHAPES`]); `None` for an unknown shape.
pub fn shape_lines(shape: &str, seed: u64) -> Option<Vec<String>> {
    let mut rng = Rng::new(seed ^ 0x5A9E);
    // Valid rubrics only: the mix's fixtures and unbroken synthetic rubrics, topped up with
    // fresh synthetic ones to 100.
    let mut valid: Vec<(String, [usize; 3])> = rubric_mix(100, seed)
        .into_iter()
        .filter_map(|t| criteria_counts(&t).map(|c| (t, c)))
        .collect();
    while valid.len() < 100 {
        let per = [
            2 + rng.below(3) as usize,
            2 + rng.below(3) as usize,
            2 + rng.below(3) as usize,
        ];
        valid.push((synth_rubric(&mut rng, per), per));
    }
    let text_line = |t: &str| {
        let mut s = String::from("{\"text\":");
        push_json_str(&mut s, t);
        s.push_str("}\n");
        s
    };
    let scores = |rng: &mut Rng, counts: &[usize; 3], out: &mut String| {
        out.push('[');
        for (d, &c) in counts.iter().enumerate() {
            if d > 0 {
                out.push(',');
            }
            out.push('[');
            for k in 0..c {
                if k > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{}", rng.below(6));
            }
            out.push(']');
        }
        out.push(']');
    };
    let lines = valid
        .iter()
        .enumerate()
        .map(|(i, (t, counts))| match shape {
            "objects" => format!("{t}\n"),
            "text" => text_line(t),
            "pretty" => text_line(&pretty(t)),
            "mixed30" if i % 10 < 3 => {
                // weight_sum or level_format (BREAKS[0] and BREAKS[2]).
                text_line(&break_rubric(t, if i % 2 == 0 { 0 } else { 2 }, &mut rng))
            }
            "mixed30" => text_line(t),
            "score-scores" => {
                let mut s = format!("{{\"rubric\":{t},\"scores\":");
                scores(&mut rng, counts, &mut s);
                s.push_str("}\n");
                s
            }
            "score-judge" => {
                let total = counts.iter().sum();
                let flat = group_scores(&mut rng, total, 1);
                let mut s = format!("{{\"rubric\":{t},\"judge\":");
                push_json_str(&mut s, &judge_output(t, &flat));
                s.push_str("}\n");
                s
            }
            _ => {
                let mut s = format!("{{\"rubric\":{t},\"responses\":[");
                for j in 0..8 {
                    if j > 0 {
                        s.push(',');
                    }
                    s.push_str("{\"scores\":");
                    scores(&mut rng, counts, &mut s);
                    s.push('}');
                }
                s.push_str("]}\n");
                s
            }
        })
        .collect();
    SHAPES.contains(&shape).then_some(lines)
}

/// Writes JSON Lines of `shape` (one of [`SHAPES`]) until at least `target_bytes` are written.
/// Returns (lines, bytes); an unknown shape is an `InvalidInput` error.
pub fn write_shape_jsonl<W: Write + ?Sized>(
    w: &mut W,
    shape: &str,
    target_bytes: u64,
    seed: u64,
) -> io::Result<(u64, u64)> {
    let lines = shape_lines(shape, seed).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown shape {shape:?} (one of {})", SHAPES.join(", ")),
        )
    })?;
    write_cycled(w, &lines, target_bytes)
}

fn write_cycled<W: Write + ?Sized>(
    w: &mut W,
    lines: &[String],
    target_bytes: u64,
) -> io::Result<(u64, u64)> {
    let (mut n, mut bytes) = (0u64, 0u64);
    if lines.is_empty() {
        return Ok((0, 0));
    }
    while bytes < target_bytes {
        let line = &lines[(n as usize) % lines.len()];
        w.write_all(line.as_bytes())?;
        n += 1;
        bytes += line.len() as u64;
    }
    Ok((n, bytes))
}

#[cfg(test)]
#[allow(clippy::expect_used)] // tests: a failed expectation is a failed test
mod tests {
    use super::*;
    use care_core::{FormatPolicy, ViolationCode, validate};

    fn check(text: &str) -> care_core::Report {
        let mut scratch = vec![0u8; text.len()];
        validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
            .expect("the paper policy is valid")
            .report
    }

    #[test]
    fn synthetic_rubrics_are_valid_for_every_criteria_count() {
        let mut rng = Rng::new(7);
        for per in [[2, 2, 2], [4, 3, 2], [4, 4, 4]] {
            let r = synth_rubric(&mut rng, per);
            assert!(check(&r).is_ok(), "{r}");
            assert_eq!(criteria_counts(&r), Some(per));
        }
    }

    #[test]
    fn fixtures_compact_to_valid_single_lines() {
        for f in [FIXTURE_1, FIXTURE_2] {
            let c = compact(f);
            assert!(!c.contains('\n'));
            assert!(check(&c).is_ok());
        }
    }

    #[test]
    fn each_break_makes_the_validator_report_its_code() {
        let mut rng = Rng::new(3);
        let base = synth_rubric(&mut rng, [3, 3, 3]);
        for (kind, name) in BREAKS.iter().enumerate() {
            let broken = break_rubric(&base, kind, &mut rng);
            let rep = check(&broken);
            let code = ViolationCode::from_str_code(name).expect("BREAKS names are codes");
            assert!(rep.has(code), "{name}: {:?}", rep.violations());
        }
    }

    #[test]
    fn mix_holds_valid_and_broken_rubrics() {
        let mix = rubric_mix(100, 1);
        let valid = mix.iter().filter(|t| check(t).is_ok()).count();
        assert_eq!(mix.len(), 100);
        // 2 fixtures + 3 of every 4 synthetic ones are valid; the rest break (i % 4 == 3).
        assert_eq!(valid, 100 - 25);
    }

    #[test]
    fn judge_output_round_trips_through_the_parser() {
        let r = compact(FIXTURE_1);
        let mut rng = Rng::new(9);
        let counts = criteria_counts(&r).expect("fixture is valid");
        let total: usize = counts.iter().sum();
        let scores = group_scores(&mut rng, total, 1);
        let text = judge_output(&r, &scores);
        let mut scratch = vec![0u8; r.len()];
        let v = validate(r.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
            .expect("the paper policy is valid");
        let rubric = v.rubric.expect("fixture parses");
        let mut out = vec![0.0; total];
        let rep =
            care_core::parse_judge_output(text.as_bytes(), &rubric, &mut out).expect("parses");
        assert!(rep.is_clean());
        assert_eq!(out, scores);
    }

    #[test]
    fn jsonl_writers_reach_the_target_with_whole_lines() {
        let mut buf = Vec::new();
        let (lines, bytes) = write_validate_jsonl(&mut buf, 50_000, 1).expect("vec write");
        assert!(bytes >= 50_000 && bytes == buf.len() as u64);
        assert_eq!(buf.iter().filter(|&&c| c == b'\n').count() as u64, lines);
        let mut buf = Vec::new();
        let (lines, _) = write_score_jsonl(&mut buf, 20_000, 6, 1).expect("vec write");
        let first = buf.split(|&c| c == b'\n').next().expect("one line");
        assert!(first.starts_with(b"{\"rubric\":{\"categories\""));
        assert!(lines > 0);
    }

    #[test]
    fn pretty_printing_keeps_the_value() {
        let r = compact(FIXTURE_1);
        let p = pretty(&r);
        assert!(p.contains("\n  \"categories\": ["));
        assert_eq!(compact(&p), r);
        assert!(check(&p).is_ok());
        assert_eq!(
            pretty("{\"a\":[],\"b\":{}}"),
            "{\n  \"a\": [],\n  \"b\": {}\n}"
        );
    }

    #[test]
    fn shapes_have_the_documented_content() {
        for shape in SHAPES {
            let lines = shape_lines(shape, 1).expect("known shape");
            assert_eq!(lines.len(), 100, "{shape}");
            assert!(
                lines
                    .iter()
                    .all(|l| l.ends_with('\n') && l.matches('\n').count() == 1)
            );
        }
        let text = |l: &str| -> String {
            let inner = l.trim_end().strip_prefix("{\"text\":").expect("text line");
            let inner = inner.strip_suffix('}').expect("closing brace");
            // Undo push_json_str for the escapes it writes.
            let body = inner.trim_matches('"');
            body.replace("\\n", "\n").replace("\\\"", "\"")
        };
        let valid = |shape: &str| {
            shape_lines(shape, 1)
                .expect("known shape")
                .iter()
                .filter(|l| check(&text(l)).is_ok())
                .count()
        };
        assert_eq!(valid("text"), 100);
        assert_eq!(valid("pretty"), 100);
        assert_eq!(valid("mixed30"), 70);
        let objects = shape_lines("objects", 1).expect("known shape");
        assert!(objects.iter().all(|l| check(l.trim_end()).is_ok()));
        assert!(shape_lines("pretty", 1).expect("known")[0].contains("\\n  \\\"categories"));
        assert!(shape_lines("nope", 1).is_none());
        let g = shape_lines("score-group8", 1).expect("known shape");
        assert_eq!(g[0].matches("{\"scores\":").count(), 8);
    }

    #[test]
    fn loss_data_masks_the_prompt_tenth() {
        let d = loss_data(1000, 100, 5);
        assert_eq!(d.seq_offsets.len(), 11);
        assert_eq!(d.advantages.len(), 10);
        assert_eq!(d.mask.iter().filter(|&&m| m == 0).count(), 100);
    }
}
