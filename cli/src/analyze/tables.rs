//! The report's tables, built once from the statistics and written three ways (Markdown, CSV,
//! HTML) by [`super::report`].

use care_core::Dimension;
use care_core::ViolationCode;

use super::accum::{Acc, TIE, TacticAcc, VariantAcc, WSUM_BINS, WeightAcc};
use super::record::LABEL_IDS;
use super::stats::{Interval, wilson95};

/// One cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A count.
    Int(u64),
    /// A number (shown with 3 decimals, written in full in CSV).
    Num(f64),
    /// A rate with its 95% interval (shown as percentages; CSV columns `<name>`, `<name>_lo`,
    /// `<name>_hi`).
    Rate(f64, Option<Interval>),
    /// A mean with its 95% interval (CSV columns `<name>`, `<name>_lo`, `<name>_hi`).
    Mean(f64, Option<Interval>),
    /// `k` of `n` (shown as a percentage with the count; CSV columns `<name>` = k and
    /// `<name>_share`).
    Share(u64, u64),
    /// Nothing (not defined for this row).
    Empty,
}

/// How a column is written to CSV (one column, or an estimate with its interval, or a count
/// with its share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One CSV column.
    Plain,
    /// `<name>`, `<name>_lo`, `<name>_hi`.
    Interval,
    /// `<name>`, `<name>_share`.
    Share,
}

/// A column: its name (also the CSV header stem) and kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Header.
    pub name: String,
    /// CSV shape.
    pub kind: Kind,
}

fn col(name: &str, kind: Kind) -> Column {
    Column {
        name: name.to_owned(),
        kind,
    }
}

/// A table of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// File stem of its CSV (and anchor in the HTML page).
    pub name: &'static str,
    /// Heading.
    pub title: String,
    /// What the table shows, one paragraph.
    pub caption: String,
    /// Columns.
    pub columns: Vec<Column>,
    /// Rows.
    pub rows: Vec<Vec<Cell>>,
}

/// The display name of a variant (`None`: lines that name none).
pub fn variant_name(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "(no variant)".to_owned())
}

/// Short dimension names for headers.
pub const DIM_NAMES: [&str; 3] = ["Cognitive", "Affective", "Proactive"];
/// Dominant-dimension category names (three dimensions and tie).
pub const DOMINANT_NAMES: [&str; 4] = ["Cognitive", "Affective", "Proactive", "tie"];
/// Pair outcome names.
pub const OUTCOME_NAMES: [&str; 3] = ["win", "tie", "loss"];

/// A mean with its interval; nothing when undefined, and never a NaN or infinite number (a
/// sum of huge inputs can overflow).
pub fn mean_cell(w: &super::stats::Welford) -> Cell {
    match w.mean().filter(|m| m.is_finite()) {
        Some(m) => Cell::Mean(m, w.ci95().filter(|c| c.lo.is_finite() && c.hi.is_finite())),
        None => Cell::Empty,
    }
}

/// A rate `k/n` with its Wilson interval; nothing when `n == 0`.
pub fn rate_cell(k: u64, n: u64) -> Cell {
    if n == 0 {
        Cell::Empty
    } else {
        Cell::Rate(k as f64 / n as f64, wilson95(k, n))
    }
}

/// Table 4: preference recovery per variant.
pub fn preference(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        let p = &v.pairs;
        let total: u64 = p.outcomes.iter().sum();
        if total == 0 {
            continue;
        }
        let n = p.scored();
        rows.push(vec![
            Cell::Text(variant_name(name)),
            Cell::Int(total),
            Cell::Int(n),
            rate_cell(p.outcomes[0], n),
            rate_cell(p.outcomes[1], n),
            rate_cell(p.outcomes[2], n),
            mean_cell(&p.r_pref),
            Cell::Int(p.r_pref.n),
            Cell::Int(p.outcomes[3]),
        ]);
    }
    Table {
        name: "preference_recovery",
        title: "Preference recovery (Table 4)".to_owned(),
        caption: "Share of scored pairs where the chosen response scores higher than the \
                  rejected one under the generated rubric (win: r_theta(chosen) > \
                  r_theta(rejected); tie: equal), with 95% Wilson intervals, and the mean \
                  r_pref (Eq. 3) with a 95% t interval. Unscored pairs (no rubric, or a rubric \
                  that did not parse) are counted apart and are not in the rates."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("pairs", Kind::Plain),
            col("scored", Kind::Plain),
            col("win", Kind::Interval),
            col("tie", Kind::Interval),
            col("loss", Kind::Interval),
            col("mean_r_pref", Kind::Interval),
            col("r_pref_n", Kind::Plain),
            col("unscored", Kind::Plain),
        ],
        rows,
    }
}

fn weight_row(group: Vec<Cell>, a: &WeightAcc) -> Vec<Cell> {
    let mut row = group;
    row.push(Cell::Int(a.n()));
    row.extend(a.w.iter().map(mean_cell));
    row
}

fn dominant_row(group: Vec<Cell>, a: &WeightAcc) -> Vec<Cell> {
    let mut row = group;
    let n = a.n();
    row.push(Cell::Int(n));
    row.extend(a.dominant.iter().map(|&k| Cell::Share(k, n)));
    row
}

fn weight_columns(group: &str) -> Vec<Column> {
    let mut c = vec![
        col("variant", Kind::Plain),
        col(group, Kind::Plain),
        col("n", Kind::Plain),
    ];
    c.extend(
        DIM_NAMES
            .iter()
            .map(|d| col(&d.to_lowercase(), Kind::Interval)),
    );
    c
}

fn dominant_columns(group: &str) -> Vec<Column> {
    let mut c = vec![
        col("variant", Kind::Plain),
        col(group, Kind::Plain),
        col("n", Kind::Plain),
    ];
    c.extend(
        DOMINANT_NAMES
            .iter()
            .map(|d| col(&d.to_lowercase(), Kind::Share)),
    );
    c
}

/// Figure 3: mean weight per dimension by turn.
pub fn weights_by_turn(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (t, a) in &v.by_turn {
            rows.push(weight_row(
                vec![Cell::Text(variant_name(name)), Cell::Int(u64::from(*t))],
                a,
            ));
        }
    }
    Table {
        name: "weights_by_turn",
        title: "Dimension weights by turn (Figure 3)".to_owned(),
        caption: "Mean category_weight of each dimension over the valid rubrics of each turn, \
                  with 95% t intervals (none below two rubrics)."
            .to_owned(),
        columns: weight_columns("turn"),
        rows,
    }
}

/// Appendix D: dominant dimension by turn.
pub fn dominant_by_turn(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (t, a) in &v.by_turn {
            rows.push(dominant_row(
                vec![Cell::Text(variant_name(name)), Cell::Int(u64::from(*t))],
                a,
            ));
        }
    }
    Table {
        name: "dominant_by_turn",
        title: "Dominant dimension by turn (Appendix D)".to_owned(),
        caption: "Share of the valid rubrics of each turn whose strictly largest weight is each \
                  dimension; a shared maximum is counted as a tie."
            .to_owned(),
        columns: dominant_columns("turn"),
        rows,
    }
}

fn by_emotion<'a>(
    acc: &'a Acc,
    v: &'a VariantAcc,
) -> impl Iterator<Item = (&'a String, &'a WeightAcc)> + 'a {
    acc.emotions
        .iter()
        .zip(&v.by_emotion)
        .filter(|(_, a)| a.n() > 0)
}

/// Figure 4: mean weights by emotion.
pub fn weights_by_emotion(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (e, a) in by_emotion(acc, v) {
            rows.push(weight_row(
                vec![Cell::Text(variant_name(name)), Cell::Text(e.clone())],
                a,
            ));
        }
    }
    Table {
        name: "weights_by_emotion",
        title: "Dimension weights by emotion (Figure 4)".to_owned(),
        caption: "Mean category_weight of each dimension over the valid rubrics of each user \
                  emotion, with 95% t intervals."
            .to_owned(),
        columns: weight_columns("emotion"),
        rows,
    }
}

/// Figure 9: dominant dimension by emotion.
pub fn dominant_by_emotion(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (e, a) in by_emotion(acc, v) {
            rows.push(dominant_row(
                vec![Cell::Text(variant_name(name)), Cell::Text(e.clone())],
                a,
            ));
        }
    }
    Table {
        name: "dominant_by_emotion",
        title: "Dominant dimension by emotion (Figure 9)".to_owned(),
        caption: "Share of the valid rubrics of each emotion whose strictly largest weight is \
                  each dimension; a shared maximum is counted as a tie."
            .to_owned(),
        columns: dominant_columns("emotion"),
        rows,
    }
}

/// The valence groups of every variant with valid rubrics of a mapped emotion.
fn valence_groups(acc: &Acc) -> Vec<(String, Vec<(String, WeightAcc)>)> {
    acc.variants
        .iter()
        .map(|(name, v)| {
            let groups = super::compare::by_valence(acc, v)
                .into_iter()
                .zip(&acc.valence.names)
                .filter(|(a, _)| a.n() > 0)
                .map(|(a, n)| (n.clone(), a))
                .collect();
            (variant_name(name), groups)
        })
        .filter(|(_, g): &(String, Vec<(String, WeightAcc)>)| !g.is_empty())
        .collect()
}

/// Figure 4 by valence: mean weights of the valid rubrics of each valence.
pub fn weights_by_valence(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, groups) in valence_groups(acc) {
        for (val, a) in &groups {
            rows.push(weight_row(
                vec![Cell::Text(name.clone()), Cell::Text(val.clone())],
                a,
            ));
        }
    }
    Table {
        name: "weights_by_valence",
        title: "Dimension weights by valence (Figure 4)".to_owned(),
        caption: format!(
            "Mean category_weight of each dimension over the valid rubrics of the emotions of \
             each valence ({}), with 95% t intervals.",
            valence_map(acc)
        ),
        columns: weight_columns("valence"),
        rows,
    }
}

/// The dominant dimension by valence.
pub fn dominant_by_valence(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, groups) in valence_groups(acc) {
        for (val, a) in &groups {
            rows.push(dominant_row(
                vec![Cell::Text(name.clone()), Cell::Text(val.clone())],
                a,
            ));
        }
    }
    Table {
        name: "dominant_by_valence",
        title: "Dominant dimension by valence".to_owned(),
        caption: "Share of the valid rubrics of each valence whose strictly largest weight is \
                  each dimension; a shared maximum is counted as a tie."
            .to_owned(),
        columns: dominant_columns("valence"),
        rows,
    }
}

/// The emotion-to-valence map as text (`joy: positive, ...`).
pub fn valence_map(acc: &Acc) -> String {
    let v = &acc.valence;
    let parts: Vec<String> = acc
        .emotions
        .iter()
        .enumerate()
        .map(|(e, name)| match v.of(e).and_then(|i| v.names.get(i)) {
            Some(val) => format!("{name}: {val}"),
            None => format!("{name}: none"),
        })
        .collect();
    parts.join(", ")
}

/// Unknown tactic labels left out under `--unknown-label ignore`, by name.
pub fn unknown_labels(acc: &Acc) -> Table {
    let mut rows: Vec<Vec<Cell>> = acc
        .unknown_names
        .iter()
        .map(|(name, &k)| vec![Cell::Text(name.clone()), Cell::Int(k)])
        .collect();
    rows.sort_by(|a, b| match (&a[1], &b[1]) {
        (Cell::Int(x), Cell::Int(y)) => y.cmp(x),
        _ => core::cmp::Ordering::Equal,
    });
    if acc.unknown_other > 0 {
        rows.push(vec![
            Cell::Text("(other names)".to_owned()),
            Cell::Int(acc.unknown_other),
        ]);
    }
    Table {
        name: "unknown_labels",
        title: "Unknown tactic labels".to_owned(),
        caption: format!(
            "Tactic labels that are not in the {} label set and were left out \
             (--unknown-label ignore), by name, most frequent first.",
            acc.label_set.name
        ),
        columns: vec![col("label", Kind::Plain), col("occurrences", Kind::Plain)],
        rows,
    }
}

/// The label ids used by any response of any variant, in the order of the label set.
pub fn used_labels(acc: &Acc) -> Vec<u8> {
    (0..LABEL_IDS as u8)
        .filter(|&i| {
            acc.variants
                .iter()
                .any(|(_, v)| v.tactics.uses[usize::from(i)] > 0)
        })
        .collect()
}

/// `"name"` and the dimension of label `id` of the run's label set (`–` for a label the
/// paper maps to no dimension).
pub fn label_cells(acc: &Acc, id: u8) -> (String, String) {
    match acc.label_set.get(id) {
        Some(l) => (
            l.name.to_owned(),
            l.dimension
                .map_or_else(|| "–".to_owned(), |d| DIM_NAMES[d.index()].to_owned()),
        ),
        None => (format!("#{id}"), String::new()),
    }
}

/// Figure 5: strategy occurrence per variant.
pub fn strategy_by_variant(acc: &Acc) -> Table {
    let labels = used_labels(acc);
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        if v.tactics.responses == 0 {
            continue;
        }
        for &id in &labels {
            let (l, d) = label_cells(acc, id);
            let k = v.tactics.uses[usize::from(id)];
            rows.push(vec![
                Cell::Text(variant_name(name)),
                Cell::Int(v.tactics.responses),
                Cell::Text(l),
                Cell::Text(d),
                Cell::Int(k),
                rate_cell(k, v.tactics.responses),
            ]);
        }
    }
    Table {
        name: "strategy_by_variant",
        title: "Strategy occurrence per variant (Figure 5)".to_owned(),
        caption: format!(
            "Share of responses whose tactic set contains each label of the {} label set \
             (aliases and repeats count once per response), with 95% Wilson intervals.",
            acc.label_set.name
        ),
        columns: vec![
            col("variant", Kind::Plain),
            col("responses", Kind::Plain),
            col("label", Kind::Plain),
            col("dimension", Kind::Plain),
            col("uses", Kind::Plain),
            col("rate", Kind::Interval),
        ],
        rows,
    }
}

/// `(emotion, stats)` of a variant's responses, emotions with at least one response.
pub fn tactic_emotions<'a>(
    acc: &'a Acc,
    v: &'a VariantAcc,
) -> impl Iterator<Item = (&'a String, &'a TacticAcc)> + 'a {
    acc.emotions
        .iter()
        .zip(&v.tactics_by_emotion)
        .filter(|(_, t)| t.responses > 0)
}

/// Figure 10: strategy occurrence per variant and emotion.
pub fn strategy_by_emotion(acc: &Acc) -> Table {
    let labels = used_labels(acc);
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (e, t) in tactic_emotions(acc, v) {
            for &id in &labels {
                let (l, d) = label_cells(acc, id);
                let k = t.uses[usize::from(id)];
                rows.push(vec![
                    Cell::Text(variant_name(name)),
                    Cell::Text(e.clone()),
                    Cell::Int(t.responses),
                    Cell::Text(l),
                    Cell::Text(d),
                    Cell::Int(k),
                    rate_cell(k, t.responses),
                ]);
            }
        }
    }
    Table {
        name: "strategy_by_emotion",
        title: "Strategy occurrence per emotion (Figure 10)".to_owned(),
        caption: "Share of the responses to each user emotion whose tactic set contains each \
                  label, per variant, with 95% Wilson intervals."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("emotion", Kind::Plain),
            col("responses", Kind::Plain),
            col("label", Kind::Plain),
            col("dimension", Kind::Plain),
            col("uses", Kind::Plain),
            col("rate", Kind::Interval),
        ],
        rows,
    }
}

/// Format health: how many rubrics parsed and passed the format contract.
pub fn format_health(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        let r = &v.rubrics;
        if r.total == 0 {
            continue;
        }
        rows.push(vec![
            Cell::Text(variant_name(name)),
            Cell::Int(r.total),
            Cell::Int(r.missing),
            Cell::Int(r.unparsed),
            Cell::Int(r.parsed),
            Cell::Int(r.valid),
            rate_cell(r.valid, r.total),
        ]);
    }
    Table {
        name: "format_health",
        title: "Format health: valid rubrics".to_owned(),
        caption: "Rubrics per variant: missing (\"rubric\": null), text that did not parse, \
                  parsed, and valid (r_fmt = 1, every check of the format contract passed); the \
                  valid share is over all rubrics, with a 95% Wilson interval."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("rubrics", Kind::Plain),
            col("missing", Kind::Plain),
            col("unparsed", Kind::Plain),
            col("parsed", Kind::Plain),
            col("valid", Kind::Plain),
            col("valid_share", Kind::Interval),
        ],
        rows,
    }
}

/// Violation codes per variant, most frequent first: `(code, rubrics with it, occurrences)`.
pub fn violation_counts(v: &VariantAcc) -> Vec<(ViolationCode, u64, u64)> {
    let mut out: Vec<_> = ViolationCode::ALL
        .iter()
        .filter_map(|&c| {
            let (k, occ) = v.rubrics.codes[usize::from(c.number())];
            (k > 0).then_some((c, k, occ))
        })
        .collect();
    // Most rubrics first; ties in code order (stable sort keeps ALL's order).
    out.sort_by_key(|&(_, k, _)| core::cmp::Reverse(k));
    out
}

/// Violation codes by frequency.
pub fn violations(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        for (c, k, occ) in violation_counts(v) {
            rows.push(vec![
                Cell::Text(variant_name(name)),
                Cell::Text(c.as_str().to_owned()),
                Cell::Share(k, v.rubrics.total),
                Cell::Int(occ),
            ]);
        }
    }
    Table {
        name: "violations",
        title: "Format health: violation codes by frequency".to_owned(),
        caption: "Rubrics with each violation code at least once (share of all rubrics of the \
                  variant) and the code's occurrences, most frequent first."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("code", Kind::Plain),
            col("rubrics", Kind::Share),
            col("occurrences", Kind::Plain),
        ],
        rows,
    }
}

/// The largest criteria count seen in any parsed rubric.
pub fn max_criteria_seen(acc: &Acc) -> usize {
    acc.variants
        .iter()
        .flat_map(|(_, v)| v.rubrics.criteria.iter())
        .filter_map(|h| h.iter().rposition(|&k| k > 0))
        .max()
        .unwrap_or(0)
}

/// Criteria counts per dimension.
pub fn criteria_counts(acc: &Acc) -> Table {
    let max = max_criteria_seen(acc);
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        if v.rubrics.parsed == 0 {
            continue;
        }
        for d in Dimension::ALL {
            let hist = &v.rubrics.criteria[d.index()];
            let n: u64 = hist.iter().sum();
            let total: u64 = hist.iter().enumerate().map(|(k, c)| k as u64 * c).sum();
            let mut row = vec![
                Cell::Text(variant_name(name)),
                Cell::Text(DIM_NAMES[d.index()].to_owned()),
                Cell::Int(n),
            ];
            row.extend((0..=max).map(|k| Cell::Share(hist[k], n)));
            row.push(if n > 0 {
                Cell::Num(total as f64 / n as f64)
            } else {
                Cell::Empty
            });
            rows.push(row);
        }
    }
    let mut columns = vec![
        col("variant", Kind::Plain),
        col("dimension", Kind::Plain),
        col("rubrics", Kind::Plain),
    ];
    columns.extend((0..=max).map(|k| col(&format!("criteria_{k}"), Kind::Share)));
    columns.push(col("mean", Kind::Plain));
    Table {
        name: "criteria_counts",
        title: "Format health: criteria per dimension".to_owned(),
        caption: "Parsed rubrics by the number of criteria each dimension has (the paper's \
                  contract asks for 2 to 4), and the mean."
            .to_owned(),
        columns,
        rows,
    }
}

/// Labels of the weight-sum error bins under tolerance `tol`.
pub fn wsum_labels(tol: f64) -> [String; WSUM_BINS] {
    [
        "< -0.1".to_owned(),
        "[-0.1, -0.01)".to_owned(),
        format!("[-0.01, -{tol})"),
        format!("within ±{tol}"),
        format!("({tol}, 0.01]"),
        "(0.01, 0.1]".to_owned(),
        "> 0.1".to_owned(),
    ]
}

/// Column names of the weight-sum error bins (`tol` is the policy's tolerance), in the order of
/// [`wsum_labels`].
pub const WSUM_KEYS: [&str; WSUM_BINS] = [
    "err_below_-0.1",
    "err_-0.1_to_-0.01",
    "err_-0.01_to_-tol",
    "err_within_tol",
    "err_tol_to_0.01",
    "err_0.01_to_0.1",
    "err_above_0.1",
];

/// Distribution of the weight-sum error.
pub fn weight_sum_error(acc: &Acc) -> Table {
    let labels = wsum_labels(acc.tolerance);
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        let r = &v.rubrics;
        if r.parsed == 0 {
            continue;
        }
        let mut row = vec![Cell::Text(variant_name(name)), Cell::Int(r.parsed)];
        row.extend(r.wsum.iter().map(|&k| Cell::Share(k, r.parsed)));
        row.push(mean_cell(&r.wsum_err));
        row.push(Cell::Num(r.wsum_max_abs));
        rows.push(row);
    }
    let mut columns = vec![col("variant", Kind::Plain), col("parsed", Kind::Plain)];
    columns.extend(WSUM_KEYS.iter().map(|k| col(k, Kind::Share)));
    columns.push(col("mean_error", Kind::Interval));
    columns.push(col("max_abs_error", Kind::Plain));
    Table {
        name: "weight_sum_error",
        title: "Format health: weight-sum error".to_owned(),
        caption: format!(
            "Parsed rubrics by the error of their weights' sum, e = sum(w) - 1 (weights as \
             written; a missing category counts 0), in the bins {} (tol = {}: within it the \
             weight_sum check passes), with the mean error and the largest |e|.",
            labels.join(", "),
            acc.tolerance
        ),
        columns,
        rows,
    }
}

/// What was skipped, by code.
pub fn skipped(acc: &Acc) -> Table {
    let mut rows: Vec<Vec<Cell>> = acc
        .skipped
        .iter()
        .map(|(code, &k)| vec![Cell::Text(code.clone()), Cell::Share(k, acc.lines)])
        .collect();
    rows.sort_by(|a, b| match (&a[1], &b[1]) {
        (Cell::Share(x, _), Cell::Share(y, _)) => y.cmp(x),
        _ => core::cmp::Ordering::Equal,
    });
    Table {
        name: "skipped",
        title: "Skipped lines".to_owned(),
        caption: "Input lines that were not analyzed, by error code (share of all lines read); \
                  every one is listed in errors.jsonl."
            .to_owned(),
        columns: vec![col("code", Kind::Plain), col("lines", Kind::Share)],
        rows,
    }
}

/// The dominant-dimension shares of a group, for charts: `[cog, aff, pro, tie]` in `[0, 1]`.
pub fn dominant_shares(a: &WeightAcc) -> [f64; 4] {
    let n = a.n().max(1) as f64;
    a.dominant.map(|k| k as f64 / n)
}

/// Index of the tie category in [`DOMINANT_NAMES`].
pub const TIE_INDEX: usize = TIE;
