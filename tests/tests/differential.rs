//! The differential check of the fuzz target `rubric_diff`, in the ordinary test suite: the
//! zero-copy `no_std` validator of `care-core` against the independent serde_json reference
//! (`care_tests::oracle`), on the fixtures, on generated valid rubrics written with arbitrary
//! escapes and number spellings, and on byte-level mutations of the fixtures.
//!
//! Relation checked everywhere: `oracle::compare` (both accept or both reject; accepted rubrics
//! agree field by field; a JSON syntax error is seen by both).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use care_core::{Dimension, FormatPolicy, validate};
use care_tests::oracle::{self, RefOutcome};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn fixtures_are_valid_for_both_and_agree() {
    for name in ["rubric_sft_1.json", "rubric_sft_2.json"] {
        let text = fixture(name);
        assert!(
            matches!(oracle::reference(&text), RefOutcome::Valid(_)),
            "{name}"
        );
        oracle::compare(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Writes `s` as a JSON string, escaping each character in one of the ways JSON allows
/// (chosen by `style`), so that both decoders see `\uXXXX`, surrogate pairs and short escapes.
fn json_string(s: &str, style: &[u8]) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        let k = style.get(i % style.len().max(1)).copied().unwrap_or(0) % 4;
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || k == 1 => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            '/' if k == 2 => out.push_str("\\/"),
            '\n' if k == 3 => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

const LEVELS: &str =
    "[0] none [1] little [2] some [3] fair [4] good [5] full value: 0, 1, 2, 3, 4, 5";

fn text_strategy() -> impl Strategy<Value = String> {
    // Printable ASCII, a few non-ASCII letters, astral characters and whitespace.
    proptest::collection::vec(
        prop_oneof![
            8 => proptest::char::range(' ', '~'),
            1 => Just('é'),
            1 => Just('😀'),
            1 => Just('\t'),
            1 => Just('/'),
        ],
        1..24,
    )
    // A leading letter keeps every text non-blank (blank texts are `empty_text`).
    .prop_map(|v| std::iter::once('r').chain(v).collect())
}

#[derive(Debug, Clone)]
struct Gen {
    weights: [f64; 3],
    spelling: u8,
    titles: Vec<Vec<String>>,
    rationales: Vec<String>,
    prefixes: Vec<String>,
    style: Vec<u8>,
}

fn gen_strategy() -> impl Strategy<Value = Gen> {
    (
        (0.0f64..0.5, 0.0f64..0.5),
        any::<u8>(),
        proptest::collection::vec(proptest::collection::vec(text_strategy(), 2..=4), 3),
        proptest::collection::vec(text_strategy(), 3),
        proptest::collection::vec(text_strategy(), 3),
        proptest::collection::vec(any::<u8>(), 1..8),
    )
        .prop_map(
            |((a, b), spelling, titles, rationales, prefixes, style)| Gen {
                weights: [a, b, 1.0 - a - b],
                spelling,
                titles,
                rationales,
                prefixes,
                style,
            },
        )
}

/// Spells a weight in one of several valid JSON number forms.
fn number(w: f64, spelling: u8) -> String {
    match spelling % 4 {
        0 => format!("{w}"),
        1 => format!("{w:e}"),
        2 => format!("{:E}", w),
        _ => format!("{w:.17}"),
    }
}

fn render(g: &Gen) -> String {
    let cats: Vec<String> = Dimension::ALL
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let crits: Vec<String> = g.titles[i]
                .iter()
                .enumerate()
                // Index-suffixed titles are unique, so that the rubric can be valid.
                .map(|(k, t)| {
                    format!(
                        r#"{{"title": {}, "description": {}}}"#,
                        json_string(&format!("{t} #{i}.{k}"), &g.style),
                        // A "[k]" in the prefix would be a second level marker (the level
                        // format requires each once): `[` is spelled `(` there.
                        json_string(
                            &format!("{} {LEVELS}", g.prefixes[i].replace('[', "(")),
                            &g.style
                        )
                    )
                })
                .collect();
            format!(
                r#"{{"category": "{}", "weight_rationale": {}, "category_weight": {}, "criteria": [{}]}}"#,
                d.json_name(),
                json_string(&g.rationales[i], &g.style),
                number(g.weights[i], g.spelling),
                crits.join(", ")
            )
        })
        .collect();
    format!("{{\"categories\": [{}]}}", cats.join(",\n"))
}

/// A byte-level mutation of a fixture.
#[derive(Debug, Clone)]
enum Mutation {
    Insert(usize, &'static str),
    Delete(usize, usize),
    Byte(usize, u8),
}

const TOKENS: [&str; 24] = [
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\\u00e9",
    "\\ud800",
    "\\udc00",
    "\\ud83d\\ude00",
    "1e999",
    "-0",
    "0.5",
    "\0",
    "\u{feff}",
    "\"x\":1,",
    "null",
    "\\n",
    "[0]",
    "value: 0, 1, 2, 3, 4, 5",
    "\"title\": \"t\", ",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), proptest::sample::select(&TOKENS[..]))
            .prop_map(|(p, t)| Mutation::Insert(p, t)),
        (any::<usize>(), 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Byte(p, b)),
    ]
}

fn apply(text: &mut Vec<u8>, m: &Mutation) {
    let len = text.len().max(1);
    match *m {
        Mutation::Insert(p, t) => {
            let p = p % len;
            text.splice(p..p, t.bytes());
        }
        Mutation::Delete(p, n) => {
            let p = p % len;
            let e = (p + n).min(text.len());
            text.drain(p..e);
        }
        Mutation::Byte(p, b) => {
            if !text.is_empty() {
                let p = p % text.len();
                text[p] = b;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Relation: a generated valid rubric is valid for both decoders, with equal fields.
    #[test]
    fn generated_rubrics_agree(g in gen_strategy()) {
        let text = render(&g);
        let r = oracle::reference(text.as_bytes());
        // The weights are on the simplex up to rounding, the titles unique: valid by design.
        prop_assert!(matches!(r, RefOutcome::Valid(_)), "{r:?}\n{text}");
        prop_assert_eq!(oracle::compare(text.as_bytes()), Ok(()));
        let mut scratch = vec![0u8; text.len()];
        let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        prop_assert!(v.is_valid());
    }

    /// Relation: any mutation of a fixture is judged alike by both (`oracle::compare`).
    #[test]
    fn mutated_fixtures_agree(which in 0usize..2, ms in proptest::collection::vec(mutation(), 1..6)) {
        let mut text = fixture(["rubric_sft_1.json", "rubric_sft_2.json"][which]);
        for m in &ms {
            apply(&mut text, m);
        }
        prop_assert_eq!(oracle::compare(&text), Ok(()), "{}", String::from_utf8_lossy(&text));
    }
}
