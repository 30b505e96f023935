//! `care score`: the policy reward (Eq. 5) of judged responses under a rubric.

use std::borrow::Cow;

use care_core::reward::{Fired, PolicyReward};
use care_core::{
    FormatPolicy, JudgeReport, Rubric, ScoreOptions, Validation, parse_judge_output, policy_reward,
};

use super::rubric::{
    Scratch, explain_score_error, flatten_scores, member_text, validate_rubric, write_fired,
};

use crate::input::{Line, Members, check_members, object, raw_array, score_matrix, string};
use crate::json::{LineError, Obj};

/// Resolved options of `care score`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Scoring policies.
    pub score: ScoreOptions,
    /// Format policy used to parse the rubric.
    pub format: FormatPolicy,
}

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &["rubric", "scores", "judge", "responses"];

/// The members of one object of `responses`.
const RESPONSE_MEMBERS: &[&str] = &["scores", "judge"];

/// Reads `{"rubric", "scores" | "judge" | "responses"}`; writes `reward` and `per_dimension`
/// (a single response) or `rewards`, `per_dimension` and `errors` (a group), plus the rubric's
/// `format_reward`, the `weights` used and the policies that `fired`.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    let text = member_text(line, "rubric")?;
    let mut scratch = Scratch::take(text.len());
    // Written in place: a `Validation` is kilobytes, and this runs once per line.
    let mut v = Validation::default();
    validate_rubric(line, text, &opts.format, scratch.buf(), &mut v)?;
    let Some(rubric) = v.rubric.as_ref() else {
        let first = v
            .report
            .violations()
            .first()
            .map_or_else(|| "the rubric did not parse".to_owned(), |x| x.to_string());
        return Err(LineError::new(
            care_core::Error::FormatViolation.code(),
            format!("rubric: {first}"),
        ));
    };
    let r_fmt = v.r_fmt();
    // The member's exact text: building its `RawValue` would read the whole array once more.
    if let Some(responses) = m.text("responses") {
        if m.contains_key("scores") || m.contains_key("judge") {
            return Err(LineError::schema(
                "give \"responses\" or a single \"scores\"/\"judge\", not both",
            ));
        }
        return run_group(opts, rubric, r_fmt, m, responses, o);
    }
    // A top-level judge answer was decoded with the line's other top-level strings.
    let (scores, judge) = response_scores(rubric, m, "", line.string("judge"))?;
    let key = if judge.is_some() { "judge" } else { "scores" };
    let r = policy_reward(rubric, &scores, &opts.score)
        .map_err(|e| explain_score_error(e, rubric, &scores, key))?;
    o.f64("reward", r.reward);
    o.f64s("per_dimension", &r.dim_means);
    o.f64s("weights", &r.weights);
    o.u64("format_reward", u64::from(r_fmt == 1.0));
    write_fired(o, &r.fired);
    if let Some(j) = judge {
        o.obj("judge", |x| write_judge(x, &j));
    }
    Ok(())
}

/// The flat raw scores of one response object (`scores` or `judge`), and the judge report.
/// `decoded_judge`: the `judge` string already decoded (a top-level member of the line), if any.
fn response_scores(
    rubric: &Rubric<'_>,
    m: &Members<'_>,
    at: &str,
    decoded_judge: Option<&str>,
) -> Result<(Vec<f64>, Option<JudgeReport>), LineError> {
    // The common shape in one pass over the member's text (no `RawValue`, no serde pass);
    // anything else, and every error, the general way below.
    if let (Some(t), false) = (m.text("scores"), m.contains_key("judge")) {
        let mut flat = Vec::with_capacity(rubric.total_criteria());
        let mut c = Bytes::new(t);
        if c.matrix(rubric.counts(), &mut flat).is_some() && c.at_end() {
            return Ok((flat, None));
        }
    }
    // A judge answer without `\u` escapes is decoded straight from its text (the line passed
    // the strict check, so its escapes are valid); one with them, which may hold surrogate
    // pairs, is decoded by serde_json.
    let mut buf = String::new();
    let judge_text = match (m.text("judge"), m.contains_key("scores")) {
        (Some(_), false) if decoded_judge.is_some() => decoded_judge.map(Cow::Borrowed),
        (Some(t), false) if t.starts_with('"') && !t.contains("\\u") => {
            Some(Cow::Borrowed(crate::scan::decode_string(t, &mut buf)))
        }
        _ => None,
    };
    let not_a_string = || {
        LineError::schema(format!(
            "\"{at}judge\" must be a string (the judge's output text)"
        ))
    };
    match (m.get("scores"), m.contains_key("judge")) {
        (Some(s), false) => {
            let key = format!("{at}scores");
            Ok((flatten_scores(rubric, score_matrix(s, &key)?, &key)?, None))
        }
        (None, true) => {
            let j = match judge_text {
                Some(t) => t,
                None => m.get("judge").and_then(string).ok_or_else(not_a_string)?,
            };
            let mut out = vec![f64::NAN; rubric.total_criteria()];
            let rep = parse_judge_output(j.as_bytes(), rubric, &mut out)
                .map_err(|e| LineError::core(e, &format!("{at}judge")))?;
            Ok((out, Some(rep)))
        }
        (Some(_), true) => Err(LineError::schema(format!(
            "give \"{at}scores\" or \"{at}judge\", not both"
        ))),
        (None, false) => Err(LineError::schema(format!(
            "missing key \"{at}scores\" (or \"{at}judge\", or \"responses\")"
        ))),
    }
}

/// A whole GRPO group under one rubric (parsed once): a response that breaks an `error` policy,
/// or whose scores cannot be read, gets a `null` reward (an invalid sample for
/// `care advantages`, exactly as the core's `policy_reward_group` gives it NaN) and an entry in
/// `errors`; the line itself still succeeds.
fn run_group(
    opts: &Options,
    rubric: &Rubric<'_>,
    r_fmt: f64,
    m: &Members<'_>,
    responses: &str,
    o: &mut Obj<'_>,
) -> Result<(), LineError> {
    let mut judges = Vec::new();
    let mut flat = Vec::new();
    // Scored one by one (not through `policy_reward_group`) to keep each response's per-dimension
    // means and its own error; `policy_reward_group` keeps only the first error.
    let details: Vec<Result<PolicyReward, LineError>> = if let Some(n) =
        score_rows(responses, rubric.counts(), &mut flat)
    {
        // The common shape, read in one pass: what the general path below gives for it.
        let total = rubric.total_criteria();
        judges.resize(n, None);
        flat.chunks_exact(total)
            .enumerate()
            .map(|(j, scores)| {
                policy_reward(rubric, scores, &opts.score)
                    .map_err(|e| explain_score_error(e, rubric, scores, &format!("responses[{j}]")))
            })
            .collect()
    } else {
        let raw = m
            .get("responses")
            .ok_or_else(|| LineError::schema("\"responses\" must be an array"))?;
        let list = raw_array(raw, "responses")?;
        judges.reserve(list.len());
        list.iter()
            .enumerate()
            .map(|(j, resp)| {
                let at = format!("responses[{j}].");
                let (scores, rep) = Members::of(resp)
                    .ok_or_else(|| {
                        LineError::schema(format!("\"responses\"[{j}] must be an object"))
                    })
                    .and_then(|rm| {
                        check_members(&rm, RESPONSE_MEMBERS, &format!("\"responses\"[{j}]: "))?;
                        response_scores(rubric, &rm, &at, None)
                    })
                    .inspect_err(|_| judges.push(None))?;
                judges.push(rep);
                policy_reward(rubric, &scores, &opts.score).map_err(|e| {
                    explain_score_error(e, rubric, &scores, &format!("responses[{j}]"))
                })
            })
            .collect()
    };
    let rewards: Vec<f64> = details
        .iter()
        .map(|d| d.as_ref().map_or(f64::NAN, |p| p.reward))
        .collect();
    let mut fired = Fired::default();
    for p in details.iter().flatten() {
        fired.merge(&p.fired);
    }
    o.f64s("rewards", &rewards);
    o.arr("per_dimension", |a| {
        for d in &details {
            match d {
                Ok(p) => {
                    a.f64s(&p.dim_means);
                }
                Err(_) => {
                    a.null();
                }
            }
        }
    });
    let failed = details.iter().filter(|d| d.is_err()).count();
    o.u64("failed", failed as u64);
    o.arr("errors", |a| {
        for d in &details {
            match d {
                Ok(_) => {
                    a.null();
                }
                Err(e) => {
                    a.obj(|x| {
                        x.str("code", e.code).str("message", &e.message);
                    });
                }
            }
        }
    });
    let weights = details
        .iter()
        .find_map(|d| d.as_ref().ok().map(|p| p.weights))
        .unwrap_or_else(|| rubric.weights());
    o.f64s("weights", &weights);
    o.u64("format_reward", u64::from(r_fmt == 1.0));
    write_fired(o, &fired);
    if judges.iter().any(Option::is_some) {
        o.arr("judge", |a| {
            for j in &judges {
                match j {
                    Some(rep) => {
                        a.obj(|x| write_judge(x, rep));
                    }
                    None => {
                        a.null();
                    }
                }
            }
        });
    }
    Ok(())
}

/// The score rows of a `responses` array in its common shape, `[{"scores": [[..], [..],
/// [..]]}, ...]` with non-negative integers and `counts[d]` of them in dimension `d`, appended
/// to `flat` (one row of `counts` criteria per response), and their number. `None` (with
/// `flat` in any state) for anything else: another member, `judge`, `null`, a sign, fraction
/// or exponent, an escaped key, a count that differs from the rubric's, an empty array; the
/// general path reads those (and words their errors). `text` is the member's text from a line
/// that passed the strict check, so it is valid JSON; this only recognizes its shape.
fn score_rows(text: &str, counts: [usize; 3], flat: &mut Vec<f64>) -> Option<usize> {
    // A rubric without criteria has empty rows, which `chunks_exact` cannot split.
    if counts.iter().sum::<usize>() == 0 {
        return None;
    }
    let mut c = Bytes::new(text);
    c.eat(b'[')?;
    let mut n = 0;
    loop {
        c.eat(b'{')?;
        c.literal(b"\"scores\"")?;
        c.eat(b':')?;
        c.matrix(counts, flat)?;
        c.eat(b'}')?;
        n += 1;
        match c.next()? {
            b',' => {}
            b']' => break,
            _ => return None,
        }
    }
    c.at_end().then_some(n)
}

/// A cursor over valid JSON text for [`score_rows`].
struct Bytes<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Bytes<'a> {
    fn new(text: &'a str) -> Self {
        Bytes {
            b: text.as_bytes(),
            i: 0,
        }
    }

    /// A score matrix `[[..], [..], [..]]` of `counts[d]` small integers per dimension,
    /// appended to `flat`.
    fn matrix(&mut self, counts: [usize; 3], flat: &mut Vec<f64>) -> Option<()> {
        self.eat(b'[')?;
        for (d, &want) in counts.iter().enumerate() {
            if d > 0 {
                self.eat(b',')?;
            }
            self.eat(b'[')?;
            for k in 0..want {
                if k > 0 {
                    self.eat(b',')?;
                }
                flat.push(self.small_uint()?);
            }
            self.eat(b']')?;
        }
        self.eat(b']')
    }

    /// Only whitespace is left.
    fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.i == self.b.len()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace.
    fn next(&mut self) -> Option<u8> {
        self.skip_ws();
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn literal(&mut self, want: &[u8]) -> Option<()> {
        self.skip_ws();
        let end = self.i + want.len();
        (self.b.get(self.i..end)? == want).then(|| self.i = end)
    }

    /// A JSON integer `0..=10^15 - 1` without sign, fraction or exponent, as `f64` (exact:
    /// below 2^53), as `serde_json` reads it.
    fn small_uint(&mut self) -> Option<f64> {
        self.skip_ws();
        let start = self.i;
        let mut v: u64 = 0;
        while let Some(&d @ b'0'..=b'9') = self.b.get(self.i) {
            v = v * 10 + u64::from(d - b'0');
            self.i += 1;
            if self.i - start > 15 {
                return None;
            }
        }
        match self.b.get(self.i) {
            _ if self.i == start => None,
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(v as f64),
        }
    }
}

/// The judge-output parser's findings.
pub fn write_judge(x: &mut Obj<'_>, j: &JudgeReport) {
    x.u64("matched", u64::from(j.matched))
        .u64("case_insensitive", u64::from(j.case_insensitive))
        .u64("missing", u64::from(j.missing))
        .u64("duplicates", u64::from(j.duplicates))
        .u64("unknown", u64::from(j.unknown))
        .u64("invalid_scores", u64::from(j.invalid_scores))
        .u64("out_of_range", u64::from(j.out_of_range))
        .u64("malformed_items", u64::from(j.malformed_items));
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    const RUBRIC: &str = include_str!("../../data/rubric_sft_1.json");

    /// The rows the general path reads from `text` (serde, `score_matrix`, `flatten_scores`):
    /// every response's flat scores, or `None` when some response is not read as scores.
    fn general_rows(text: &str, rubric: &Rubric<'_>) -> Option<Vec<f64>> {
        let raw: &RawValue = serde_json::from_str(text).ok()?;
        let list = raw_array(raw, "responses").ok()?;
        let mut flat = Vec::new();
        for resp in list {
            let m = Members::of(resp)?;
            check_members(&m, &["scores"], "").ok()?;
            flat.extend(general_matrix(m.get("scores")?, rubric)?);
        }
        Some(flat)
    }

    fn general_matrix(v: &RawValue, rubric: &Rubric<'_>) -> Option<Vec<f64>> {
        flatten_scores(rubric, score_matrix(v, "scores").ok()?, "scores").ok()
    }

    /// One response in the common shape for `counts`, with the given spacing.
    fn response(counts: [usize; 3], values: &[u64], ws: &str) -> String {
        let mut it = values.iter().cycle();
        let dims: Vec<String> = counts
            .iter()
            .map(|&n| {
                let v: Vec<String> = (0..n).map(|_| it.next().unwrap().to_string()).collect();
                format!("[{ws}{}{ws}]", v.join(&format!("{ws},{ws}")))
            })
            .collect();
        format!(
            "{{{ws}\"scores\"{ws}:{ws}[{}]{ws}}}",
            dims.join(&format!(",{ws}"))
        )
    }

    fn with_rubric<R>(f: impl FnOnce(&Rubric<'_>) -> R) -> R {
        let mut scratch = vec![0u8; RUBRIC.len()];
        let v = care_core::validate_str(RUBRIC, &FormatPolicy::PAPER, &mut scratch).unwrap();
        f(v.rubric.as_ref().unwrap())
    }

    #[test]
    fn the_common_shape_is_read_in_one_pass() {
        with_rubric(|r| {
            let one = response(r.counts(), &[0, 5, 3, 12, 1], "");
            let text = format!("[{one}, {one} ,\n{one}]");
            let mut flat = Vec::new();
            assert_eq!(score_rows(&text, r.counts(), &mut flat), Some(3));
            assert_eq!(Some(flat), general_rows(&text, r));
        });
    }

    #[test]
    fn other_shapes_are_left_to_the_general_path() {
        // A rubric without criteria: empty rows are the general path's to read.
        let mut flat = Vec::new();
        assert_eq!(
            score_rows(r#"[{"scores":[[],[],[]]}]"#, [0; 3], &mut flat),
            None
        );
        with_rubric(|r| {
            let counts = r.counts();
            let one = response(counts, &[1, 2], "");
            let cases = [
                "[]".to_owned(),
                "null".to_owned(),
                one.replace("\"scores\"", "\"sc\\u006fres\""),
                one.replace('1', "1.0"),
                one.replace('1', "1e0"),
                one.replace('1', "-1"),
                one.replace('1', "null"),
                one.replace('{', "{\"id\":1,"),
                "[{\"judge\":\"x\"}]".to_owned(),
                format!(
                    "[{}]",
                    response([counts[0] + 1, counts[1], counts[2]], &[1], "")
                ),
                format!("[{one}]").replace('1', "1234567890123456"),
            ];
            for text in cases {
                let text = if text.starts_with('[') || text == "null" {
                    text
                } else {
                    format!("[{text}]")
                };
                let mut flat = Vec::new();
                assert_eq!(score_rows(&text, counts, &mut flat), None, "{text}");
            }
        });
    }

    #[test]
    fn a_judge_answer_reads_the_same_whatever_its_escapes() {
        with_rubric(|r| {
            // Every criterion scored 3, as a JSON string literal holding the judge's text.
            let mut items = Vec::new();
            for d in care_core::Dimension::ALL {
                for c in r.criteria(d) {
                    items.push(format!(
                        r#"{{\"category\":\"{}\",\"criterion_title\":\"{}\",\"score\":3}}"#,
                        d.json_name(),
                        c.title
                    ));
                }
            }
            let judge = |think: &str| {
                format!(
                    r#"{{"judge":"<think>{think}</think>\n{{\"criterion_scores\":[{}]}}"}}"#,
                    items.join(",")
                )
            };
            let mut got = Vec::new();
            // With `\u` escapes (a surrogate pair: serde_json decodes) and without (decoded
            // straight from the text).
            for text in [judge(r"\ud83d\ude00 ok"), judge(r"\/ ok")] {
                let line = Line::parse(&text).unwrap();
                let m = object(&line).unwrap();
                let (scores, rep) = response_scores(r, m, "", None).unwrap();
                let (again, _) = response_scores(r, m, "", line.string("judge")).unwrap();
                assert_eq!(
                    scores, again,
                    "the line's decoded judge string reads the same"
                );
                assert!(rep.is_some());
                got.push(scores);
            }
            assert_eq!(got[0], got[1]);
            assert!(got[0].iter().all(|&s| s == 3.0), "{:?}", got[0]);
        });
    }

    proptest! {
        /// Whenever the one-pass reader reads an array, the general path reads the same rows
        /// from it (the relation the fast path rests on), on mutated arrays of the common shape.
        #[test]
        fn one_pass_rows_equal_the_general_rows(
            values in proptest::collection::vec(0u64..2_000_000, 1..12),
            n in 1usize..5,
            ws in prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r")],
            cut in any::<proptest::sample::Index>(),
            byte in prop_oneof![Just(b'-'), Just(b'.'), Just(b'e'), Just(b' '), Just(b'0'), Just(b'x'), Just(b','), Just(b'"')],
            mutate in any::<bool>(),
        ) {
            with_rubric(|r| {
                let one = response(r.counts(), &values, ws);
                let mut text = format!("[{}]", vec![one; n].join(","));
                if mutate {
                    let i = cut.index(text.len());
                    text.insert(i, byte as char);
                }
                // Only valid JSON reaches the reader (the line passed the strict check).
                if serde_json::from_str::<serde_json::Value>(&text).is_err() {
                    return Ok(());
                }
                let mut flat = Vec::new();
                if let Some(k) = score_rows(&text, r.counts(), &mut flat) {
                    prop_assert_eq!(k * r.total_criteria(), flat.len());
                    prop_assert_eq!(Some(flat), general_rows(&text, r));
                } else {
                    prop_assert!(mutate, "an unmutated array of the common shape is read: {}", text);
                }
                // One response's matrix, as `care score` reads a single `"scores"`.
                let one = text.trim_start().strip_prefix("[{\"scores\":").and_then(|t| {
                    let end = t.find('}')?;
                    Some(&t[..end])
                });
                if let Some(m) = one.filter(|m| serde_json::from_str::<&RawValue>(m).is_ok()) {
                    let mut c = Bytes::new(m);
                    let mut flat = Vec::new();
                    if c.matrix(r.counts(), &mut flat).is_some() && c.at_end() {
                        let raw: &RawValue = serde_json::from_str(m).unwrap();
                        prop_assert_eq!(Some(flat), general_matrix(raw, r));
                    }
                }
                Ok(())
            })?;
        }
    }
}
