//! The checks of a single text: the level anchors of a description and the meta-word lint.

use super::notes::{self, Note};
use super::report::{Arg, ShortText};
use crate::json;

/// Whether `s` is empty or only whitespace (`char::is_whitespace`, as `str::trim`).
///
/// Called for every title, description and level-anchor text, which are almost never blank:
/// the first byte that is not ASCII whitespace settles it without decoding characters, and
/// only a non-ASCII byte there (which may start a Unicode space) takes `str::trim`.
pub(super) fn is_blank(s: &str) -> bool {
    for &c in s.as_bytes() {
        match c {
            // The ASCII characters with the Unicode White_Space property.
            b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ' => {}
            0..=0x7f => return false,
            _ => return s.trim().is_empty(),
        }
    }
    true
}

/// The required end of every description.
pub const LEVEL_SUFFIX: &str = "value: 0, 1, 2, 3, 4, 5";

/// Checks the level anchors of a description (SPEC §3 `level_format`); the error is the first
/// problem found.
pub(super) fn check_levels(desc: &str) -> Result<(), (Note, Arg)> {
    const ANCHORS: [&str; 6] = ["[0]", "[1]", "[2]", "[3]", "[4]", "[5]"];
    let trimmed = desc.trim_end();
    let Some(body) = trimmed.strip_suffix(LEVEL_SUFFIX) else {
        return Err((
            notes::LEVEL_SUFFIX_MISSING,
            Arg::Text(ShortText::new(LEVEL_SUFFIX)),
        ));
    };
    // One pass over the body finds every anchor (`[` digit `]`; three bytes cannot overlap
    // another match), then the anchors are judged in order, so the first problem reported is
    // the same as searching for `[0]`, then `[1]`, ... one at a time.
    let mut pos = [0usize; 6];
    let mut seen = [0u32; 6];
    let bytes = body.as_bytes();
    let mut from = 0usize;
    while let Some(p) = json::find_byte(bytes, from, b'[') {
        from = p + 1;
        if let Some(&[d @ b'0'..=b'5', b']']) = bytes.get(p + 1..p + 3) {
            let k = usize::from(d - b'0');
            if let (Some(n), Some(slot)) = (seen.get_mut(k), pos.get_mut(k)) {
                if *n == 0 {
                    *slot = p;
                }
                *n += 1;
            }
            from = p + 3;
        }
    }
    for (k, a) in ANCHORS.iter().enumerate() {
        match seen.get(k).copied().unwrap_or(0) {
            0 => return Err((notes::ANCHOR_MISSING, Arg::Text(ShortText::new(a)))),
            1 => {}
            _ => {
                return Err((notes::ANCHOR_TWICE, Arg::Text(ShortText::new(a))));
            }
        }
    }
    for k in 0..6 {
        let start = pos.get(k).copied().unwrap_or(0) + 3;
        let end = if k == 5 {
            body.len()
        } else {
            pos.get(k + 1).copied().unwrap_or(0)
        };
        let anchor = ANCHORS.get(k).copied().unwrap_or("");
        if end < start {
            return Err((
                notes::ANCHORS_OUT_OF_ORDER,
                Arg::Text(ShortText::new(ANCHORS.get(k + 1).copied().unwrap_or(""))),
            ));
        }
        if body.get(start..end).is_none_or(is_blank) {
            return Err((
                notes::ANCHOR_WITHOUT_TEXT,
                Arg::Text(ShortText::new(anchor)),
            ));
        }
    }
    Ok(())
}

/// The forbidden meta words of SPEC §3 (matched whole-word, case-insensitively, with any
/// whitespace between the words of a phrase).
pub const META_WORDS: [&str; 7] = [
    "gold",
    "reference",
    "ideal",
    "ground truth",
    "target response",
    "target answer",
    "target reply",
];

/// The first meta word found in `text`, if any.
pub fn find_meta_word(text: &str) -> Option<&'static str> {
    let b = text.as_bytes();
    let is_word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for start in 0..b.len() {
        if start > 0 && b.get(start - 1).is_some_and(|&c| is_word(c)) {
            continue;
        }
        for w in META_WORDS {
            if let Some(end) = match_phrase(b, start, w.as_bytes())
                && !b.get(end).is_some_and(|&c| is_word(c))
            {
                return Some(w);
            }
        }
    }
    None
}

/// Matches `phrase` at `b[start..]` ASCII-case-insensitively, a space in the phrase matching a
/// run of whitespace; returns the end offset.
fn match_phrase(b: &[u8], start: usize, phrase: &[u8]) -> Option<usize> {
    let mut i = start;
    for &p in phrase {
        if p == b' ' {
            let j = json::skip_ws(b, i);
            if j == i {
                return None;
            }
            i = j;
        } else {
            if !b.get(i)?.eq_ignore_ascii_case(&p) {
                return None;
            }
            i += 1;
        }
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::is_blank;

    /// `is_blank` is `str::trim().is_empty()`: over every string of up to three characters
    /// drawn from ASCII whitespace, the ASCII controls that are not whitespace, Unicode spaces
    /// and ordinary characters (ASCII and not).
    #[test]
    fn is_blank_is_trim_is_empty() {
        let chars = [
            ' ', '\t', '\n', '\u{b}', '\u{c}', '\r', '\u{1c}', '\u{1f}', '\0', '\u{85}', '\u{a0}',
            '\u{2003}', '\u{3000}', 'a', '.', 'é', '語',
        ];
        let mut s = String::new();
        for a in chars {
            for b in chars {
                for c in chars {
                    for n in 0..=3 {
                        s.clear();
                        s.extend([a, b, c].iter().take(n));
                        assert_eq!(is_blank(&s), s.trim().is_empty(), "{s:?}");
                    }
                }
            }
        }
    }
}
