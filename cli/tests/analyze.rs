//! `care analyze` end to end: golden numbers on a synthetic dataset whose answers are known by
//! construction, every chart rasterized and checked for its series, bad input reported line by
//! line, and the binary's exit codes and directory handling.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use care_cli::analyze::charts::{self, DIM_COLORS, OUTCOME_COLORS, TIE_COLOR, hex, variant_color};
use care_cli::analyze::report::{self, Meta};
use care_cli::analyze::{Acc, Options, Settings, analyze, analyze_with};
use care_cli::engine::EngineOptions;

// ---------------------------------------------------------------------------------------------
// Building input lines.

/// A valid rubric (under the paper's contract when `n` is within 2..=4 and `w` sums to 1) with
/// `n[d]` criteria per dimension; titles carry `tag` so they are unique.
fn rubric(w: [f64; 3], n: [usize; 3], tag: &str) -> String {
    let names = [
        "Cognitive Empathy",
        "Affective Empathy",
        "Proactive Empathy",
    ];
    let mut s = String::from("{\"categories\":[");
    for d in 0..3 {
        if d > 0 {
            s.push(',');
        }
        write!(
            s,
            "{{\"category\":\"{}\",\"weight_rationale\":\"why {d}\",\"category_weight\":{},\"criteria\":[",
            names[d], w[d]
        )
        .unwrap();
        for i in 0..n[d] {
            if i > 0 {
                s.push(',');
            }
            write!(
                s,
                "{{\"title\":\"{tag} d{d} c{i}\",\"description\":\"[0] none [1] a little [2] some \
                 [3] fair [4] good [5] full value: 0, 1, 2, 3, 4, 5\"}}"
            )
            .unwrap();
        }
        s.push_str("]}");
    }
    s.push_str("]}");
    s
}

/// A rubric line: half of them as text to validate, half as `care validate` would report them
/// (both routes must give the same statistics).
fn rubric_line(variant: &str, turn: u32, emotion: &str, w: [f64; 3], k: usize) -> String {
    if k.is_multiple_of(2) {
        format!(
            "{{\"variant\":\"{variant}\",\"turn\":{turn},\"emotion\":\"{emotion}\",\"rubric\":{}}}",
            rubric(w, [2, 2, 2], &format!("{variant}{turn}x{k}"))
        )
    } else {
        format!(
            "{{\"variant\":\"{variant}\",\"turn\":{turn},\"emotion\":\"{emotion}\",\"format_reward\":1,\
             \"violations\":[],\"weights\":[{},{},{}],\"criteria\":[2,2,2]}}",
            w[0], w[1], w[2]
        )
    }
}

const W_COG: [f64; 3] = [0.5, 0.25, 0.25];
const W_AFF: [f64; 3] = [0.25, 0.5, 0.25];
const W_AFF2: [f64; 3] = [0.25, 0.625, 0.125];
const W_PRO: [f64; 3] = [0.125, 0.125, 0.75];
const W_TIE: [f64; 3] = [0.375, 0.375, 0.25];

/// The planted rubrics: `(variant, turn, emotion, weights, dominant)` with dominant 0..=2 or
/// 3 for a tie, written down by hand (not computed by the code under test).
fn planted() -> Vec<(&'static str, u32, &'static str, [f64; 3], usize)> {
    let mut v = Vec::new();
    for turn in 1..=3 {
        for _ in 0..3 {
            v.push(("sft", turn, "joy", W_COG, 0));
        }
        v.push(("sft", turn, "joy", W_AFF, 1));
    }
    v.push(("sft", 3, "joy", W_TIE, 3));
    v.push(("rl", 1, "sadness", W_AFF2, 1));
    v.push(("rl", 1, "sadness", W_AFF2, 1));
    v.push(("rl", 1, "sadness", W_AFF, 1));
    v.push(("rl", 1, "sadness", W_AFF, 1));
    v.push(("rl", 2, "anger", W_COG, 0));
    v.push(("rl", 2, "anger", W_AFF, 1));
    v.push(("rl", 2, "anger", W_TIE, 3));
    v.push(("rl", 2, "anger", W_PRO, 2));
    v
}

const PAIR_RUBRIC_W: [f64; 3] = [0.5, 0.25, 0.25];
/// Raw judge scores, two criteria per dimension.
type Scores = [[u8; 2]; 3];
/// Scores of a win: the chosen response is better on Cognitive only.
const WIN: (Scores, Scores) = ([[5, 5], [3, 3], [3, 3]], [[4, 4], [3, 3], [3, 3]]);
/// Three kinds of tie: identical, the same scores in another order, and dimensions that cancel
/// exactly (0.5 * 0.2 = 0.25 * 0.4) although f64 rounding makes the naive sums differ.
const TIES: [(Scores, Scores); 3] = [
    ([[4, 4], [2, 3], [1, 5]], [[4, 4], [2, 3], [1, 5]]),
    ([[3, 4], [2, 5], [0, 1]], [[4, 3], [5, 2], [1, 0]]),
    ([[3, 3], [2, 2], [2, 2]], [[2, 2], [4, 4], [2, 2]]),
];

fn matrix(m: Scores) -> String {
    format!(
        "[[{},{}],[{},{}],[{},{}]]",
        m[0][0], m[0][1], m[1][0], m[1][1], m[2][0], m[2][1]
    )
}

fn pair_line(variant: &str, chosen: Scores, rejected: Scores, k: usize) -> String {
    format!(
        "{{\"variant\":\"{variant}\",\"rubric\":{},\"chosen_scores\":{},\"rejected_scores\":{}}}",
        rubric(PAIR_RUBRIC_W, [2, 2, 2], &format!("p{variant}{k}")),
        matrix(chosen),
        matrix(rejected)
    )
}

/// `(variant, emotion, tactics)` of the planted responses.
fn responses() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let mut v = Vec::new();
    for i in 0..10 {
        let emotion = if i < 5 { "sadness" } else { "anger" };
        let t = match i {
            0..=5 => vec!["paraphrasing"],
            6 | 7 => vec!["paraphrasing", "advice"],
            _ => vec![],
        };
        v.push(("MICA", emotion, t));
    }
    for i in 0..8 {
        let (emotion, t) = if i < 4 {
            // A repeat in another spelling counts once.
            ("joy", vec!["questioning", "reappraisal", " QUESTIONING "])
        } else {
            // MINT `information` and ESConv `Information` are the same label.
            ("fear", vec!["information", "Information"])
        };
        v.push(("CARE", emotion, t));
    }
    v
}

/// The whole golden dataset, one line per element.
fn golden_lines() -> Vec<String> {
    let mut lines = Vec::new();
    for (k, (v, t, e, w, _)) in planted().into_iter().enumerate() {
        lines.push(rubric_line(v, t, e, w, k));
    }
    // Invalid rubrics: two weight sums of 0.95 and one dimension with a single criterion.
    for k in 0..2 {
        lines.push(format!(
            "{{\"variant\":\"sft\",\"turn\":1,\"emotion\":\"joy\",\"text\":{}}}",
            serde_json::to_string(&rubric([0.5, 0.2, 0.25], [2, 2, 2], &format!("bad{k}")))
                .unwrap()
        ));
    }
    lines.push(format!(
        "{{\"variant\":\"sft\",\"turn\":2,\"rubric\":{}}}",
        rubric([0.5, 0.25, 0.25], [1, 2, 2], "short")
    ));
    lines.push("{\"variant\":\"rl\",\"turn\":1,\"rubric\":null}".to_owned());
    lines.push("{\"variant\":\"rl\",\"text\":\"I cannot write a rubric.\"}".to_owned());
    // Pairs: sft 5 wins, 3 ties, 4 losses, 1 unscored; rl 9 wins, 2 ties, 1 loss.
    let mut k = 0;
    let mut push = |lines: &mut Vec<String>, v: &str, c, r| {
        lines.push(pair_line(v, c, r, k));
        k += 1;
    };
    for _ in 0..5 {
        push(&mut lines, "sft", WIN.0, WIN.1);
    }
    for t in TIES {
        push(&mut lines, "sft", t.0, t.1);
    }
    for _ in 0..4 {
        push(&mut lines, "sft", WIN.1, WIN.0);
    }
    lines.push(format!(
        "{{\"variant\":\"sft\",\"rubric\":null,\"chosen_scores\":{},\"rejected_scores\":{}}}",
        matrix(WIN.0),
        matrix(WIN.1)
    ));
    for _ in 0..9 {
        push(&mut lines, "rl", WIN.0, WIN.1);
    }
    for t in &TIES[1..] {
        push(&mut lines, "rl", t.0, t.1);
    }
    push(&mut lines, "rl", WIN.1, WIN.0);
    // Pairs scored elsewhere.
    for (c, r, p) in [
        (0.9, 0.5, 0.5),
        (0.7, 0.6, 0.25),
        (0.4, 0.4, 0.0),
        (0.2, 0.3, -0.25),
    ] {
        lines.push(format!(
            "{{\"model\":\"ext\",\"chosen_reward\":{c},\"rejected_reward\":{r},\"r_pref\":{p}}}"
        ));
    }
    for (v, e, t) in responses() {
        lines.push(format!(
            "{{\"variant\":\"{v}\",\"emotion\":\"{e}\",\"tactics\":{}}}",
            serde_json::to_string(&t).unwrap()
        ));
    }
    lines
}

// ---------------------------------------------------------------------------------------------
// Running and reading back.

fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("analyze")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(lines: &[String], opts: &Options, threads: usize, dir: &Path) -> (Acc, String) {
    let input = lines.join("\n") + "\n";
    let mut errors = Vec::new();
    let eopts = EngineOptions {
        threads,
        // Small chunks so the golden set spans several and the fold crosses chunk borders.
        chunk_lines: 7,
        ..EngineOptions::default()
    };
    let acc = analyze(opts, input.as_bytes(), &eopts, &mut errors).unwrap();
    let meta = Meta {
        title: "golden".to_owned(),
        input: "golden.jsonl".to_owned(),
        settings: Vec::new(),
    };
    report::write(dir, &acc, &meta).unwrap();
    (acc, String::from_utf8(errors).unwrap())
}

fn run_with(lines: &[String], opts: &Options, settings: Settings, dir: &Path) -> (Acc, String) {
    let input = lines.join("\n") + "\n";
    let mut errors = Vec::new();
    let eopts = EngineOptions {
        threads: 2,
        chunk_lines: 7,
        ..EngineOptions::default()
    };
    let acc = analyze_with(opts, settings, input.as_bytes(), &eopts, &mut errors).unwrap();
    report::write(dir, &acc, &Meta::default()).unwrap();
    (acc, String::from_utf8(errors).unwrap())
}

fn compare(pairs: &[(&str, &str)]) -> Settings {
    Settings {
        compare: pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect(),
        ..Settings::default()
    }
}

/// The fields of CSV text (RFC 4180: quoted fields may hold commas, quotes and line breaks).
fn csv_records(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    rows
}

/// A CSV of the report as rows of `column -> value`.
fn csv(dir: &Path, name: &str) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.csv"))).unwrap();
    let mut records = csv_records(&text).into_iter();
    let header = records.next().unwrap();
    records
        .map(|f| {
            assert_eq!(f.len(), header.len(), "{name}: {f:?}");
            header.iter().cloned().zip(f).collect()
        })
        .collect()
}

fn find<'a>(
    rows: &'a [BTreeMap<String, String>],
    keys: &[(&str, &str)],
) -> &'a BTreeMap<String, String> {
    let hits: Vec<_> = rows
        .iter()
        .filter(|r| {
            keys.iter()
                .all(|(k, v)| r.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(hits.len(), 1, "rows matching {keys:?}: {hits:?}");
    hits[0]
}

fn f(row: &BTreeMap<String, String>, key: &str) -> f64 {
    row.get(key)
        .unwrap_or_else(|| panic!("no column {key} in {row:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key} = {:?}: {e}", row[key]))
}

fn u(row: &BTreeMap<String, String>, key: &str) -> u64 {
    row[key]
        .parse()
        .unwrap_or_else(|e| panic!("{key} = {:?}: {e}", row[key]))
}

// ---------------------------------------------------------------------------------------------
// Golden numbers.

#[test]
fn golden_weights_and_dominance_match_the_planted_values() {
    let dir = scratch_dir("golden_weights");
    let (acc, errors) = run(&golden_lines(), &Options::default(), 2, &dir);
    assert_eq!(errors, "", "no line of the golden set is skipped");
    assert_eq!(acc.skipped_lines(), 0);

    let by_turn = csv(&dir, "weights_by_turn");
    let dom_turn = csv(&dir, "dominant_by_turn");
    type Planted = Vec<([f64; 3], usize)>;
    let mut groups: BTreeMap<(&str, u32), Planted> = BTreeMap::new();
    for (v, t, _, w, d) in planted() {
        groups.entry((v, t)).or_default().push((w, d));
    }
    assert_eq!(by_turn.len(), groups.len(), "one row per (variant, turn)");
    for ((v, t), rubrics) in &groups {
        let turn = t.to_string();
        let row = find(&by_turn, &[("variant", v), ("turn", &turn)]);
        let n = rubrics.len() as f64;
        assert_eq!(u(row, "n"), rubrics.len() as u64);
        for (d, name) in ["cognitive", "affective", "proactive"].iter().enumerate() {
            // Dyadic weights: the exact mean is this sum over n.
            let exact: f64 = rubrics.iter().map(|(w, _)| w[d]).sum::<f64>() / n;
            let got = f(row, name);
            assert!(
                (got - exact).abs() <= 1e-15,
                "{v} turn {t} {name}: {got} vs {exact}"
            );
            let (lo, hi) = (f(row, &format!("{name}_lo")), f(row, &format!("{name}_hi")));
            assert!(
                lo <= got && got <= hi,
                "{v} turn {t} {name}: {lo} {got} {hi}"
            );
        }
        let drow = find(&dom_turn, &[("variant", v), ("turn", &turn)]);
        for (k, name) in ["cognitive", "affective", "proactive", "tie"]
            .iter()
            .enumerate()
        {
            let planted_k = rubrics.iter().filter(|(_, d)| *d == k).count() as u64;
            assert_eq!(u(drow, name), planted_k, "{v} turn {t} dominant {name}");
            let share = f(drow, &format!("{name}_share"));
            assert!((share - planted_k as f64 / n).abs() <= 1e-15);
        }
    }
    // Spot values written out by hand: rl turn 1 is (0.25, 0.5625, 0.1875), all Affective.
    let row = find(&by_turn, &[("variant", "rl"), ("turn", "1")]);
    assert_eq!(
        (
            f(row, "cognitive"),
            f(row, "affective"),
            f(row, "proactive")
        ),
        (0.25, 0.5625, 0.1875)
    );
    // Every rl rubric of turn 1 has Cog = 0.25 exactly: the interval has width zero.
    assert_eq!(
        (f(row, "cognitive_lo"), f(row, "cognitive_hi")),
        (0.25, 0.25)
    );

    // Emotions: rl's turns map one to one onto sadness and anger, sft is all joy.
    let by_emotion = csv(&dir, "weights_by_emotion");
    let sad = find(&by_emotion, &[("variant", "rl"), ("emotion", "sadness")]);
    assert_eq!(f(sad, "affective"), 0.5625);
    let joy = find(&by_emotion, &[("variant", "sft"), ("emotion", "joy")]);
    assert_eq!(u(joy, "n"), 13);
    let dom_emotion = csv(&dir, "dominant_by_emotion");
    let anger = find(&dom_emotion, &[("variant", "rl"), ("emotion", "anger")]);
    assert_eq!(
        (
            u(anger, "cognitive"),
            u(anger, "affective"),
            u(anger, "proactive"),
            u(anger, "tie")
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn golden_pairs_recover_the_planted_win_tie_loss_counts() {
    let dir = scratch_dir("golden_pairs");
    run(&golden_lines(), &Options::default(), 1, &dir);
    let rows = csv(&dir, "preference_recovery");
    for (v, w, t, l, unscored) in [("sft", 5, 3, 4, 1), ("rl", 9, 2, 1, 0), ("ext", 2, 1, 1, 0)] {
        let row = find(&rows, &[("variant", v)]);
        let n = w + t + l;
        assert_eq!(u(row, "scored"), n, "{v}");
        assert_eq!(u(row, "unscored"), unscored, "{v}");
        assert_eq!(u(row, "pairs"), n + unscored, "{v}");
        for (name, k) in [("win", w), ("tie", t), ("loss", l)] {
            assert_eq!(f(row, name), k as f64 / n as f64, "{v} {name}");
            let ci = care_cli::analyze::stats::wilson95(k, n).unwrap();
            assert_eq!(
                (f(row, &format!("{name}_lo")), f(row, &format!("{name}_hi"))),
                (ci.lo, ci.hi)
            );
        }
    }
    // r_pref of a win under weights (0.5, 0.25, 0.25): 0.5 * tanh(0.2 / 0.7); a loss is its
    // negative (Eq. 3 is antisymmetric) and the ties are 0, 0 and the cancelling pair.
    let win = 0.5 * (0.2f64 / 0.7).tanh();
    let cancel = 0.5 * (0.2f64 / 0.7).tanh() + 0.25 * (-0.4f64 / 0.7).tanh();
    let sft = find(&rows, &[("variant", "sft")]);
    assert_eq!(u(sft, "r_pref_n"), 12);
    let expect = (5.0 * win - 4.0 * win + cancel) / 12.0;
    assert!(
        (f(sft, "mean_r_pref") - expect).abs() < 1e-12,
        "{} vs {expect}",
        f(sft, "mean_r_pref")
    );
    let ext = find(&rows, &[("variant", "ext")]);
    assert_eq!(f(ext, "mean_r_pref"), 0.125);
}

#[test]
fn golden_strategies_and_format_health() {
    let dir = scratch_dir("golden_strategies");
    run(&golden_lines(), &Options::default(), 2, &dir);
    let rows = csv(&dir, "strategy_by_variant");
    let rate = |v: &str, l: &str| {
        let r = find(&rows, &[("variant", v), ("label", l)]);
        (u(r, "uses"), u(r, "responses"), f(r, "rate"))
    };
    assert_eq!(rate("MICA", "paraphrasing"), (8, 10, 0.8));
    assert_eq!(rate("MICA", "advice"), (2, 10, 0.2));
    assert_eq!(
        rate("MICA", "questioning"),
        (0, 10, 0.0),
        "labels of other variants get 0 rows"
    );
    assert_eq!(
        rate("CARE", "questioning"),
        (4, 8, 0.5),
        "a repeated label counts once"
    );
    assert_eq!(
        rate("CARE", "Information"),
        (4, 8, 0.5),
        "MINT information is ESConv Information"
    );
    let labels: Vec<&str> = rows
        .iter()
        .filter(|r| r["variant"] == "CARE")
        .map(|r| r["label"].as_str())
        .collect();
    assert_eq!(
        labels,
        [
            "Information",
            "questioning",
            "paraphrasing",
            "reappraisal",
            "advice"
        ]
    );

    let heat = csv(&dir, "strategy_by_emotion");
    let cell = find(
        &heat,
        &[
            ("variant", "MICA"),
            ("emotion", "anger"),
            ("label", "advice"),
        ],
    );
    assert_eq!((u(cell, "uses"), u(cell, "responses")), (2, 5));
    let cell = find(
        &heat,
        &[
            ("variant", "CARE"),
            ("emotion", "joy"),
            ("label", "reappraisal"),
        ],
    );
    assert_eq!(f(cell, "rate"), 1.0);

    let health = csv(&dir, "format_health");
    let sft = find(&health, &[("variant", "sft")]);
    assert_eq!(
        (
            u(sft, "rubrics"),
            u(sft, "parsed"),
            u(sft, "valid"),
            u(sft, "missing"),
            u(sft, "unparsed")
        ),
        (16 + 12 + 1, 16 + 12, 13 + 12, 1, 0),
        "13 planted + 3 invalid rubric lines, the 12 scored pairs' rubrics and one null rubric"
    );
    let rl = find(&health, &[("variant", "rl")]);
    assert_eq!(
        (
            u(rl, "rubrics"),
            u(rl, "missing"),
            u(rl, "unparsed"),
            u(rl, "valid")
        ),
        (22, 1, 1, 8 + 12)
    );
    let v = csv(&dir, "violations");
    let codes: Vec<(&str, u64)> = v
        .iter()
        .filter(|r| r["variant"] == "sft")
        .map(|r| (r["code"].as_str(), u(r, "rubrics")))
        .collect();
    assert_eq!(
        codes,
        [("weight_sum", 2), ("criteria_count", 1)],
        "most frequent first"
    );
    let rl_codes: Vec<&str> = v
        .iter()
        .filter(|r| r["variant"] == "rl")
        .map(|r| r["code"].as_str())
        .collect();
    assert_eq!(rl_codes, ["not_json"]);

    let crit = csv(&dir, "criteria_counts");
    let cog = find(&crit, &[("variant", "sft"), ("dimension", "Cognitive")]);
    assert_eq!((u(cog, "criteria_1"), u(cog, "criteria_2")), (1, 27));
    let ws = csv(&dir, "weight_sum_error");
    let sft = find(&ws, &[("variant", "sft")]);
    assert_eq!(u(sft, "err_-0.1_to_-0.01"), 2);
    assert_eq!(u(sft, "err_within_tol"), 26);
}

#[test]
fn the_report_does_not_depend_on_the_thread_count() {
    let a = scratch_dir("threads_1");
    let b = scratch_dir("threads_2");
    run(&golden_lines(), &Options::default(), 1, &a);
    run(&golden_lines(), &Options::default(), 2, &b);
    let mut files: Vec<_> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert!(files.len() > 20);
    for name in files {
        assert_eq!(
            std::fs::read(a.join(&name)).unwrap(),
            std::fs::read(b.join(&name)).unwrap(),
            "{name:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Comparisons, trends, valence, verdicts, label sets, reward health: planted answers.

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// Independent samples: the win, tie and loss rates of sft (5, 3, 4 of 12) and rl (9, 2, 1
/// of 12) by Newcombe's hybrid score interval (the values computed apart from this code, from
/// the formula of Newcombe 1998, method 10), and Welch's interval for r_pref.
#[test]
fn golden_comparison_of_independent_variants() {
    let dir = scratch_dir("compare_independent");
    let (_, errors) = run_with(
        &golden_lines(),
        &Options::default(),
        compare(&[("sft", "rl"), ("sft", "nope")]),
        &dir,
    );
    assert_eq!(errors, "");
    let rows = csv(&dir, "comparison");
    let expected = [
        (
            "win",
            5.0 / 12.0,
            9.0 / 12.0,
            (-0.6087424558111219, 0.05305812721204661),
        ),
        (
            "tie",
            3.0 / 12.0,
            2.0 / 12.0,
            (-0.24086659994491413, 0.3899678993813608),
        ),
        (
            "loss",
            4.0 / 12.0,
            1.0 / 12.0,
            (-0.08362203271094643, 0.5344090516691637),
        ),
    ];
    for (m, a, b, (lo, hi)) in expected {
        let r = find(&rows, &[("view", "preference"), ("measure", m)]);
        assert_eq!((f(r, "value_a"), f(r, "value_b")), (a, b), "{m}");
        assert!(close(f(r, "difference"), a - b, 1e-15));
        assert!(
            close(f(r, "difference_lo"), lo, 1e-12) && close(f(r, "difference_hi"), hi, 1e-12),
            "{m}: {r:?}"
        );
        assert_eq!(r["method"], "newcombe");
        assert_eq!(r["pairs"], "");
    }
    // Weights by turn: sft and rl share turns 1 and 2; one row per dimension.
    let t1 = find(
        &rows,
        &[
            ("view", "weights_by_turn"),
            ("group", "1"),
            ("measure", "Affective"),
        ],
    );
    // sft turn 1: 3 x 0.25 + 0.5 over 4 = 0.3125; rl turn 1: 0.5625.
    assert_eq!((f(t1, "value_a"), f(t1, "value_b")), (0.3125, 0.5625));
    assert_eq!(t1["method"], "welch");
    assert!(
        !rows
            .iter()
            .any(|r| r["view"] == "weights_by_turn" && r["group"] == "3")
    );
    // Valence: sft is all joy (positive), rl all negative: nothing to compare by valence.
    assert!(!rows.iter().any(|r| r["view"] == "weights_by_valence"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("![sft - rl: preference](compare_1_preference.svg)"),
        "{md}"
    );
    assert!(
        md.contains("--compare sft,nope: no line names the variant \"nope\""),
        "{md}"
    );
}

/// Lines of variant `v`: one pair per id with the outcome planted by `win`, optionally with
/// `r_pref`, optionally without ids (then nothing pairs).
fn reward_pairs(v: &str, outcomes: &[bool], r_pref: Option<&[f64]>, ids: bool) -> Vec<String> {
    outcomes
        .iter()
        .enumerate()
        .map(|(i, &win)| {
            let (c, r) = if win { (1, 0) } else { (0, 1) };
            let id = if ids {
                format!("\"id\":\"p{i}\",")
            } else {
                String::new()
            };
            let p = r_pref.map_or(String::new(), |x| format!(",\"r_pref\":{}", x[i]));
            format!("{{{id}\"variant\":\"{v}\",\"chosen_reward\":{c},\"rejected_reward\":{r}{p}}}")
        })
        .collect()
}

/// Paired data give the paired intervals: win rates on the 2x2 table of Fagerland, Lydersen
/// and Laake's Cavo et al. example (59 both, 6 first only, 16 second only, 80 neither:
/// -0.1186 to -0.0046), and r_pref on R's sleep data scaled by 1/10 (paired t: -0.24598858 to
/// -0.07001142; Welch when the ids are dropped: -0.33654832 to 0.02054832).
#[test]
fn golden_comparison_of_paired_variants() {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (n, (x, y)) in [
        (59, (true, true)),
        (6, (true, false)),
        (16, (false, true)),
        (80, (false, false)),
    ] {
        for _ in 0..n {
            a.push(x);
            b.push(y);
        }
    }
    let g1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0].map(|x| x / 10.0);
    let g2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4].map(|x| x / 10.0);
    let ten = [true; 10];
    let lines = |ids: bool| {
        let mut l = reward_pairs("A", &a, None, ids);
        l.extend(reward_pairs("B", &b, None, ids));
        l.extend(reward_pairs("S1", &ten, Some(&g1), ids));
        l.extend(reward_pairs("S2", &ten, Some(&g2), ids));
        l
    };
    let dir = scratch_dir("compare_paired");
    let (_, errors) = run_with(
        &lines(true),
        &Options::default(),
        compare(&[("A", "B"), ("S1", "S2")]),
        &dir,
    );
    assert_eq!(errors, "");
    let rows = csv(&dir, "comparison");
    let win = find(
        &rows,
        &[("a", "A"), ("view", "preference"), ("measure", "win")],
    );
    assert_eq!(win["method"], "newcombe_paired");
    assert_eq!(u(win, "pairs"), 161);
    assert!(close(f(win, "difference"), -10.0 / 161.0, 1e-15));
    assert!(
        close(f(win, "difference_lo"), -0.1186, 5e-5)
            && close(f(win, "difference_hi"), -0.0046, 5e-5),
        "{win:?}"
    );
    let r = find(&rows, &[("a", "S1"), ("measure", "mean_r_pref")]);
    assert_eq!((r["method"].as_str(), u(r, "pairs")), ("paired_t", 10));
    assert!(
        close(f(r, "difference_lo"), -0.24598858, 5e-8)
            && close(f(r, "difference_hi"), -0.07001142, 5e-8)
    );

    let dir = scratch_dir("compare_unpaired");
    run_with(
        &lines(false),
        &Options::default(),
        compare(&[("S1", "S2")]),
        &dir,
    );
    let rows = csv(&dir, "comparison");
    let r = find(&rows, &[("measure", "mean_r_pref")]);
    assert_eq!(r["method"], "welch");
    assert!(
        close(f(r, "difference_lo"), -0.33654832, 5e-8)
            && close(f(r, "difference_hi"), 0.02054832, 5e-8)
    );
}

/// Paired rubrics and responses: the same ids under two variants give the paired t for the
/// weights (R's sleep data scaled by 1/100 on Cognitive: -0.024598858 to -0.007001142) and
/// Newcombe's paired interval for a tactic's share (the Cavo et al. table again).
#[test]
fn golden_paired_weights_and_tactics() {
    let g1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0];
    let g2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4];
    let mut lines = Vec::new();
    for (v, g) in [("X", g1), ("Y", g2)] {
        for (i, x) in g.iter().enumerate() {
            lines.push(weights_line(
                v,
                1,
                [0.3 + x / 100.0, 0.4 - x / 100.0, 0.3],
                Some(i),
            ));
        }
    }
    let mut k = 0;
    for (n, (x, y)) in [
        (59, (true, true)),
        (6, (true, false)),
        (16, (false, true)),
        (80, (false, false)),
    ] {
        for _ in 0..n {
            for (v, uses) in [("X", x), ("Y", y)] {
                let t = if uses {
                    "[\"advice\"]"
                } else {
                    "[\"validation\"]"
                };
                lines.push(format!(
                    "{{\"id\":\"r{k}\",\"variant\":\"{v}\",\"tactics\":{t}}}"
                ));
            }
            k += 1;
        }
    }
    let dir = scratch_dir("compare_paired_weights");
    let (_, errors) = run_with(&lines, &Options::default(), compare(&[("X", "Y")]), &dir);
    assert_eq!(errors, "");
    let rows = csv(&dir, "comparison");
    for view in ["weights", "weights_by_turn"] {
        let r = find(&rows, &[("view", view), ("measure", "Cognitive")]);
        assert_eq!(
            (r["method"].as_str(), u(r, "pairs")),
            ("paired_t", 10),
            "{view}"
        );
        assert!(
            close(f(r, "difference_lo"), -0.024598858, 5e-9)
                && close(f(r, "difference_hi"), -0.007001142, 5e-9),
            "{view}: {r:?}"
        );
    }
    let a = find(&rows, &[("view", "strategy"), ("measure", "advice")]);
    assert_eq!(
        (a["method"].as_str(), u(a, "pairs")),
        ("newcombe_paired", 161)
    );
    assert!(
        close(f(a, "difference_lo"), -0.1186, 5e-5) && close(f(a, "difference_hi"), -0.0046, 5e-5)
    );
    // One id used twice by X: that group is no longer paired.
    let mut dup = lines.clone();
    dup.push(weights_line("X", 1, [0.3, 0.4, 0.3], Some(0)));
    let dir = scratch_dir("compare_dup");
    run_with(&dup, &Options::default(), compare(&[("X", "Y")]), &dir);
    let rows = csv(&dir, "comparison");
    let r = find(
        &rows,
        &[("view", "weights_by_turn"), ("measure", "Cognitive")],
    );
    assert_eq!(r["method"], "welch");
}

/// One rubric line as care validate reports it.
fn weights_line(variant: &str, turn: u32, w: [f64; 3], id: Option<usize>) -> String {
    let id = id.map_or(String::new(), |i| format!("\"id\":{i},"));
    format!(
        "{{{id}\"variant\":\"{variant}\",\"turn\":{turn},\"format_reward\":1,\"violations\":[],\
         \"weights\":[{},{},{}],\"criteria\":[2,2,2]}}",
        w[0], w[1], w[2]
    )
}

/// Trends: Cognitive rises by exactly 1/32 a turn and Affective falls by as much (weights on a
/// dyadic grid, so every mean is exact): they are equal at turn 7 and Cognitive overtakes
/// Affective at turn 8, Proactive (5/16) at turn 7, and Proactive overtakes Affective at 9. A
/// noisy copy (balanced noise: the same per-turn means) crosses at 8 too, and its bootstrap
/// interval is [7, 8]: at turn 7 the two are equal, so a resample may already cross there.
#[test]
fn golden_trend_and_crossing() {
    let mut lines = Vec::new();
    let w = |t: u32| {
        let t = f64::from(t) / 32.0;
        [0.125 + t, 0.5625 - t, 0.3125]
    };
    for t in 1..=10 {
        for _ in 0..3 {
            lines.push(weights_line("exact", t, w(t), None));
        }
        for (k, e) in [-1.0, 0.0, 1.0, 0.5, -0.5].iter().enumerate() {
            let mut x = w(t);
            x[0] += e / 64.0;
            x[1] -= e / 64.0;
            lines.push(weights_line("noisy", t, x, Some(k)));
        }
    }
    let dir = scratch_dir("trend");
    let (_, errors) = run_with(&lines, &Options::default(), Settings::default(), &dir);
    assert_eq!(errors, "");
    let trend = csv(&dir, "trend");
    let cog = find(&trend, &[("variant", "exact"), ("dimension", "Cognitive")]);
    assert!(close(f(cog, "slope"), 1.0 / 32.0, 1e-14), "{cog:?}");
    assert!(
        close(f(cog, "slope_lo"), 1.0 / 32.0, 1e-9) && close(f(cog, "slope_hi"), 1.0 / 32.0, 1e-9)
    );
    let aff = find(&trend, &[("variant", "exact"), ("dimension", "Affective")]);
    assert!(close(f(aff, "slope"), -1.0 / 32.0, 1e-14));
    let pro = find(&trend, &[("variant", "exact"), ("dimension", "Proactive")]);
    assert!(close(f(pro, "slope"), 0.0, 1e-14));
    let noisy = find(&trend, &[("variant", "noisy"), ("dimension", "Cognitive")]);
    assert!(close(f(noisy, "slope"), 1.0 / 32.0, 1e-14));
    assert!(f(noisy, "slope_lo") < 1.0 / 32.0 && 1.0 / 32.0 < f(noisy, "slope_hi"));
    assert_eq!(u(noisy, "rubrics"), 50);

    let cross = csv(&dir, "crossing");
    let row = |v: &str, a: &str, b: &str| {
        let r = find(
            &cross,
            &[("variant", v), ("overtaking", a), ("overtaken", b)],
        );
        (
            u(r, "turn"),
            r["turn_lo"].parse::<u64>().ok(),
            r["turn_hi"].parse::<u64>().ok(),
            u(r, "replicates"),
        )
    };
    assert_eq!(
        row("exact", "Cognitive", "Affective"),
        (8, Some(8), Some(8), 1000)
    );
    assert_eq!(
        row("exact", "Cognitive", "Proactive"),
        (7, Some(7), Some(7), 1000)
    );
    assert_eq!(
        row("exact", "Proactive", "Affective"),
        (9, Some(9), Some(9), 1000)
    );
    assert_eq!(cross.iter().filter(|r| r["variant"] == "exact").count(), 3);
    let (t, lo, hi, reps) = row("noisy", "Cognitive", "Affective");
    assert_eq!((t, lo, hi, reps), (8, Some(7), Some(8), 1000));
}

/// Valence: the default map merges sadness and anger into negative and joy into positive; an
/// override moves an emotion.
#[test]
fn golden_weights_by_valence() {
    let dir = scratch_dir("valence");
    let (acc, _) = run_with(
        &golden_lines(),
        &Options::default(),
        Settings::default(),
        &dir,
    );
    let rows = csv(&dir, "weights_by_valence");
    // rl: sadness 2 x W_AFF2 + 2 x W_AFF, anger W_COG, W_AFF, W_TIE, W_PRO.
    let planted = [W_AFF2, W_AFF2, W_AFF, W_AFF, W_COG, W_AFF, W_TIE, W_PRO];
    let neg = find(&rows, &[("variant", "rl"), ("valence", "negative")]);
    assert_eq!(u(neg, "n"), 8);
    for (d, name) in ["cognitive", "affective", "proactive"].iter().enumerate() {
        let exact: f64 = planted.iter().map(|w| w[d]).sum::<f64>() / 8.0;
        assert_eq!(f(neg, name), exact, "{name}");
    }
    assert_eq!(f(neg, "affective"), 0.4375);
    let pos = find(&rows, &[("variant", "sft"), ("valence", "positive")]);
    assert_eq!(u(pos, "n"), 13);
    assert!(
        !rows.iter().any(|r| r["valence"] == "neutral"),
        "no surprise rubric"
    );
    let dom = csv(&dir, "dominant_by_valence");
    let d = find(&dom, &[("variant", "rl"), ("valence", "negative")]);
    assert_eq!(
        (
            u(d, "cognitive"),
            u(d, "affective"),
            u(d, "proactive"),
            u(d, "tie")
        ),
        (1, 5, 1, 1)
    );
    assert!(acc.valence.names.len() == 3);

    let dir = scratch_dir("valence_override");
    let settings = Settings {
        valence: Some(
            care_cli::analyze::vocab::Valence::new(
                &care_cli::analyze::Emotions::default(),
                "anger=hostile",
            )
            .unwrap(),
        ),
        ..Settings::default()
    };
    run_with(&golden_lines(), &Options::default(), settings, &dir);
    let rows = csv(&dir, "weights_by_valence");
    assert_eq!(
        u(
            find(&rows, &[("variant", "rl"), ("valence", "negative")]),
            "n"
        ),
        4
    );
    assert_eq!(
        u(
            find(&rows, &[("variant", "rl"), ("valence", "hostile")]),
            "n"
        ),
        4
    );

    // Another vocabulary: the default map has no entry for it, so no valence view.
    let opts = Options {
        emotions: care_cli::analyze::Emotions::parse_list("calm,tense").unwrap(),
        ..Options::default()
    };
    let lines =
        vec![weights_line("v", 1, W_AFF, None).replace("\"turn\":1", "\"emotion\":\"tense\"")];
    let dir = scratch_dir("valence_vocab");
    let (acc, errors) = run_with(&lines, &opts, Settings::default(), &dir);
    assert_eq!(errors, "");
    assert!(acc.valence.names.is_empty());
    assert!(csv(&dir, "weights_by_valence").is_empty());
}

/// The settings from the command line and from `--config`: the file's values, replaced by
/// the flags given; bad values are usage errors (status 2) that name the flag.
#[test]
fn the_binary_reads_settings_from_flags_and_config() {
    let dir = scratch_dir("bin_settings");
    let input = dir.join("in.jsonl");
    let mut lines = reward_pairs("A", &[true, false, true], None, true);
    lines.extend(reward_pairs("B", &[false, false, true], None, true));
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let cfg = dir.join("cfg.json");
    std::fs::write(
        &cfg,
        r#"{"compare": [["B", "A"]], "valence": {"surprise": "positive"}, "seed": 3, "health": {"length_rho": 0.2}}"#,
    )
    .unwrap();
    let out = dir.join("r");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "analyze",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        care(&args)
    };
    let o = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows = csv(&out, "comparison");
    assert!(rows.iter().all(|r| r["a"] == "B" && r["b"] == "A"));
    assert_eq!(
        find(&rows, &[("measure", "win")])["method"],
        "newcombe_paired"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("surprise: positive"), "{md}");
    assert!(
        md.contains("length_rho 0.2") && md.contains("seed 3"),
        "{md}"
    );
    let o = run(&[
        "--config",
        cfg.to_str().unwrap(),
        "--compare",
        "A,B",
        "--seed",
        "9",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(csv(&out, "comparison").iter().all(|r| r["a"] == "A"));
    assert!(
        std::fs::read_to_string(out.join("report.md"))
            .unwrap()
            .contains("seed 9")
    );
    for (bad, needle) in [
        (vec!["--compare", "A"], "--compare"),
        (vec!["--compare", "A,A"], "--compare"),
        (vec!["--valence", "boredom=negative"], "--valence"),
        (vec!["--labels", "paper"], "--labels"),
        (vec!["--health", "lenght_rho=1"], "--health"),
        (vec!["--turn-buckets", "5-1"], "--turn-buckets"),
        (vec!["--bootstrap", "0"], "--bootstrap"),
    ] {
        let o = run(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{bad:?}"
        );
    }
    std::fs::write(&cfg, r#"{"compare": [["A", "B"]], "colour": "red"}"#).unwrap();
    let o = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown field `colour`"));
}

/// The paper's human evaluation (Appendix G): 224, 104 and 107 selections of CARE(R), MICA and
/// RLVER are 51.5%, 23.9% and 24.6%; a pairwise judge's win - loss with its paired interval.
#[test]
fn golden_verdicts() {
    let mut lines = Vec::new();
    for (system, n) in [("CARE(R)", 224), ("MICA", 104), ("RLVER", 107)] {
        for _ in 0..n {
            lines.push(format!(
                "{{\"verdict\":{{\"judge\":\"human\",\"systems\":[\"MICA\",\"RLVER\",\"CARE(R)\"],\"choice\":\"{system}\"}}}}"
            ));
        }
    }
    for (result, mirror, n) in [("win", "loss", 10), ("tie", "tie", 3), ("loss", "win", 7)] {
        for i in 0..n {
            // Written from MICA's side every other time: the same verdicts.
            let (a, b, r) = if i % 2 == 0 {
                ("CARE", "MICA", result)
            } else {
                ("MICA", "CARE", mirror)
            };
            lines.push(format!(
                "{{\"verdict\":{{\"judge\":\"gpt\",\"a\":\"{a}\",\"b\":\"{b}\",\"result\":\"{r}\"}}}}"
            ));
        }
    }
    let dir = scratch_dir("verdicts");
    let (_, errors) = run_with(
        &lines,
        &Options::default(),
        compare(&[("CARE(R)", "MICA")]),
        &dir,
    );
    assert_eq!(errors, "");
    let rows = csv(&dir, "verdicts");
    for (system, k, paper) in [
        ("CARE(R)", 224, 51.5),
        ("MICA", 104, 23.9),
        ("RLVER", 107, 24.6),
    ] {
        let r = find(&rows, &[("judge", "human"), ("measure", system)]);
        assert_eq!((u(r, "count"), u(r, "verdicts")), (k, 435));
        let share = f(r, "share");
        assert_eq!(share, k as f64 / 435.0);
        assert_eq!(
            format!("{:.1}", share * 100.0),
            format!("{paper:.1}"),
            "{system}"
        );
        let ci = care_cli::analyze::stats::wilson95(k, 435).unwrap();
        assert_eq!((f(r, "share_lo"), f(r, "share_hi")), (ci.lo, ci.hi));
    }
    let d = find(&rows, &[("judge", "human"), ("measure", "CARE(R) - MICA")]);
    assert!(close(f(d, "share"), 120.0 / 435.0, 1e-15));
    assert_eq!(d["method"], "newcombe_paired");
    let ci = care_cli::analyze::stats::newcombe_paired(0, 224, 104, 107).unwrap();
    assert_eq!((f(d, "share_lo"), f(d, "share_hi")), (ci.lo, ci.hi));
    let w = find(&rows, &[("judge", "gpt"), ("measure", "CARE: win")]);
    assert_eq!((u(w, "count"), u(w, "verdicts")), (10, 20));
    let net = find(&rows, &[("judge", "gpt"), ("measure", "CARE: win - loss")]);
    assert!(close(f(net, "share"), 3.0 / 20.0, 1e-15));
}

/// Appendix E's labels: `appraisal` is read, `other` is its own label with no dimension, and
/// ESConv's `Others` is unknown there (listed by name under --unknown-label ignore).
#[test]
fn golden_appendix_e_labels() {
    let opts = Options {
        label_set: care_cli::analyze::vocab::LabelSet::appendix_e(),
        labels: care_core::UnknownLabelPolicy::Ignore,
        ..Options::default()
    };
    let lines: Vec<String> = [
        r#"{"variant":"CARE(R)","tactics":["appraisal","other"]}"#,
        r#"{"variant":"CARE(R)","tactics":["reappraisal","Others","hug"]}"#,
        r#"{"variant":"CARE(R)","tactics":["emotional expression","hug"]}"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let dir = scratch_dir("appendix_e");
    let (acc, errors) = run_with(&lines, &opts, Settings::default(), &dir);
    assert_eq!(errors, "");
    assert_eq!(acc.label_set.name, "appendix-e");
    let rows = csv(&dir, "strategy_by_variant");
    let appraisal = find(&rows, &[("label", "appraisal")]);
    assert_eq!(
        (u(appraisal, "uses"), appraisal["dimension"].as_str()),
        (2, "Cognitive")
    );
    let other = find(&rows, &[("label", "other")]);
    assert_eq!((u(other, "uses"), other["dimension"].as_str()), (1, "–"));
    let chart = report::all_charts(&acc)
        .unwrap()
        .into_iter()
        .find(|c| c.file == "unknown_labels.svg")
        .unwrap();
    let png = dir.join("png");
    std::fs::create_dir_all(&png).unwrap();
    check_chart(&dir, &chart, &[TIE_COLOR], &png);
    let unknown = csv(&dir, "unknown_labels");
    assert_eq!(unknown.len(), 2);
    assert_eq!(
        (unknown[0]["label"].as_str(), u(&unknown[0], "occurrences")),
        ("hug", 2)
    );
    assert_eq!(
        (unknown[1]["label"].as_str(), u(&unknown[1], "occurrences")),
        ("Others", 1)
    );
    // Under the default policy the line is skipped, naming the label and the set.
    let strict = Options {
        labels: care_core::UnknownLabelPolicy::Error,
        ..opts
    };
    let (_, errors) = run_with(
        &lines[1..2],
        &strict,
        Settings::default(),
        &scratch_dir("appendix_e_strict"),
    );
    assert!(
        errors.contains("unknown_label")
            && errors.contains("Others")
            && errors.contains("appendix-e"),
        "{errors}"
    );
}

/// One care reward output line: a group with its rubric status, responses (reward, status,
/// judge answers, scores) and lengths.
fn reward_line(
    turn: u32,
    status: &str,
    attempts: u32,
    responses: &[(Option<f64>, u32, [u8; 2], u64)],
) -> String {
    let rubric = if status == "ok" {
        format!(
            "\"rubric\":{},",
            rubric([0.5, 0.25, 0.25], [2, 2, 2], &format!("h{turn}"))
        )
    } else {
        String::new()
    };
    let repairs: Vec<String> = (1..attempts)
        .map(|a| format!("{{\"attempt\":{a},\"codes\":[\"weight_sum\"]}}"))
        .collect();
    let resp: Vec<String> = responses
        .iter()
        .map(|(r, j, s, _)| {
            let reward = r.map_or("null".to_owned(), |x| x.to_string());
            let st = if r.is_some() { "ok" } else { "judge_invalid" };
            format!(
                "{{\"reward\":{reward},\"status\":\"{st}\",\"scores\":[[{},{}],[{},{}],[{},{}]],\"judge_attempts\":{j}}}",
                s[0], s[1], s[0], s[1], s[0], s[1]
            )
        })
        .collect();
    let chars: Vec<String> = responses.iter().map(|x| x.3.to_string()).collect();
    format!(
        "{{\"variant\":\"run\",\"turn\":{turn},\"rubric_status\":\"{status}\",{rubric}\"rubric_attempts\":{attempts},\
         \"repairs\":[{}],\"responses\":[{}],\"response_chars\":[{}]}}",
        repairs.join(","),
        resp.join(","),
        chars.join(",")
    )
}

/// Reward health from care reward lines, every count planted: 4 groups, one without a rubric,
/// one repaired; one flat group; scores at 5 and 0 in known numbers; one retried judge; one
/// null reward.
#[test]
fn golden_health_from_care_reward_lines() {
    let lines = vec![
        // Turn 1: rewards 0.5, 0.5 (flat); scores (5,5) and (5,0); 100 and 200 characters.
        reward_line(
            1,
            "ok",
            1,
            &[(Some(0.5), 1, [5, 5], 100), (Some(0.5), 1, [5, 0], 200)],
        ),
        // Turn 5: 0.2, 0.8, one null after 3 judge answers; repaired once.
        reward_line(
            5,
            "ok",
            2,
            &[
                (Some(0.2), 1, [1, 2], 50),
                (Some(0.8), 2, [4, 4], 400),
                (None, 3, [0, 0], 10),
            ],
        ),
        // Turn 9: 0.1, 0.9.
        reward_line(
            9,
            "ok",
            1,
            &[(Some(0.1), 1, [2, 2], 30), (Some(0.9), 1, [3, 3], 300)],
        ),
        // Turn 9 again: no valid rubric.
        reward_line(9, "invalid_rubric", 3, &[]),
    ];
    let dir = scratch_dir("health_reward_lines");
    let (_, errors) = run_with(&lines, &Options::default(), Settings::default(), &dir);
    assert_eq!(errors, "");
    let l = csv(&dir, "health_loop");
    let run = &l[0];
    assert_eq!(
        (
            u(run, "responses"),
            u(run, "groups"),
            u(run, "invalid_rubric")
        ),
        (7, 4, 1)
    );
    assert_eq!(f(run, "null_reward"), 1.0 / 7.0);
    assert_eq!(f(run, "judge_retried"), 2.0 / 7.0);
    assert_eq!(f(run, "rubric_failure"), 0.25);
    assert_eq!(
        f(run, "rubric_repaired"),
        2.0 / 4.0,
        "turn 5 repaired once, turn 9's two repairs"
    );
    assert_eq!(run["statuses"], "judge_invalid: 1, ok: 6");
    let g = csv(&dir, "health_groups");
    let all = find(&g, &[("turns", "all")]);
    assert_eq!((u(all, "groups"), u(all, "zero_spread")), (3, 1));
    let b0 = find(&g, &[("turns", "0-3")]);
    assert_eq!((u(b0, "groups"), u(b0, "zero_spread")), (1, 1));
    let s = csv(&dir, "health_scores");
    let cog = find(&s, &[("dimension", "Cognitive"), ("criterion", "all")]);
    // 14 scores: 5s at (5,5), (5,_): 3; 0s at (_,0), (0,0): 3.
    assert_eq!(u(cog, "scores"), 14);
    assert_eq!(
        (f(cog, "ceiling"), f(cog, "floor")),
        (3.0 / 14.0, 3.0 / 14.0)
    );
    let first = find(&s, &[("dimension", "Cognitive"), ("criterion", "1")]);
    assert_eq!(f(first, "ceiling"), 2.0 / 7.0);
    let e = csv(&dir, "health_entropy");
    let h = -(0.5f64 * 0.5f64.ln() + 2.0 * 0.25 * 0.25f64.ln());
    let all = find(&e, &[("turn", "all")]);
    assert_eq!(u(all, "rubrics"), 3);
    assert!(close(f(all, "entropy"), h, 1e-15));
    let len = csv(&dir, "health_length");
    let all = find(&len, &[("turns", "all")]);
    assert_eq!(u(all, "responses"), 6, "the null reward has no point");
    // Ranks of length 100, 200, 50, 400, 30, 300 against rewards 0.5, 0.5, 0.2, 0.8, 0.1, 0.9.
    let rho = care_cli::analyze::stats::spearman(&[
        (100.0, 0.5),
        (200.0, 0.5),
        (50.0, 0.2),
        (400.0, 0.8),
        (30.0, 0.1),
        (300.0, 0.9),
    ])
    .unwrap();
    assert_eq!(f(all, "spearman_rho"), rho);
    // Length ranks 3, 4, 2, 6, 1, 5 against reward ranks 3.5, 3.5, 2, 5, 1, 6 (a tie shares
    // its ranks): Sxy = 16, Sxx = 17.5, Syy = 17.
    assert!(close(rho, 16.0 / (17.5f64 * 17.0).sqrt(), 1e-12), "{rho}");
    let flags = csv(&dir, "health_flags");
    let st = |c: &str| find(&flags, &[("check", c)])["status"].clone();
    assert_eq!(st("zero_spread"), "FLAGGED", "1 of 3 groups > 0.25");
    assert_eq!(st("null_reward"), "FLAGGED");
    assert_eq!(st("rubric_failure"), "FLAGGED");
    assert_eq!(st("ceiling"), "ok");
    // rho = 0.928 on 6 points: the lower limit tanh(atanh(0.928) - 1.96 sqrt(1.06/3)) = 0.44.
    assert_eq!(st("length_rho"), "FLAGGED");
}

// ---------------------------------------------------------------------------------------------
// Charts.

fn rasterize(svg: &str) -> resvg::tiny_skia::Pixmap {
    let tree = resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap
}

/// Pixels of exactly colour `c` (opaque).
fn pixels_of(p: &resvg::tiny_skia::Pixmap, c: plotters::style::RGBColor) -> usize {
    p.pixels()
        .iter()
        .filter(|px| px.alpha() == 255 && (px.red(), px.green(), px.blue()) == (c.0, c.1, c.2))
        .count()
}

#[test]
fn every_chart_renders_with_its_series() {
    let dir = scratch_dir("charts");
    let (acc, _) = run(&golden_lines(), &Options::default(), 2, &dir);
    let charts = charts::all(&acc).unwrap();
    let variant = |name: &str| {
        let i = acc
            .variants
            .iter()
            .position(|(v, _)| v.as_deref() == Some(name))
            .unwrap();
        variant_color(i)
    };
    let [cog, aff, pro] = DIM_COLORS;
    let expected: Vec<(&str, Vec<plotters::style::RGBColor>)> = vec![
        ("preference_recovery.svg", OUTCOME_COLORS.to_vec()),
        ("weights_by_turn.svg", vec![cog, aff, pro]),
        ("dominant_by_turn.svg", vec![cog, aff, pro, TIE_COLOR]),
        ("weights_by_emotion.svg", vec![cog, aff, pro]),
        ("dominant_by_emotion.svg", vec![cog, aff, pro, TIE_COLOR]),
        (
            "strategy_by_variant.svg",
            vec![variant("MICA"), variant("CARE")],
        ),
        // CARE's joy column has 100% cells: the dark end of the scale.
        (
            "strategy_by_emotion_care.svg",
            vec![charts::heat(1.0), charts::heat(0.0)],
        ),
        (
            // Sadness is all paraphrasing; anger 3 of 5 paraphrasing, 2 of 5 advice.
            "strategy_by_emotion_mica.svg",
            vec![charts::heat(1.0), charts::heat(0.6), charts::heat(0.4)],
        ),
        ("format_valid.svg", vec![variant("sft"), variant("rl")]),
        ("violations.svg", vec![variant("sft"), variant("rl")]),
        ("criteria_counts.svg", vec![cog, aff, pro]),
        ("weight_sum_error.svg", vec![variant("sft"), variant("rl")]),
    ];
    let files: Vec<&str> = charts.iter().map(|c| c.file.as_str()).collect();
    let mut want: Vec<&str> = expected.iter().map(|(f, _)| *f).collect();
    want.sort_unstable();
    let mut got = files.clone();
    got.sort_unstable();
    assert_eq!(got, want, "one chart per view with data");
    let png_dir = dir.join("png");
    std::fs::create_dir_all(&png_dir).unwrap();
    for (file, colors) in expected {
        let chart = charts.iter().find(|c| c.file == file).unwrap();
        check_chart(&dir, chart, &colors, &png_dir);
    }
}

/// A chart drawn as its file says: on disk, big enough, inked, each expected colour present,
/// the legend named after its series, the title in the text; saved as PNG for a look.
fn check_chart(
    dir: &Path,
    chart: &charts::Chart,
    colors: &[plotters::style::RGBColor],
    png_dir: &Path,
) {
    let file = chart.file.as_str();
    assert_eq!(std::fs::read_to_string(dir.join(file)).unwrap(), chart.svg);
    let p = rasterize(&chart.svg);
    assert!(
        p.width() >= 500 && p.height() >= 300,
        "{file}: {}x{}",
        p.width(),
        p.height()
    );
    let white = p
        .pixels()
        .iter()
        .filter(|px| (px.red(), px.green(), px.blue(), px.alpha()) == (255, 255, 255, 255))
        .count();
    let ink = p.pixels().len() - white;
    assert!(
        ink > p.pixels().len() / 50,
        "{file}: only {ink} non-white pixels"
    );
    for &c in colors {
        let k = pixels_of(&p, c);
        assert!(k >= 30, "{file}: {} pixels of {}", k, hex(c));
        assert!(
            chart.svg.contains(&hex(c)),
            "{file}: no element filled with {}",
            hex(c)
        );
    }
    // Legends are text in the SVG, named after their series.
    for (name, c) in &chart.series {
        assert!(
            chart.svg.contains(&format!(">\n{name}\n</text>")),
            "{file}: legend {name:?}"
        );
        assert!(pixels_of(&p, *c) > 0, "{file}: legend swatch {name}");
    }
    assert!(
        chart
            .svg
            .contains(&chart.title.replace('&', "&amp;").replace('\'', "&apos;")),
        "{file}: title"
    );
    p.save_png(png_dir.join(file.replace(".svg", ".png")))
        .unwrap();
}

/// Every line kind at once: the golden set, trends, verdicts, paired pairs, health lines.
fn all_kinds() -> Vec<String> {
    let mut lines = golden_lines();
    for t in 1..=6 {
        for k in 0..3 {
            let c = 0.25 + f64::from(t) / 32.0 + f64::from(k) / 128.0;
            lines.push(weights_line(
                "sft",
                t,
                [c, 0.5 - f64::from(t) / 32.0, 0.25 - f64::from(k) / 128.0],
                Some(k as usize),
            ));
        }
    }
    for (system, n) in [("CARE(R)", 5), ("MICA", 3), ("RLVER", 2)] {
        for _ in 0..n {
            lines.push(format!(
                "{{\"verdict\":{{\"judge\":\"human\",\"systems\":[\"MICA\",\"RLVER\",\"CARE(R)\"],\"choice\":\"{system}\"}}}}"
            ));
        }
    }
    let wins = [true, false, true, true, false, true];
    lines.extend(reward_pairs(
        "sft",
        &wins,
        Some(&[0.1, -0.2, 0.3, 0.2, -0.1, 0.4]),
        true,
    ));
    lines.extend(reward_pairs(
        "rl",
        &[true; 6],
        Some(&[0.2, 0.1, 0.3, 0.5, 0.1, 0.4]),
        true,
    ));
    lines.push(reward_line(
        1,
        "ok",
        1,
        &[
            (Some(0.5), 1, [5, 5], 100),
            (Some(0.7), 1, [5, 0], 200),
            (Some(0.2), 1, [1, 0], 40),
        ],
    ));
    lines.push(reward_line(
        5,
        "ok",
        2,
        &[
            (Some(0.2), 1, [1, 2], 50),
            (Some(0.8), 2, [4, 4], 400),
            (None, 3, [0, 0], 10),
        ],
    ));
    lines.push(reward_line(
        9,
        "ok",
        1,
        &[
            (Some(0.1), 1, [2, 2], 30),
            (Some(0.9), 1, [3, 3], 300),
            (Some(0.6), 1, [3, 5], 250),
        ],
    ));
    lines
}

#[test]
fn every_chart_of_the_new_views_renders_with_its_series() {
    let dir = scratch_dir("charts_new");
    let (acc, errors) = run_with(
        &all_kinds(),
        &Options::default(),
        compare(&[("rl", "sft")]),
        &dir,
    );
    assert_eq!(errors, "");
    let charts = report::all_charts(&acc).unwrap();
    let variant = |name: &str| {
        let i = acc
            .variants
            .iter()
            .position(|(v, _)| v.as_deref() == Some(name))
            .unwrap();
        variant_color(i)
    };
    let [cog, aff, pro] = DIM_COLORS;
    let expected: Vec<(&str, Vec<plotters::style::RGBColor>)> = vec![
        ("weights_by_valence.svg", vec![cog, aff, pro]),
        ("dominant_by_valence.svg", vec![cog, aff, pro, TIE_COLOR]),
        ("trend.svg", vec![cog, aff, pro]),
        ("crossing.svg", vec![cog]),
        ("verdicts.svg", vec![OUTCOME_COLORS[0]]),
        ("compare_1_preference.svg", vec![variant("rl")]),
        ("compare_1_weights.svg", vec![cog, aff, pro]),
        ("compare_1_weights_by_turn.svg", vec![cog, aff, pro]),
        ("compare_1_trend.svg", vec![variant("rl")]),
        ("health_flags.svg", vec![variant("run")]),
        ("health_length.svg", vec![variant("run")]),
        ("health_groups.svg", vec![variant("run")]),
        ("health_scores.svg", vec![variant("run")]),
        ("health_loop.svg", vec![variant("run")]),
        ("health_entropy.svg", vec![variant("run")]),
    ];
    let png_dir = dir.join("png");
    std::fs::create_dir_all(&png_dir).unwrap();
    for (file, colors) in &expected {
        let chart = charts
            .iter()
            .find(|c| c.file == *file)
            .unwrap_or_else(|| panic!("no chart {file}"));
        check_chart(&dir, chart, colors, &png_dir);
    }
    // Every chart is in the report, inline in the page and linked from the Markdown.
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for c in &charts {
        assert!(html.contains(&c.svg), "{} not inline", c.file);
        assert!(
            md.contains(&format!("]({})", c.file)),
            "{} not linked",
            c.file
        );
    }
}

#[test]
fn every_view_is_byte_identical_for_any_thread_count() {
    let mut outs = Vec::new();
    for threads in [1, 2] {
        let dir = scratch_dir(&format!("threads_all_{threads}"));
        let input = all_kinds().join("\n") + "\n";
        let eopts = EngineOptions {
            threads,
            chunk_lines: 5,
            ..EngineOptions::default()
        };
        let acc = analyze_with(
            &Options::default(),
            compare(&[("rl", "sft"), ("sft", "rl")]),
            input.as_bytes(),
            &eopts,
            &mut Vec::new(),
        )
        .unwrap();
        report::write(&dir, &acc, &Meta::default()).unwrap();
        outs.push(dir);
    }
    let mut files: Vec<_> = std::fs::read_dir(&outs[0])
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert!(files.len() > 50, "{}", files.len());
    for name in files {
        assert_eq!(
            std::fs::read(outs[0].join(&name)).unwrap(),
            std::fs::read(outs[1].join(&name)).unwrap(),
            "{name:?}"
        );
    }
}

#[test]
fn a_view_without_data_has_no_chart_and_says_what_it_needs() {
    let dir = scratch_dir("empty_views");
    let lines = vec!["{\"variant\":\"MICA\",\"tactics\":[\"advice\"]}".to_owned()];
    let (acc, _) = run(&lines, &Options::default(), 1, &dir);
    let charts = charts::all(&acc).unwrap();
    let files: Vec<&str> = charts.iter().map(|c| c.file.as_str()).collect();
    assert_eq!(files, ["strategy_by_variant.svg"]);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("## Preference recovery (Table 4)"));
    assert!(md.contains("_No data for this view: it needs lines with \"chosen_scores\""));
    assert!(md.contains("_No data for this view: it needs valid rubrics on lines with \"turn\"._"));
    assert!(md.contains("No line was skipped."));
    assert!(!dir.join("weights_by_turn.svg").exists());
    // The CSV of an empty view still has its header.
    let t = std::fs::read_to_string(dir.join("weights_by_turn.csv")).unwrap();
    assert!(
        t.starts_with("variant,turn,n,cognitive,cognitive_lo,cognitive_hi,"),
        "{t}"
    );
    assert_eq!(t.lines().count(), 1);
}

#[test]
fn csv_lines_end_in_crlf_and_notes_agree_in_number() {
    let dir = scratch_dir("crlf");
    let lines = vec![
        // One valid rubric without a turn, and one pair without a rubric that parsed.
        "{\"variant\":\"a,b\",\"format_reward\":1,\"violations\":[],\"weights\":[0.5,0.25,0.25],\"criteria\":[2,2,2]}".to_owned(),
        "{\"variant\":\"a,b\",\"rubric\":null,\"chosen_scores\":[[1],[1],[1]],\"rejected_scores\":[[1],[1],[1]]}".to_owned(),
    ];
    run(&lines, &Options::default(), 1, &dir);
    let t = std::fs::read_to_string(dir.join("format_health.csv")).unwrap();
    assert_eq!(
        t,
        "variant,rubrics,missing,unparsed,parsed,valid,valid_share,valid_share_lo,valid_share_hi\r\n\
         \"a,b\",2,1,0,1,1,0.5,0.09453120573423074,0.9054687942657693\r\n"
    );
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("a,b: 1 valid rubric has no \"turn\" and is not in the turn views."),
        "{md}"
    );
    assert!(
        md.contains("a,b: 1 of 2 rubrics is not valid (r_fmt = 0)"),
        "{md}"
    );
    assert!(
        md.contains("a,b: 1 pair has no rubric that parsed and is not in the win/tie/loss rates."),
        "{md}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input.

#[test]
fn bad_lines_are_skipped_with_per_line_errors_and_reported() {
    let dir = scratch_dir("bad_input");
    let good = rubric_line("rl", 1, "joy", W_AFF, 1);
    let lines: Vec<String> = vec![
        good.clone(),
        // 2: a pair without its rejected side.
        format!("{{\"variant\":\"rl\",\"rubric\":{},\"chosen_scores\":[[5,5],[5,5],[5,5]]}}", rubric(W_AFF, [2, 2, 2], "m")),
        // 3: an emotion outside the vocabulary.
        "{\"variant\":\"rl\",\"emotion\":\"boredom\",\"tactics\":[\"advice\"]}".to_owned(),
        // 4: an empty group name.
        "{\"variant\":\"  \",\"tactics\":[\"advice\"]}".to_owned(),
        // 5: a turn that is not a turn.
        "{\"variant\":\"rl\",\"turn\":-1,\"tactics\":[]}".to_owned(),
        // 6: nothing to analyze.
        "{\"variant\":\"rl\",\"turn\":3}".to_owned(),
        // 7: not JSON.
        "{\"variant\":".to_owned(),
        // 8: an unknown tactic.
        "{\"variant\":\"rl\",\"tactics\":[\"hugging\"]}".to_owned(),
        // 9: care validate output that contradicts itself.
        "{\"format_reward\":1,\"violations\":[\"weight_sum\"],\"weights\":[0.5,0.5,0.1],\"criteria\":[2,2,2]}".to_owned(),
        // 10: a score out of range, located.
        format!("{{\"rubric\":{},\"chosen_scores\":[[5,9],[5,5],[5,5]],\"rejected_scores\":[[5,5],[5,5],[5,5]]}}", rubric(W_AFF, [2, 2, 2], "o")),
        // 11: an unknown violation code.
        "{\"format_reward\":0,\"violations\":[{\"code\":\"too_short\"}]}".to_owned(),
        good,
    ];
    let (acc, errors) = run(&lines, &Options::default(), 2, &dir);
    let got: Vec<(u64, String, String)> = errors
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["line"].as_u64().unwrap(),
                v["error"]["code"].as_str().unwrap().to_owned(),
                v["error"]["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let codes: Vec<(u64, &str)> = got.iter().map(|(l, c, _)| (*l, c.as_str())).collect();
    assert_eq!(
        codes,
        [
            (2, "schema"),
            (3, "unknown_emotion"),
            (4, "empty_group"),
            (5, "turn_out_of_range"),
            (6, "nothing_to_analyze"),
            (7, "not_json"),
            (8, "unknown_label"),
            (9, "schema"),
            (10, "score_out_of_range"),
            (11, "unknown_violation_code"),
        ]
    );
    let msg = |line: u64| got.iter().find(|g| g.0 == line).unwrap().2.as_str();
    assert!(msg(2).contains("\"rejected_scores\""), "{}", msg(2));
    assert!(
        msg(3).contains("\"boredom\"") && msg(3).contains("--emotions"),
        "{}",
        msg(3)
    );
    assert!(msg(4).contains("\"variant\" is empty"), "{}", msg(4));
    assert!(msg(10).contains("has score 9"), "{}", msg(10));
    assert_eq!((acc.lines, acc.skipped_lines()), (12, 10));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("12 lines read, 2 analyzed, 10 skipped."),
        "{md}"
    );
    assert!(md.contains("| schema | 16.7% (2) |"), "{md}");
    assert!(
        md.contains("- line 3: `unknown_emotion`: unknown emotion \"boredom\""),
        "{md}"
    );
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("<td>unknown_emotion</td>"));
    let skipped = csv(&dir, "skipped");
    assert_eq!(skipped.len(), 9);
    assert_eq!(skipped[0]["code"], "schema");
}

#[test]
fn too_many_variants_are_refused_line_by_line() {
    let dir = scratch_dir("too_many");
    let lines: Vec<String> = (0..66)
        .map(|i| format!("{{\"variant\":\"v{i}\",\"tactics\":[]}}"))
        .collect();
    let (acc, errors) = run(&lines, &Options::default(), 1, &dir);
    assert_eq!(acc.variants.len(), 64);
    let codes: Vec<&str> = errors
        .lines()
        .map(|l| {
            if l.contains("too_many_variants") {
                "t"
            } else {
                "?"
            }
        })
        .collect();
    assert_eq!(codes, ["t", "t"]);
    assert!(errors.starts_with("{\"line\":65,"));
}

// ---------------------------------------------------------------------------------------------
// The binary.

fn care(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_care"))
        .args(args)
        .output()
        .unwrap()
}

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/analyze_demo.jsonl")
}

#[test]
fn the_binary_writes_a_report_of_the_bundled_demo() {
    let dir = scratch_dir("bin_demo");
    let out_dir = dir.join("report");
    let out = care(&[
        "analyze",
        demo().to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("care analyze: "), "{stdout}");
    for f in [
        "report.md",
        "index.html",
        "errors.jsonl",
        "preference_recovery.csv",
        "weights_by_turn.svg",
    ] {
        assert!(out_dir.join(f).is_file(), "{f}");
    }
    let html = std::fs::read_to_string(out_dir.join("index.html")).unwrap();
    assert!(html.contains("<svg"));
    // Self-contained: the only URL is the SVG namespace, never fetched.
    for url in html
        .match_indices("http")
        .map(|(i, _)| &html[i..(i + 30).min(html.len())])
    {
        assert!(url.starts_with("http://www.w3.org/2000/svg"), "{url}");
    }
    // The demo's deliberate bad lines are reported on stderr and make --strict fail.
    assert!(stderr.contains("unknown_emotion"), "{stderr}");
    let out = care(&[
        "analyze",
        "--strict",
        demo().to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an earlier report is replaced; --strict fails on skips"
    );
}

#[test]
fn the_binary_refuses_a_directory_that_is_not_a_report() {
    let dir = scratch_dir("bin_refuse");
    std::fs::write(dir.join("thesis.tex"), "keep me").unwrap();
    let out = care(&[
        "analyze",
        demo().to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to write") && stderr.contains("thesis.tex"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("thesis.tex")).unwrap(),
        "keep me"
    );
    let out = care(&[
        "analyze",
        demo().to_str().unwrap(),
        "--out",
        dir.join("r").to_str().unwrap(),
        "--tau",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tau"));
    let out = care(&[
        "analyze",
        "--emotions",
        "joy,,fear",
        "-",
        "--out",
        dir.join("r").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
}

/// The README shows the demo's Figure 3 chart from `docs/img/`; it must be what `care analyze`
/// draws for the bundled demo today (`CARE_BLESS=1` rewrites it after an intended change).
#[test]
fn the_readme_chart_is_the_demo_chart() {
    let dir = scratch_dir("readme_chart");
    let input = std::fs::read(demo()).unwrap();
    let mut errors = Vec::new();
    let acc = analyze(
        &Options::default(),
        &input[..],
        &EngineOptions::default(),
        &mut errors,
    )
    .unwrap();
    let chart = charts::weights_by_turn(&acc).unwrap().unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/img/analyze-weights-by-turn.svg");
    if std::env::var_os("CARE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &chart.svg).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (CARE_BLESS=1 writes it)", path.display()));
    std::fs::write(dir.join("now.svg"), &chart.svg).unwrap();
    assert!(
        checked_in == chart.svg,
        "{} differs from the demo's chart (now in {}); rerun with CARE_BLESS=1 if intended",
        path.display(),
        dir.join("now.svg").display()
    );
}

// ---------------------------------------------------------------------------------------------
// Hostile input.

mod hostile {
    use super::*;
    use proptest::prelude::*;

    const KEYS: [&str; 40] = [
        "id",
        "verdict",
        "judge",
        "a",
        "b",
        "result",
        "systems",
        "choice",
        "care_log",
        "group",
        "index",
        "group_size",
        "status",
        "reward",
        "scores",
        "judge_attempts",
        "rubric_status",
        "rubric_attempts",
        "repairs",
        "rubric_weights",
        "responses",
        "response_chars",
        "variant",
        "model",
        "turn",
        "emotion",
        "text",
        "rubric",
        "validation",
        "format_reward",
        "violations",
        "weights",
        "criteria",
        "chosen_scores",
        "rejected_scores",
        "chosen_reward",
        "rejected_reward",
        "r_pref",
        "tactics",
        "code",
    ];

    fn value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::{Value, json};
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![
                Just(0.0),
                Just(1.0),
                Just(-0.0),
                Just(1e308),
                Just(-1e308),
                Just(0.5)
            ]
            .prop_map(|x| json!(x)),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(|x| json!(x)),
            prop_oneof![
                Just("joy"),
                Just("ok"),
                Just("win"),
                Just(""),
                Just(" "),
                Just("advice"),
                Just("weight_sum"),
                Just("{}"),
                Just("[Question]"),
                Just("é\u{0}"),
            ]
            .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
                prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..6).prop_map(
                    |kv| {
                        serde_json::Value::Object(
                            kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                        )
                    }
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Relation: any line gives either a record or a skip with a known code, never a panic
        /// (`internal_error` is what the engine turns a panic into), and the report renders.
        #[test]
        fn any_line_is_analyzed_or_skipped_with_a_code(lines in prop::collection::vec(value(), 1..12)) {
            let text: Vec<String> = lines.iter().map(|v| v.to_string()).collect();
            let input = text.join("\n") + "\n";
            let mut errors = Vec::new();
            let acc = analyze_with(&Options::default(), compare(&[("joy", "ok")]), input.as_bytes(), &EngineOptions::default(), &mut errors).unwrap();
            prop_assert_eq!(acc.lines, lines.len() as u64);
            let errors = String::from_utf8(errors).unwrap();
            prop_assert!(!errors.contains("internal_error"), "{}", errors);
            prop_assert_eq!(errors.lines().count() as u64, acc.skipped_lines());
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("analyze/hostile");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            report::write(&dir, &acc, &Meta::default()).unwrap();
            for name in ["report.md", "index.html"] {
                let text = std::fs::read_to_string(dir.join(name)).unwrap();
                // A largest |sum(w) - 1| may be inf (the sum of 1e308s); a mean is never NaN.
                prop_assert!(!text.contains("NaN"), "{}", name);
            }
        }
    }
}
