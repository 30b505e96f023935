//! The `output` section of a profile: its spans and their tags.

use super::super::{MAX_NAME_BYTES, MAX_SPANS, SpansLayout, StrRef};
use super::{Parser, ProfileCode, ProfilePath, idx, names_equal};
use crate::format::{Arg, ShortText};
use crate::json::{Kind, PlainCursor};

impl<'a> Parser<'a> {
    pub(super) fn output(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("output");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"output\" must be an object, found");
            return;
        }
        let mut m = [None; 5];
        self.members(
            c,
            path,
            &["format", "spans", "open", "close", "judge"],
            &mut m,
        );
        let [format, spans, open, close, judge] = m;
        let Some(mut fc) = format else {
            self.missing(path, "format");
            return;
        };
        let at = fc.pos;
        let Some(f) = fc.string() else {
            self.wrong_type(&mut fc, path, "\"format\" must be a string, found");
            return;
        };
        if f.eq_str("none") {
            if spans.is_some() || open.is_some() || close.is_some() || judge.is_some() {
                self.push(
                    ProfileCode::Schema,
                    path,
                    None,
                    "format \"none\" takes no \"spans\", \"open\", \"close\" or \"judge\"",
                    Arg::None,
                );
            }
            return;
        }
        if !f.eq_str("spans") {
            self.push(
                ProfileCode::Schema,
                path,
                Some(at),
                "\"format\" must be \"none\" or \"spans\", found",
                Arg::Text(ShortText::from_chars(f.chars())),
            );
            return;
        }
        let mut layout = SpansLayout::default();
        let mut ok = true;
        match spans {
            Some(mut c) => {
                if c.kind() == Kind::Array {
                    ok &= self.span_names(&mut c, &mut layout);
                } else {
                    ok = false;
                    self.wrong_type(&mut c, path, "\"spans\" must be an array, found");
                }
            }
            None => {
                ok = false;
                self.missing(path, "spans");
            }
        }
        let template = |p: &mut Self, c: Option<PlainCursor<'a>>, key: &'static str| {
            let Some(mut c) = c else {
                p.missing(path, key);
                return None;
            };
            let at = c.pos;
            let note = if key == "open" {
                "\"open\" must be a string, found"
            } else {
                "\"close\" must be a string, found"
            };
            let r = p.string(&mut c, path, note)?;
            let s = p.get(r);
            let Some(i) = s.find("{name}") else {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template without {name}:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            };
            let (before, after) = (i, s.len() - i - "{name}".len());
            if s.get(i + 6..).is_some_and(|t| t.contains("{name}")) {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template with {name} more than once:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            if before == 0 {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template with no text before {name}:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            if before > MAX_NAME_BYTES || after > MAX_NAME_BYTES {
                p.push(
                    ProfileCode::Capacity,
                    path,
                    Some(at),
                    "template part longer than 64 bytes:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            Some((
                StrRef::new(r.start as usize, before, r.decoded)?,
                StrRef::new(r.start as usize + i + 6, after, r.decoded)?,
            ))
        };
        let o = template(self, open, "open");
        let cl = template(self, close, "close");
        let templates_ok = match (o, cl) {
            (Some(o), Some(cl)) => {
                layout.open = o;
                layout.close = cl;
                true
            }
            _ => {
                ok = false;
                false
            }
        };
        match judge {
            Some(mut c) => {
                let at = c.pos;
                if let Some(r) = self.string(&mut c, path, "\"judge\" must be a string, found") {
                    let s = self.get(r);
                    match layout.names.iter().position(|n| self.get(*n) == s) {
                        Some(k) => layout.judge = idx(k),
                        None => {
                            ok = false;
                            if !layout.names.is_empty() {
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "\"judge\" names no span:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                        }
                    }
                } else {
                    ok = false;
                }
            }
            None => {
                ok = false;
                self.missing(path, "judge");
            }
        }
        // Checked whenever both templates and some span names are usable, whatever else is
        // wrong: every violation of every class is reported in one pass.
        if templates_ok && !layout.names.is_empty() && self.tags_ambiguous(&layout) {
            ok = false;
        }
        // The valid span names stay known to `emotion` even when the output section is
        // rejected, so a fault here is not reported again there as an unknown span.
        self.span_names = layout.names.clone();
        if ok {
            self.layout.spans = Some(layout);
        }
    }

    /// Reads the span names; `false` when any is invalid.
    fn span_names(&mut self, c: &mut PlainCursor<'a>, layout: &mut SpansLayout) -> bool {
        let mut ok = true;
        let mut k = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Span(idx(k));
            k += 1;
            let at = c.pos;
            let Some(r) = self.name(c, path, "a span name must be a string, found") else {
                ok = false;
                continue;
            };
            let s = self.get(r);
            if !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                ok = false;
                self.push(
                    ProfileCode::NameFormat,
                    path,
                    Some(at),
                    "span name with other characters than ASCII letters, digits, '_' and '-':",
                    Arg::Text(ShortText::new(s)),
                );
                continue;
            }
            if layout.names.iter().any(|n| names_equal(self.get(*n), s)) {
                ok = false;
                self.push(
                    ProfileCode::DuplicateName,
                    path,
                    Some(at),
                    "span name given before:",
                    Arg::Text(ShortText::new(s)),
                );
                continue;
            }
            if layout.names.push(r).is_err() {
                ok = false;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    Some(at),
                    "more spans than a profile holds:",
                    Arg::Count(MAX_SPANS as u32),
                );
                break;
            }
        }
        if k == 0 {
            ok = false;
            self.push(
                ProfileCode::Schema,
                ProfilePath::Member("output"),
                None,
                "\"spans\" must hold at least one span name",
                Arg::None,
            );
        }
        ok
    }

    /// Reports (and returns `true`) when one tag equals or contains another, which would make
    /// the output check ambiguous.
    fn tags_ambiguous(&mut self, layout: &SpansLayout) -> bool {
        const TAG_BYTES: usize = 3 * MAX_NAME_BYTES;
        let mut tags: heapless::Vec<([u8; TAG_BYTES], usize), { 2 * MAX_SPANS }> =
            heapless::Vec::new();
        for &n in &layout.names {
            for (a, b) in [layout.open, layout.close] {
                let mut buf = [0u8; TAG_BYTES];
                let mut len = 0usize;
                for part in [self.get(a), self.get(n), self.get(b)] {
                    for &byte in part.as_bytes() {
                        if let Some(slot) = buf.get_mut(len) {
                            *slot = byte;
                        }
                        len += 1;
                    }
                }
                let _ = tags.push((buf, len.min(TAG_BYTES)));
            }
        }
        for (i, (a, la)) in tags.iter().enumerate() {
            for (j, (b, lb)) in tags.iter().enumerate() {
                let (a, b) = (a.get(..*la).unwrap_or(&[]), b.get(..*lb).unwrap_or(&[]));
                if i != j && (a.len() <= b.len()) && b.windows(a.len().max(1)).any(|w| w == a) {
                    let t = core::str::from_utf8(a).unwrap_or("");
                    self.push(
                        ProfileCode::Template,
                        ProfilePath::Member("output"),
                        None,
                        "a tag appears inside another tag:",
                        Arg::Text(ShortText::new(t)),
                    );
                    return true;
                }
            }
        }
        false
    }
}
