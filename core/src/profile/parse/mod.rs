//! Profile JSON: parsing and validation with every violation reported.
//!
//! Like [`crate::format::validate`] for rubrics: one pass over the JSON (the crate's zero-copy
//! scanner, no recursion, no allocation) that reports **every** violation (up to
//! [`MAX_PROFILE_VIOLATIONS`], then an overflow flag), each with a stable code, where it is and
//! a one-line message. A profile with any violation is rejected as a whole: a half-valid
//! profile would score with rules nobody wrote. The schema is documented in `docs/PROFILES.md`.

mod dimensions;
mod emotion;
mod output;
mod report;

pub use report::{ProfileCode, ProfilePath, ProfileReport, ProfileViolation};

use super::{MAX_NAME_BYTES, MAX_SCALE, MAX_SPANS, Profile, ProfileLayout, StrRef};
use crate::format::{Arg, ShortText};
use crate::json::{self, JStr, Kind, PlainCursor};

/// Most violations a [`ProfileReport`] holds; more set [`ProfileReport::overflowed`].
pub const MAX_PROFILE_VIOLATIONS: usize = 64;

/// Longest profile text (offsets are `u32`); a longer one is a `capacity` violation, found
/// before any scratch is used, so callers size no scratch for it.
pub const MAX_PROFILE_TEXT_BYTES: usize = u32::MAX as usize;

/// Allowed `|sum(w) - 1|` of a fixed profile's dimension weights (as for rubrics).
pub const PROFILE_WEIGHT_TOLERANCE: f64 = 1e-3;

/// Largest `|weight|` of a criterion.
pub const MAX_CRITERION_WEIGHT: f64 = 1e6;

/// The result of [`parse_profile`]: the profile when the text has no violation, and the report.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileValidation<'a> {
    /// The profile, when there is no violation at all.
    pub profile: Option<Profile<'a>>,
    /// Every violation found.
    pub report: ProfileReport,
}

/// Parses and validates profile JSON.
///
/// Strings without escapes are borrowed from `text`; strings with escapes are decoded into
/// `scratch` (decoding never makes a string longer, so `text.len()` bytes always suffice; a
/// string that does not fit is a `capacity` violation). Never panics, never allocates.
pub fn parse_profile<'a>(text: &'a [u8], scratch: &'a mut [u8]) -> ProfileValidation<'a> {
    let mut p = Parser {
        text: "",
        scratch,
        used: 0,
        report: ProfileReport::default(),
        layout: ProfileLayout::default(),
        span_names: heapless::Vec::new(),
    };
    match core::str::from_utf8(text) {
        Ok(t) => {
            p.text = t;
            p.run();
        }
        Err(e) => p.push(
            ProfileCode::NotJson,
            ProfilePath::Root,
            Some(e.valid_up_to()),
            "the text is not valid UTF-8",
            Arg::None,
        ),
    }
    let Parser {
        text,
        scratch,
        used,
        report,
        layout,
        ..
    } = p;
    let scratch: &'a [u8] = scratch;
    let decoded = scratch
        .get(..used)
        .and_then(|d| core::str::from_utf8(d).ok());
    let profile = match decoded {
        Some(d) if report.is_ok() => Some(Profile::from_parts(text, d, layout)),
        _ => None,
    };
    ProfileValidation { profile, report }
}

struct Parser<'a> {
    text: &'a str,
    scratch: &'a mut [u8],
    used: usize,
    report: ProfileReport,
    layout: ProfileLayout,
    /// The valid names of `output.spans` (also when the output section has other faults).
    span_names: heapless::Vec<StrRef, MAX_SPANS>,
}

/// The top-level keys, in the order they are processed (later ones refer to earlier ones).
const TOP_KEYS: [&str; 8] = [
    "name",
    "description",
    "rubric",
    "scores",
    "dimensions",
    "output",
    "emotion",
    "vetoes",
];

fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

fn names_equal(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

impl<'a> Parser<'a> {
    fn push(
        &mut self,
        code: ProfileCode,
        path: ProfilePath,
        offset: Option<usize>,
        note: &'static str,
        arg: Arg,
    ) {
        self.report.push(ProfileViolation {
            code,
            path,
            offset,
            note,
            arg,
        });
    }

    fn get(&self, r: StrRef) -> &str {
        let a = r.start as usize;
        let b = a + r.len as usize;
        if r.decoded {
            self.scratch
                .get(a..b)
                .and_then(|s| core::str::from_utf8(s).ok())
                .unwrap_or("")
        } else {
            self.text.get(a..b).unwrap_or("")
        }
    }

    fn run(&mut self) {
        let text = self.text;
        let b = text.as_bytes();
        if b.len() > MAX_PROFILE_TEXT_BYTES {
            self.push(
                ProfileCode::Capacity,
                ProfilePath::Root,
                None,
                "the text is longer than 4 GiB",
                Arg::None,
            );
            return;
        }
        let start = json::skip_ws(b, 0);
        if start >= b.len() {
            self.push(
                ProfileCode::NotJson,
                ProfilePath::Root,
                Some(start),
                "the text is empty",
                Arg::None,
            );
            return;
        }
        let end = match json::scan_value(b, start) {
            Ok(end) => end,
            Err(e) => {
                let code = if e.too_deep {
                    ProfileCode::Capacity
                } else {
                    ProfileCode::NotJson
                };
                self.push(
                    code,
                    ProfilePath::Root,
                    Some(e.offset),
                    e.what.as_str(),
                    Arg::None,
                );
                return;
            }
        };
        let after = json::skip_ws(b, end);
        if after < b.len() {
            self.push(
                ProfileCode::TrailingText,
                ProfilePath::Root,
                Some(after),
                "text after the JSON value",
                Arg::None,
            );
        }
        let mut cur = PlainCursor::new(text, start);
        if cur.kind() != Kind::Object {
            let k = cur.kind();
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                Some(cur.pos),
                "the profile must be a JSON object, found",
                Arg::Text(ShortText::new(k.name())),
            );
            return;
        }
        let mut members: [Option<PlainCursor<'a>>; TOP_KEYS.len()] = [None; TOP_KEYS.len()];
        self.members(&mut cur, ProfilePath::Root, &TOP_KEYS, &mut members);
        let [
            name,
            description,
            rubric,
            scores,
            dimensions,
            output,
            emotion,
            vetoes,
        ] = members;
        match name {
            Some(mut c) => {
                if let Some(r) = self.name(
                    &mut c,
                    ProfilePath::Root,
                    "\"name\" must be a string, found",
                ) {
                    self.layout.name = r;
                }
            }
            None => self.missing(ProfilePath::Root, "name"),
        }
        if let Some(mut c) = description
            && let Some(r) = self.string(
                &mut c,
                ProfilePath::Root,
                "\"description\" must be a string, found",
            )
        {
            self.layout.description = r;
        }
        if let Some(mut c) = rubric {
            self.rubric(&mut c);
        }
        self.layout.min = 0;
        self.layout.max = 5;
        if let Some(mut c) = scores {
            self.scores(&mut c);
        }
        match dimensions {
            Some(mut c) => self.dimensions(&mut c),
            None => self.missing(ProfilePath::Root, "dimensions"),
        }
        if let Some(mut c) = output {
            self.output(&mut c);
        }
        if let Some(mut c) = emotion {
            self.emotion(&mut c);
        }
        if let Some(mut c) = vetoes {
            self.vetoes(&mut c);
        }
    }

    /// Walks the object at `cur`, storing a cursor on the value of each key of `keys`;
    /// unknown and duplicate keys are violations.
    fn members<const N: usize>(
        &mut self,
        cur: &mut PlainCursor<'a>,
        path: ProfilePath,
        keys: &[&str; N],
        out: &mut [Option<PlainCursor<'a>>; N],
    ) {
        cur.enter(b'{');
        while let Some(k) = cur.next_key() {
            match keys.iter().position(|n| k.eq_str(n)) {
                Some(i) if out[i].is_none() => out[i] = Some(*cur),
                Some(_) => self.key_problem(path, &k, "duplicate key"),
                None => self.key_problem(path, &k, "unknown key"),
            }
            cur.skip_value();
        }
    }

    fn key_problem(&mut self, path: ProfilePath, k: &JStr<'a>, note: &'static str) {
        self.push(
            ProfileCode::Schema,
            path,
            Some(k.offset),
            note,
            Arg::Text(ShortText::from_chars(k.chars())),
        );
    }

    fn missing(&mut self, path: ProfilePath, key: &'static str) {
        self.push(
            ProfileCode::Schema,
            path,
            None,
            "missing key",
            Arg::Text(ShortText::new(key)),
        );
    }

    fn wrong_type(&mut self, c: &mut PlainCursor<'a>, path: ProfilePath, note: &'static str) {
        let k = c.kind();
        self.push(
            ProfileCode::Schema,
            path,
            Some(c.pos),
            note,
            Arg::Text(ShortText::new(k.name())),
        );
    }

    /// Stores a JSON string (decoding escapes into the scratch buffer).
    fn store(&mut self, s: &JStr<'a>, path: ProfilePath) -> Option<StrRef> {
        if !s.escaped {
            return StrRef::new(s.offset + 1, s.raw.len(), false);
        }
        let n = s.decoded_len();
        let Some(dst) = self.scratch.get_mut(self.used..self.used + n) else {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(s.offset),
                "string too long for the scratch buffer",
                Arg::None,
            );
            return None;
        };
        let mut k = 0usize;
        for ch in s.chars() {
            let w = ch.len_utf8();
            if let Some(d) = dst.get_mut(k..k + w) {
                ch.encode_utf8(d);
            }
            k += w;
        }
        let r = StrRef::new(self.used, n, true);
        self.used += n;
        r
    }

    /// A string value (`None` after reporting a wrong type with `note`).
    fn string(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<StrRef> {
        match c.string() {
            Some(s) => self.store(&s, path),
            None => {
                self.wrong_type(c, path, note);
                None
            }
        }
    }

    /// A name: a non-blank string of at most [`MAX_NAME_BYTES`] bytes.
    fn name(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<StrRef> {
        let at = c.pos;
        let r = self.string(c, path, note)?;
        let s = self.get(r);
        if is_blank(s) {
            self.push(
                ProfileCode::EmptyText,
                path,
                Some(at),
                "blank name",
                Arg::None,
            );
            return None;
        }
        if s.len() > MAX_NAME_BYTES {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(at),
                "name longer than 64 bytes:",
                Arg::Text(ShortText::new(s)),
            );
            return None;
        }
        Some(r)
    }

    fn number(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<f64> {
        match c.number() {
            Some(n) => Some(n.parse::<f64>().unwrap_or(f64::NAN)),
            None => {
                self.wrong_type(c, path, note);
                None
            }
        }
    }

    /// An integer in `0..=MAX_SCALE` (reported as `score_range` otherwise).
    fn small_int(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<u8> {
        let at = c.pos;
        let v = self.number(c, path, note)?;
        let ok = v.is_finite() && libm::round(v) == v && (0.0..=f64::from(MAX_SCALE)).contains(&v);
        if !ok {
            self.push(
                ProfileCode::ScoreRange,
                path,
                Some(at),
                "not an integer in 0..=100:",
                Arg::Number(v),
            );
            return None;
        }
        Some(v as u8)
    }
}

fn idx(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}
