//! Hostile inputs (issue 7): every one must give a clear error (or a documented, well-defined
//! result), with bounded memory and bounded time, through each surface that reads text: the
//! core validator, the judge-output parser, the C ABI and a CLI line.
//!
//! "Bounded memory" is checked structurally: the core validator gets a scratch buffer of
//! exactly the input's length and cannot allocate; the CLI engine is fed a 100 MB line from a
//! generator (`io::repeat`), so a reader that buffered the whole line would still pass, but
//! the output must be the `line_too_long` error line. No timing is asserted (CI catches hangs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{self, Read};

use care_cli::Command;
use care_cli::engine::{self, EngineOptions, LineProcessor};
use care_core::grpo::AdvantageOptions;
use care_core::{
    Dimension, Error, FormatPolicy, RubricBuf, Validation, ViolationCode, parse_judge_output,
    validate,
};
use care_ffi::care_result;
use care_ffi::rubric::{care_rubric_free, care_rubric_parse};
use care_tests::oracle;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn rubric1() -> Vec<u8> {
    fixture("rubric_sft_1.json")
}

/// Replaces the first occurrence of `from` (which must exist) in `text`.
fn replace_once(text: &[u8], from: &str, to: &[u8]) -> Vec<u8> {
    let s = text;
    let p = s
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from:?} not in the fixture"));
    [&s[..p], to, &s[p + from.len()..]].concat()
}

/// Validates under the paper policy with a scratch of the input's length (always enough).
fn check<R>(text: &[u8], f: impl FnOnce(&Validation<'_>) -> R) -> R {
    let mut scratch = vec![0u8; text.len()];
    let v = validate(text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    // Every message renders on one line, whatever the input.
    for viol in v.report.violations() {
        assert!(!viol.to_string().contains('\n'), "{viol}");
    }
    f(&v)
}

fn codes(v: &Validation<'_>) -> Vec<&'static str> {
    v.report
        .violations()
        .iter()
        .map(|x| x.code.as_str())
        .collect()
}

/// `care_rubric_parse` through the C ABI: the result code (the handle is freed).
fn ffi_parse(text: &[u8]) -> care_result {
    let mut h = std::ptr::null();
    // SAFETY: `text` is valid for its length; `h` is a valid out pointer.
    let r =
        unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), std::ptr::null(), &mut h) };
    assert_ne!(r, care_result::CARE_ERR_PANIC);
    // SAFETY: `h` is NULL or a handle from `care_rubric_parse`.
    unsafe { care_rubric_free(h) };
    r
}

/// One CLI line through the binary's code path (`care advantages`): the error code, if any.
fn cli_error(line: &[u8]) -> Option<String> {
    let cmd = Command::Advantages(AdvantageOptions::default().into());
    let (out, ok) = care_cli::process_line(&cmd, 1, line);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["line"], 1);
    if ok {
        None
    } else {
        Some(v["error"]["code"].as_str().unwrap().to_owned())
    }
}

#[test]
fn nesting_100k_deep_is_a_capacity_error() {
    for text in [
        "[".repeat(100_000),
        "{\"a\":".repeat(100_000),
        format!("{{\"categories\":{}", "[".repeat(100_000)),
    ] {
        check(text.as_bytes(), |v| {
            assert!(v.rubric.is_none());
            assert_eq!(codes(v), ["capacity"], "{}", v.report);
        });
        assert_eq!(ffi_parse(text.as_bytes()), care_result::CARE_ERR_CAPACITY);
        // serde_json (the CLI's parser) stops at its recursion limit.
        assert_eq!(cli_error(text.as_bytes()).as_deref(), Some("not_json"));
    }
    // Just inside the core's limit (64) is fine as JSON, and then a schema problem.
    let ok = "[".repeat(64) + &"]".repeat(64);
    check(ok.as_bytes(), |v| assert_eq!(codes(v), ["schema"]));
}

#[test]
fn judge_output_100k_deep_finds_no_json() {
    let text = rubric1();
    let mut scratch = vec![0u8; text.len()];
    let v = validate(&text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rubric = RubricBuf::from(v.rubric.as_ref().unwrap());
    let r = rubric.rubric();
    let mut out = vec![0.0; r.total_criteria()];
    for hostile in [
        "{".repeat(100_000),
        "{\"criterion_scores\":".repeat(100_000),
        format!("{{\"criterion_scores\":[{}", "[".repeat(100_000)),
        "```json\n".repeat(20_000),
    ] {
        assert_eq!(
            parse_judge_output(hostile.as_bytes(), &r, &mut out),
            Err(Error::NoJudgeJson)
        );
        assert!(out.iter().all(|x| x.is_nan()));
    }
}

#[test]
fn a_100_mb_rubric_is_parsed_in_place() {
    // A 100 MB title without escapes is borrowed from the input (no copy); a 100 MB run of
    // escapes is decoded into the caller's scratch, which the input's length always covers.
    let big = "x".repeat(100 << 20);
    let text = replace_once(&rubric1(), "Accurately Understand", big.as_bytes());
    check(&text, |v| {
        assert!(v.is_valid(), "{}", v.report);
        let title = v.rubric.as_ref().unwrap().criteria(Dimension::Cognitive)[0].title;
        assert_eq!(title.len(), big.len() + " the Core Dilemma".len());
    });
    let esc = "\\n".repeat(50 << 20);
    let text = replace_once(&rubric1(), "Accurately Understand", esc.as_bytes());
    check(&text, |v| {
        assert!(v.is_valid(), "{}", v.report);
        let title = v.rubric.as_ref().unwrap().criteria(Dimension::Cognitive)[0].title;
        assert_eq!(title.len(), (50 << 20) + " the Core Dilemma".len());
    });
    // Too small a scratch is a capacity violation, not an overrun.
    let mut small = vec![0u8; 1024];
    let v = validate(&text, &FormatPolicy::PAPER, &mut small).unwrap();
    assert!(v.report.has(ViolationCode::Capacity), "{}", v.report);
}

/// Counts what a CLI run wrote.
struct Count(Vec<u8>);
impl io::Write for Count {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_100_mb_cli_line_is_line_too_long() {
    let cmd = Command::Advantages(AdvantageOptions::default().into());
    let input = io::repeat(b' ')
        .take(100 << 20)
        .chain(&b"\n{\"rewards\":[1,0],\"group_size\":2}\n"[..]);
    let mut out = Count(Vec::new());
    let opts = EngineOptions {
        threads: 1,
        ..EngineOptions::default()
    };
    assert_eq!(opts.max_line_bytes, 16 << 20, "the default limit is 16 MiB");
    let s = engine::run(
        &cmd as &dyn LineProcessor,
        io::BufReader::new(input),
        &mut out,
        &opts,
    )
    .unwrap();
    assert_eq!((s.lines, s.failed), (2, 1));
    let text = String::from_utf8(out.0).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].contains(r#""code":"line_too_long""#),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains(r#""advantages""#), "{}", lines[1]);
    // The limit is an option.
    let small = EngineOptions {
        max_line_bytes: 10,
        threads: 1,
        ..EngineOptions::default()
    };
    let mut out = Count(Vec::new());
    let input = &b"{\"rewards\":[1,0],\"group_size\":2}\n"[..];
    let s = engine::run(&cmd as &dyn LineProcessor, input, &mut out, &small).unwrap();
    assert_eq!((s.lines, s.failed), (1, 1));
}

#[test]
fn huge_and_negative_zero_numbers() {
    let r = rubric1();
    // 1e999 overflows f64: read as +inf, which is outside [0, 1] (and the sum is off too).
    let text = replace_once(
        &r,
        "\"category_weight\": 0.4",
        b"\"category_weight\": 1e999",
    );
    check(&text, |v| {
        assert_eq!(codes(v), ["weight_range", "weight_sum"], "{}", v.report);
        let w = v
            .rubric
            .as_ref()
            .unwrap()
            .category(Dimension::Cognitive)
            .weight;
        assert_eq!(w, f64::INFINITY);
    });
    assert_eq!(ffi_parse(&text), care_result::CARE_ERR_FORMAT_VIOLATION);
    // -1e999 likewise; 1e-999 underflows to 0 (in range, so only the sum is off).
    let text = replace_once(
        &r,
        "\"category_weight\": 0.4",
        b"\"category_weight\": -1e999",
    );
    check(&text, |v| {
        assert_eq!(codes(v), ["weight_range", "weight_sum"], "{}", v.report)
    });
    let text = replace_once(
        &r,
        "\"category_weight\": 0.4",
        b"\"category_weight\": 1e-999",
    );
    check(&text, |v| {
        assert_eq!(codes(v), ["weight_sum"], "{}", v.report)
    });
    // -0 is zero, in range.
    let text = replace_once(&r, "\"category_weight\": 0.4", b"\"category_weight\": -0");
    check(&text, |v| {
        assert_eq!(codes(v), ["weight_sum"], "{}", v.report);
        assert_eq!(
            v.rubric
                .as_ref()
                .unwrap()
                .category(Dimension::Cognitive)
                .weight,
            0.0
        );
    });
    // The CLI's strict JSON refuses numbers beyond f64 and says so.
    assert_eq!(
        cli_error(br#"{"rewards":[1e999,0],"group_size":2}"#).as_deref(),
        Some("not_json")
    );
    assert_eq!(cli_error(br#"{"rewards":[-0,0],"group_size":2}"#), None);
}

#[test]
fn invalid_utf8_is_not_json_with_its_offset() {
    let mut text = rubric1();
    text[100] = 0xff;
    check(&text, |v| {
        assert!(v.rubric.is_none());
        assert_eq!(codes(v), ["not_json"]);
        assert_eq!(v.report.violations()[0].offset, Some(100));
    });
    assert_eq!(ffi_parse(&text), care_result::CARE_ERR_NOT_JSON);
    assert_eq!(
        cli_error(b"{\"rewards\":[1],\"group_size\":1,\"id\":\"\xc3\x28\"}").as_deref(),
        Some("invalid_utf8")
    );
    let r = RubricBuf::from(&care_core::Rubric::new());
    let mut out = [];
    assert_eq!(
        parse_judge_output(b"\xff{}", &r.rubric(), &mut out),
        Err(Error::InvalidUtf8)
    );
}

#[test]
fn lone_surrogate_escapes_are_not_json() {
    // An unpaired surrogate escape names no character: the validator rejects the text like
    // serde_json does (so the differential oracle agrees), with the offset of the escape.
    let base = rubric1();
    let at = base
        .windows(b"Accurately".len())
        .position(|w| w == b"Accurately")
        .unwrap();
    for esc in ["\\ud800", "\\udc00", "\\ud800\\u0041", "\\udbff\\ud800"] {
        let text = replace_once(&base, "Accurately", format!("{esc}Accurately").as_bytes());
        check(&text, |v| {
            assert!(v.rubric.is_none(), "{esc}");
            assert_eq!(codes(v), ["not_json"], "{esc}: {}", v.report);
            let viol = &v.report.violations()[0];
            assert_eq!(viol.offset, Some(at), "{esc}: {viol}");
            assert!(viol.to_string().contains("surrogate"), "{esc}: {viol}");
        });
        assert_eq!(ffi_parse(&text), care_result::CARE_ERR_NOT_JSON, "{esc}");
        assert_eq!(
            oracle::reference(&text),
            oracle::RefOutcome::NotJson(oracle::JsonReject::LoneSurrogate),
            "{esc}"
        );
        assert_eq!(oracle::compare(&text), Ok(()), "{esc}");
    }
    // A valid pair in the same place still decodes.
    let text = replace_once(&base, "Accurately", b"\\ud83d\\ude00Accurately");
    check(&text, |v| {
        assert!(v.is_valid(), "{}", v.report);
        let title = v.rubric.as_ref().unwrap().criteria(Dimension::Cognitive)[0].title;
        assert!(title.starts_with("\u{1F600}Accurately"), "{title:?}");
    });
    assert_eq!(oracle::compare(&text), Ok(()));
    assert_eq!(
        cli_error(br#"{"rewards":[1,0],"group_size":2,"id":"\ud800"}"#).as_deref(),
        Some("not_json")
    );
}

#[test]
fn judge_output_with_a_lone_surrogate_is_not_json() {
    // The judge parser skips candidate objects that are not valid JSON; a lone surrogate in a
    // title makes the whole answer unusable (no other object holds criterion_scores) rather
    // than a U+FFFD title that matches nothing.
    let text = rubric1();
    let mut scratch = vec![0u8; text.len()];
    let v = validate(&text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rb = RubricBuf::from(v.rubric.as_ref().unwrap());
    let r = rb.rubric();
    let title = r.criteria(Dimension::Cognitive)[0].title;
    let mut out = vec![0.0; r.total_criteria()];
    let answer = |t: &str| {
        format!(
            r#"{{"criterion_scores":[{{"category":"Cognitive Empathy","criterion_title":"{t}","score":4}}]}}"#
        )
    };
    for esc in ["\\ud800", "\\udc00", "\\ud800\\u0041"] {
        let judge = answer(&format!("{esc}{title}"));
        assert_eq!(
            parse_judge_output(judge.as_bytes(), &r, &mut out),
            Err(Error::NoJudgeJson),
            "{esc}"
        );
        assert!(out.iter().all(|x| x.is_nan()));
        // Lenient about the envelope: a valid object after the broken one is still found.
        let two = format!("{judge}\n{}", answer(title));
        let rep = parse_judge_output(two.as_bytes(), &r, &mut out).unwrap();
        assert_eq!(rep.matched, 1, "{esc}");
        assert_eq!(out[0], 4.0);
    }
    // An escaped title with a valid pair decodes and is compared as text (it matches nothing
    // here, so it is unknown, not an error).
    let judge = answer(&format!("\\ud83d\\ude00{title}"));
    let rep = parse_judge_output(judge.as_bytes(), &r, &mut out).unwrap();
    assert_eq!((rep.matched, rep.unknown), (0, 1));
}

#[test]
fn nul_bytes() {
    let r = rubric1();
    // A raw NUL inside a string is a control character; outside, not JSON.
    let text = replace_once(&r, "Accurately", b"Accu\0rately");
    check(&text, |v| assert_eq!(codes(v), ["not_json"]));
    let mut text = r.clone();
    text.push(0);
    check(&text, |v| assert_eq!(codes(v), ["trailing_text"]));
    assert_eq!(ffi_parse(&text), care_result::CARE_ERR_TRAILING_TEXT);
    // An escaped NUL is a character like any other; the C ABI is length-delimited.
    let text = replace_once(&r, "Accurately", b"\\u0000Accurately");
    check(&text, |v| {
        assert!(v.is_valid(), "{}", v.report);
        let title = v.rubric.as_ref().unwrap().criteria(Dimension::Cognitive)[0].title;
        assert!(title.starts_with('\0'));
    });
    assert_eq!(ffi_parse(&text), care_result::CARE_OK);
    assert_eq!(
        cli_error(b"{\"rewards\":[1,0],\0\"group_size\":2}").as_deref(),
        Some("not_json")
    );
}

#[test]
fn ten_thousand_criteria_are_counted_not_stored() {
    let one = r#"{"title":"T","description":"[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"}"#;
    let many = vec![one; 10_000].join(",");
    let r = rubric1();
    let p = r.windows(12).position(|w| w == b"\"criteria\": ").unwrap() + 12;
    let text = [&r[..p], format!("[{many}],\"x\":").as_bytes(), &r[p..]].concat();
    check(&text, |v| {
        let rep = &v.report;
        assert!(rep.has(ViolationCode::CriteriaCount), "{rep}");
        // Capacity is reported once, not 10k times, and the report stays within its fixed size.
        assert_eq!(rep.count(ViolationCode::Capacity), 1, "{rep}");
        assert!(rep.violations().len() <= care_core::format::MAX_VIOLATIONS);
        let stored = v
            .rubric
            .as_ref()
            .unwrap()
            .criteria(Dimension::Cognitive)
            .len();
        assert_eq!(stored, care_core::rubric::MAX_CRITERIA);
    });
    assert_ne!(ffi_parse(&text), care_result::CARE_OK);
}

#[test]
fn duplicate_keys_are_schema_violations() {
    let r = rubric1();
    let text = replace_once(
        &r,
        "\"categories\": [",
        b"\"categories\": [], \"categories\": [",
    );
    check(&text, |v| {
        assert!(v.report.has(ViolationCode::Schema), "{}", v.report);
        assert!(!v.is_valid());
    });
    let text = replace_once(
        &r,
        "\"category_weight\": 0.4",
        b"\"category_weight\": 0.4, \"category_weight\": 0.4",
    );
    check(&text, |v| assert_eq!(codes(v), ["schema"], "{}", v.report));
    let text = replace_once(&r, "\"title\": ", b"\"title\": \"X\", \"title\": ");
    check(&text, |v| {
        assert!(codes(v).contains(&"schema"), "{}", v.report)
    });
    assert_eq!(ffi_parse(&text), care_result::CARE_ERR_SCHEMA);
    assert_eq!(
        cli_error(br#"{"rewards":[1,0],"group_size":2,"group_size":2}"#).as_deref(),
        Some("duplicate_key")
    );
}

#[test]
fn a_byte_order_mark_is_rejected() {
    let text = [&b"\xef\xbb\xbf"[..], &rubric1()].concat();
    check(&text, |v| {
        assert!(!v.is_valid());
        assert!(
            v.report.has(ViolationCode::TrailingText) || v.report.has(ViolationCode::NotJson),
            "{}",
            v.report
        );
    });
    assert_ne!(ffi_parse(&text), care_result::CARE_OK);
    assert_eq!(
        cli_error(b"\xef\xbb\xbf{\"rewards\":[1,0],\"group_size\":2}").as_deref(),
        Some("not_json")
    );
}

#[test]
fn every_hostile_rubric_agrees_with_the_oracle() {
    let r = rubric1();
    let cases: Vec<Vec<u8>> = vec![
        "[".repeat(100_000).into_bytes(),
        replace_once(
            &r,
            "\"category_weight\": 0.4",
            b"\"category_weight\": 1e999",
        ),
        replace_once(&r, "\"category_weight\": 0.4", b"\"category_weight\": -0"),
        replace_once(
            &r,
            "\"categories\": [",
            b"\"categories\": [], \"categories\": [",
        ),
        [&b"\xef\xbb\xbf"[..], &r].concat(),
        replace_once(&r, "Accurately", b"\\ud800Accurately"),
        replace_once(&r, "Accurately", b"\\u0000Accurately"),
        replace_once(&r, "Accurately", b"Accu\0rately"),
        [&r[..], b"\0"].concat(),
        r.clone(),
    ];
    for c in &cases {
        oracle::compare(c).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn judge_output_duplicate_keys_and_items_keep_the_first() {
    let text = rubric1();
    let mut scratch = vec![0u8; text.len()];
    let v = validate(&text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rubric = RubricBuf::from(v.rubric.as_ref().unwrap());
    let r = rubric.rubric();
    let c = &r.criteria(Dimension::Cognitive)[0];
    let title = c.title;
    let judge = format!(
        r#"{{"criterion_scores":[
            {{"category":"Cognitive Empathy","criterion_title":"{title}","score":4,"score":1}},
            {{"category":"Cognitive Empathy","criterion_title":"{title}","score":2}}]}}"#
    );
    let mut out = vec![0.0; r.total_criteria()];
    let rep = parse_judge_output(judge.as_bytes(), &r, &mut out).unwrap();
    assert_eq!(out[0], 4.0, "the first `score` key and the first item win");
    assert_eq!((rep.matched, rep.duplicates), (1, 1));
}
