//! Shared by `validate`, `score` and `pref`: where a line's rubric text comes from, and how a
//! validation is written.

use std::cell::Cell;

use crate::input::Line;
use crate::json::{Arr, LineError, Obj};
use care_core::{
    FormatPolicy, Report, Rubric, Validation, validate_indexed_into, validate_str_into,
};

/// A scratch buffer of at least `len` bytes for `care_core::validate_str`, reused across the
/// lines a worker thread processes: a fresh zeroed buffer per line was a visible cost of
/// `care validate` on JSONL. The buffer goes back to the thread when the guard drops, unless it
/// grew past [`Scratch::KEEP_MAX`] (a rare huge line does not pin its memory).
pub struct Scratch(Vec<u8>);

thread_local! {
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Scratch {
    /// Largest buffer kept for the next line.
    pub const KEEP_MAX: usize = 1 << 20;

    /// Takes the thread's buffer, grown to at least `len` bytes.
    pub fn take(len: usize) -> Self {
        let mut buf = SCRATCH.with(Cell::take);
        if buf.len() < len {
            buf.resize(len, 0);
        }
        Scratch(buf)
    }

    /// The buffer (its old contents are irrelevant: the validator writes before it reads).
    pub fn buf(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.len() <= Self::KEEP_MAX {
            let buf = std::mem::take(&mut self.0);
            SCRATCH.with(|c| c.set(buf));
        }
    }
}

/// The rubric text of member `key`: a JSON string is the raw generator output itself; any other
/// JSON value (normally an object) is validated as the exact text it has in the line, so key
/// order and number spelling reach the validator unchanged.
pub fn member_text<'l>(line: &'l Line<'_>, key: &str) -> Result<&'l str, LineError> {
    let raw = line
        .raw_text(key)
        .ok_or_else(|| LineError::schema(format!("missing key \"{key}\"")))?;
    Ok(line.string(key).unwrap_or(raw))
}

/// Validates the line's `"rubric"` member, whose text `text` is (from [`member_text`]), into
/// `out`: an object member by the index the line's one-pass check made of it
/// ([`Line::rubric_index`]), so its bytes are read once; a string member (raw generator output)
/// or a line from the reference path by the validator's own syntax pass. The result is the same.
pub fn validate_rubric<'a>(
    line: &Line<'_>,
    text: &'a str,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
    out: &mut Validation<'a>,
) -> care_core::Result<()> {
    match line.rubric_index() {
        Some(index) if line.string("rubric").is_none() => {
            // The scan's index must say what the validator's own pass would (tests, fuzzing).
            debug_assert!(index.matches(text), "scan index disagrees on {text:?}");
            validate_indexed_into(text, index, policy, scratch, out)
        }
        _ => validate_str_into(text, policy, scratch, out),
    }
}

/// Writes `violations` (code, category and criterion indices or null, message) and, when the
/// report overflowed, `violations_truncated: true`.
pub fn write_violations(o: &mut Obj<'_>, report: &Report) {
    o.arr("violations", |a: &mut Arr<'_>| {
        for v in report.violations() {
            a.obj(|x| {
                x.str("code", v.code.as_str())
                    .opt_u64("category", v.category.map(u64::from))
                    .opt_u64("criterion", v.criterion.map(u64::from))
                    .str("message", &v.to_string());
            });
        }
    });
    if report.overflowed() {
        o.bool("violations_truncated", true);
    }
}

/// Writes `weights` (as parsed, canonical order) and `criteria` (count per dimension).
pub fn write_shape(o: &mut Obj<'_>, rubric: &Rubric<'_>) {
    o.f64s("weights", &rubric.weights());
    let counts = rubric.counts();
    o.arr("criteria", |a| {
        for c in counts {
            a.u64(c as u64);
        }
    });
}

/// Flattens a `[[cog..],[aff..],[pro..]]` score matrix into the rubric's flat order, `NaN`
/// for a missing (`null`) score, after checking it has one score per criterion.
pub fn flatten_scores(
    rubric: &Rubric<'_>,
    matrix: [Vec<Option<f64>>; 3],
    key: &str,
) -> Result<Vec<f64>, LineError> {
    let counts = rubric.counts();
    let mut flat = Vec::with_capacity(rubric.total_criteria());
    for (d, (dim, want)) in matrix.iter().zip(counts).enumerate() {
        if dim.len() != want {
            let name = care_core::Dimension::from_index(d).map_or("?", |x| x.json_name());
            return Err(LineError::new(
                care_core::Error::ScoreShape.code(),
                format!(
                    "\"{key}\"[{d}] has {} scores but the rubric has {want} {name} criteria",
                    dim.len()
                ),
            ));
        }
        flat.extend(dim.iter().map(|s| s.unwrap_or(f64::NAN)));
    }
    Ok(flat)
}

/// Writes which scoring policies changed the input (SPEC §7: no silent defaults).
pub fn write_fired(o: &mut Obj<'_>, f: &care_core::reward::Fired) {
    o.obj("fired", |x| {
        x.u64("missing_zeroed", u64::from(f.missing_zeroed))
            .u64("missing_skipped", u64::from(f.missing_skipped))
            .u64("clamped", u64::from(f.clamped))
            .bool("weights_adjusted", f.weights_adjusted)
            .bool("uniform_weights", f.uniform_weights);
    });
}

/// A scoring error with the criterion that caused it: the core reports *what* went wrong
/// (`missing_score`, `score_out_of_range`); the line should also say *where*.
pub fn explain_score_error(
    err: care_core::Error,
    rubric: &Rubric<'_>,
    flat: &[f64],
    key: &str,
) -> LineError {
    locate_score_error(err, rubric, flat, key).unwrap_or_else(|| LineError::core(err, key))
}

/// The first criterion of `flat` that breaks the policy behind `err`, as a line error; `None`
/// when `err` is not a score error or no score of `flat` caused it.
pub fn locate_score_error(
    err: care_core::Error,
    rubric: &Rubric<'_>,
    flat: &[f64],
    key: &str,
) -> Option<LineError> {
    let in_range = |x: f64| (0.0..=5.0).contains(&x) && x.round() == x;
    let bad = |x: f64| match err {
        care_core::Error::MissingScore => x.is_nan(),
        care_core::Error::ScoreOutOfRange => !x.is_nan() && !in_range(x),
        _ => false,
    };
    let found = rubric
        .iter_flat()
        .zip(flat)
        .enumerate()
        .find(|(_, (_, x))| bad(**x));
    found.map(|(i, ((d, c), x))| {
        let what = if x.is_nan() {
            "has no score".to_owned()
        } else {
            format!("has score {x}, not an integer in 0..=5")
        };
        LineError::new(
            err.code(),
            format!(
                "{key}: {} criterion {:?} (flat index {i}) {what}",
                d.json_name(),
                c.title
            ),
        )
    })
}

/// The outcome of a preference pair under `r` by the core's exact rule
/// (`care_core::preference_outcome`, SPEC §7): integer score sums and the weights as the
/// rubric's JSON wrote them, so exact ties are never split by rounding. `care analyze` and
/// `care generator-reward` both decide a pair here.
///
/// # Errors
/// A score error located at its criterion (chosen side first), or a weight too long to read
/// exactly.
pub fn pair_outcome(
    r: &Rubric<'_>,
    chosen: &[f64],
    rejected: &[f64],
    opts: &care_core::ScoreOptions,
) -> Result<care_core::PreferenceOutcome, LineError> {
    care_core::preference_outcome(r, chosen, rejected, opts).map_err(|e| match e {
        care_core::Error::MissingScore | care_core::Error::ScoreOutOfRange => {
            locate_score_error(e, r, chosen, "chosen_scores")
                .unwrap_or_else(|| explain_score_error(e, r, rejected, "rejected_scores"))
        }
        care_core::Error::Capacity => LineError::new(
            e.code(),
            format!(
                "rubric: a category_weight has more than {} significant digits; write it shorter",
                care_core::outcome::MAX_WEIGHT_DIGITS
            ),
        ),
        _ => LineError::from(e),
    })
}
