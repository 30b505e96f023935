//! `validate_indexed_into`: a caller's syntax pass in place of the validator's own. Each test
//! names the relation it checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::format::{
    FormatPolicy, SyntaxIndex, Validation, validate_indexed_into, validate_str_into,
};
use proptest::prelude::*;

/// The caller of these tests: a plain recursive-descent pass over text that serde_json accepted,
/// recording every string and the direct children of the value. `skip(k)` drops the k-th
/// string and `children` says whether containers are recorded, to check partial indexes.
struct Indexer<'a> {
    b: &'a [u8],
    i: usize,
    strings: Vec<(usize, usize, bool)>,
    children: Vec<(usize, usize)>,
}

impl Indexer<'_> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| b" \t\r\n".contains(c)) {
            self.i += 1;
        }
    }

    fn value(&mut self, depth: usize) {
        self.ws();
        let start = self.i;
        match self.b[self.i] {
            b'{' | b'[' => {
                let close = if self.b[self.i] == b'{' { b'}' } else { b']' };
                self.i += 1;
                loop {
                    self.ws();
                    if self.b[self.i] == close {
                        self.i += 1;
                        break;
                    }
                    if self.b[self.i] == b',' {
                        self.i += 1;
                        self.ws();
                    }
                    if close == b'}' {
                        self.string();
                        self.ws();
                        assert_eq!(self.b[self.i], b':');
                        self.i += 1;
                    }
                    self.value(depth + 1);
                }
                if depth == 1 {
                    self.children.push((start, self.i));
                }
            }
            b'"' => self.string(),
            _ => {
                while self
                    .b
                    .get(self.i)
                    .is_some_and(|c| !b",]} \t\r\n".contains(c))
                {
                    self.i += 1;
                }
            }
        }
    }

    fn string(&mut self) {
        let start = self.i;
        let mut escaped = false;
        self.i += 1;
        while self.b[self.i] != b'"' {
            if self.b[self.i] == b'\\' {
                escaped = true;
                self.i += 1;
            }
            self.i += 1;
        }
        self.i += 1;
        self.strings.push((start, self.i, escaped));
    }
}

/// The index of `text` (which must be one JSON value), keeping every string whose position is
/// not a multiple of `drop_every` (0: keep all) and the children when `children`.
fn index_of(text: &str, drop_every: usize, children: bool) -> SyntaxIndex {
    let mut ix = Indexer {
        b: text.as_bytes(),
        i: 0,
        strings: Vec::new(),
        children: Vec::new(),
    };
    ix.value(0);
    let end = ix.i;
    ix.ws();
    let start = text.len() - text.trim_start_matches([' ', '\t', '\r', '\n']).len();
    let mut index = SyntaxIndex::new();
    for (k, &(s, e, esc)) in ix.strings.iter().enumerate() {
        if drop_every == 0 || k % drop_every != 0 {
            index.string(s, e, esc);
        }
    }
    if children {
        for &(s, e) in &ix.children {
            index.child(s, e);
        }
    }
    index.value(start, end);
    index
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn policies() -> [FormatPolicy; 3] {
    [
        FormatPolicy::PAPER,
        FormatPolicy::lenient(),
        FormatPolicy {
            allow_envelope: true,
            ..FormatPolicy::PAPER
        },
    ]
}

fn both(text: &str, index: &SyntaxIndex, policy: &FormatPolicy) -> (String, String) {
    let mut s1 = vec![0u8; text.len()];
    let mut s2 = vec![0u8; text.len()];
    let mut want = Validation::default();
    validate_str_into(text, policy, &mut s1, &mut want).unwrap();
    let mut got = Validation::default();
    validate_indexed_into(text, index, policy, &mut s2, &mut got).unwrap();
    (format!("{got:?}"), format!("{want:?}"))
}

/// Edits that keep a rubric JSON but change what the validator sees: weights, anchors, keys,
/// escapes, envelopes and whitespace.
fn edits() -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec((0usize..12, any::<usize>()), 0..4)
}

const REPLACEMENTS: [(&str, &str); 12] = [
    ("0.4", "0.7"),
    ("[3]", "[9]"),
    ("\"title\"", "\"titel\""),
    ("value: 0", "value: 1"),
    (" the ", " \\u0074he "),
    ("[1]", "\\u005b1]"),
    ("\"criteria\"", "\"criteria\" "),
    (",", " , "),
    (
        "{\"categories\"",
        "{\"analysis\":\"\\n\",\"rubric\":{\"categories\"",
    ),
    (":", ":\n"),
    ("\"category\"", "\"category\",\"category\""),
    ("[4]", "gold [4]"),
];

fn edited(base: &str, edits: &[(usize, usize)]) -> String {
    let mut t = base.to_owned();
    for &(k, at) in edits {
        let (from, to) = REPLACEMENTS[k];
        let hits: Vec<usize> = t.match_indices(from).map(|(p, _)| p).collect();
        if let Some(&p) = hits.get(at % hits.len().max(1)) {
            t.replace_range(p..p + from.len(), to);
        }
    }
    if t.contains("\"rubric\":{\"categories\"") {
        t.push('}');
    }
    t
}

proptest! {
    /// For text that is one JSON value, `validate_indexed_into` gives exactly the report and
    /// rubric of `validate_str_into`, with a full index, with every k-th string left out, and
    /// without the children's extents, under the paper, lenient and envelope policies.
    #[test]
    fn indexed_validation_equals_full_validation(
        which in 0usize..2,
        edits in edits(),
        pad in prop_oneof![Just(""), Just(" "), Just("\n\t ")],
        drop_every in prop_oneof![Just(0usize), 1usize..5],
        children in any::<bool>(),
    ) {
        let base = fixture(["rubric_sft_1.json", "rubric_sft_2.json"][which]);
        let compact = serde_json::from_str::<serde_json::Value>(&base).unwrap().to_string();
        for body in [base.clone(), compact] {
            let text = format!("{pad}{}{pad}", edited(&body, &edits));
            if serde_json::from_str::<serde_json::Value>(&text).is_err() {
                continue;
            }
            let index = index_of(&text, drop_every, children);
            prop_assert!(index.matches(&text), "the test's index disagrees with the validator's");
            for policy in policies() {
                let (got, want) = both(&text, &index, &policy);
                prop_assert_eq!(got, want, "{:?}", policy);
            }
        }
    }

    /// Whatever the index says, on any text, validation returns (no panic, no out-of-range
    /// slice): a wrong index can only give a wrong report.
    #[test]
    fn a_wrong_index_never_panics(
        text in prop_oneof!["\\PC{0,80}", "[{}\\[\\]\",: 0-9a-z\\\\]{0,80}"],
        strings in prop::collection::vec((0usize..90, 0usize..90, any::<bool>()), 0..12),
        children in prop::collection::vec((0usize..90, 0usize..90), 0..4),
        value in (0usize..90, 0usize..90),
    ) {
        let mut index = SyntaxIndex::new();
        for &(s, e, esc) in &strings {
            index.string(s, e, esc);
        }
        for &(s, e) in &children {
            index.child(s, e);
        }
        index.value(value.0, value.1);
        for policy in policies() {
            let mut scratch = vec![0u8; text.len()];
            let mut out = Validation::default();
            validate_indexed_into(&text, &index, &policy, &mut scratch, &mut out).unwrap();
        }
    }
}

/// `matches` accepts exactly the indexes that say what the validator's own pass says: a string
/// recorded one byte off, a wrong escape flag, a child with the wrong end or a value with the
/// wrong end do not match.
#[test]
fn matches_rejects_an_index_that_disagrees_with_the_own_pass() {
    let text = r#" {"a": "x\ny", "b": [1, {"c": "d"}], "e": {}} "#;
    let good = index_of(text, 0, true);
    assert!(good.matches(text));
    assert!(
        index_of(text, 2, false).matches(text),
        "a partial index still matches"
    );
    let strings = [(2, 5, false), (7, 13, true), (15, 18, false)];
    let build = |strings: &[(usize, usize, bool)], child: (usize, usize), value: (usize, usize)| {
        let mut ix = SyntaxIndex::new();
        for &(s, e, esc) in strings {
            ix.string(s, e, esc);
        }
        ix.child(child.0, child.1);
        ix.value(value.0, value.1);
        ix
    };
    let (child, value) = ((20, 35), (1, text.len() - 1));
    assert!(build(&strings, child, value).matches(text));
    assert!(!build(&[(3, 5, false)], child, value).matches(text));
    assert!(!build(&[(7, 13, false)], child, value).matches(text));
    assert!(!build(&strings, (20, 36), value).matches(text));
    assert!(!build(&strings, child, (1, text.len())).matches(text));
    assert!(!SyntaxIndex::new().matches(text), "no value");
}

/// An index without a value, or one outside what the envelope options leave of the text, is
/// ignored: the text gets the full syntax pass (here it reports `not_json`).
#[test]
fn an_index_without_a_usable_value_is_ignored() {
    let text = "{\"categories\": [1, }";
    let mut index = SyntaxIndex::new();
    index.string(1, 13, false);
    let (got, want) = both(text, &index, &FormatPolicy::PAPER);
    assert_eq!(got, want);
    assert!(want.contains("NotJson"), "{want}");
    index.value(0, text.len() + 5);
    let (got, want) = both(text, &index, &FormatPolicy::PAPER);
    assert_eq!(got, want);
    let think = format!("<think>x</think>{text}");
    let mut index = index_of("{}", 0, true);
    index.value(0, 2);
    let lenient = FormatPolicy::lenient();
    let (got, want) = both(&think, &index, &lenient);
    assert_eq!(got, want);
}
