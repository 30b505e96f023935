//! The `emotion` section of a profile: its span and label table.

use super::super::{
    EmotionLayout, MAX_EMOTION_LABELS, MAX_EMOTION_SYNONYMS, MAX_NAME_BYTES, StrRef,
    normalize_label,
};
use super::{Parser, ProfileCode, ProfilePath, idx, is_blank};
use crate::format::{Arg, ShortText};
use crate::json::{JStr, Kind, PlainCursor};

impl<'a> Parser<'a> {
    pub(super) fn emotion(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("emotion");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"emotion\" must be an object, found");
            return;
        }
        let mut m = [None; 3];
        self.members(c, path, &["span", "weight", "labels"], &mut m);
        let [span, weight, labels] = m;
        let mut e = EmotionLayout::default();
        let mut ok = true;
        match span {
            Some(mut c) => {
                let at = c.pos;
                match self.string(&mut c, path, "\"span\" must be a string, found") {
                    Some(r) => {
                        let s = self.get(r);
                        let found = self.span_names.iter().position(|n| self.get(*n) == s);
                        match found {
                            Some(k) => e.span = idx(k),
                            None => {
                                ok = false;
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "\"span\" names no output span:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                        }
                    }
                    None => ok = false,
                }
            }
            None => {
                ok = false;
                self.missing(path, "span");
            }
        }
        match weight {
            Some(mut c) => match self.number(&mut c, path, "\"weight\" must be a number, found") {
                Some(w) if (0.0..=1.0).contains(&w) => e.weight = w,
                Some(w) => {
                    ok = false;
                    self.push(
                        ProfileCode::WeightRange,
                        path,
                        None,
                        "emotion weight outside [0, 1]:",
                        Arg::Number(w),
                    );
                }
                None => ok = false,
            },
            None => {
                ok = false;
                self.missing(path, "weight");
            }
        }
        match labels {
            Some(mut c) => {
                if c.kind() == Kind::Object {
                    ok &= self.labels(&mut c, &mut e);
                } else {
                    ok = false;
                    self.wrong_type(&mut c, path, "\"labels\" must be an object, found");
                }
            }
            None => {
                ok = false;
                self.missing(path, "labels");
            }
        }
        if ok {
            self.layout.emotion = Some(e);
        }
    }

    /// Checks one label or synonym; `Some` when it is valid and new.
    fn label(&mut self, s: &JStr<'a>, path: ProfilePath, e: &EmotionLayout) -> Option<StrRef> {
        let r = self.store(s, path)?;
        let t = self.get(r);
        let arg = Arg::Text(ShortText::new(t));
        if is_blank(t) {
            self.push(
                ProfileCode::EmptyText,
                path,
                Some(s.offset),
                "blank label",
                Arg::None,
            );
            return None;
        }
        if t.len() > MAX_NAME_BYTES {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(s.offset),
                "label longer than 64 bytes:",
                arg,
            );
            return None;
        }
        if normalize_label(t) != t || t.bytes().any(|b| b.is_ascii_uppercase()) {
            self.push(
                ProfileCode::LabelFormat,
                path,
                Some(s.offset),
                "label not in normalized form:",
                arg,
            );
            return None;
        }
        let seen = e
            .labels
            .iter()
            .map(|l| l.0)
            .chain(e.synonyms.iter().copied())
            .any(|x| self.get(x).eq_ignore_ascii_case(t));
        if seen {
            self.push(
                ProfileCode::DuplicateName,
                path,
                Some(s.offset),
                "label given before:",
                arg,
            );
            return None;
        }
        Some(r)
    }

    fn labels(&mut self, c: &mut PlainCursor<'a>, e: &mut EmotionLayout) -> bool {
        let mut ok = true;
        let mut i = 0usize;
        c.enter(b'{');
        while let Some(k) = c.next_key() {
            let path = ProfilePath::Label(idx(i));
            i += 1;
            let canonical = self.label(&k, path, e);
            ok &= canonical.is_some();
            if c.kind() != Kind::Array {
                ok = false;
                self.wrong_type(c, path, "synonyms must be an array of strings, found");
                c.skip_value();
                continue;
            }
            let first = e.synonyms.len();
            let mut list = *c;
            c.skip_value();
            list.enter(b'[');
            while list.next_item() {
                let Some(s) = list.string() else {
                    ok = false;
                    self.wrong_type(&mut list, path, "a synonym must be a string, found");
                    list.skip_value();
                    continue;
                };
                match self.label(&s, path, e) {
                    Some(r) => {
                        if e.synonyms.push(r).is_err() {
                            ok = false;
                            self.push(
                                ProfileCode::Capacity,
                                path,
                                Some(s.offset),
                                "more synonyms than a profile holds:",
                                Arg::Count(MAX_EMOTION_SYNONYMS as u32),
                            );
                        }
                    }
                    None => ok = false,
                }
            }
            let count = u8::try_from(e.synonyms.len() - first).unwrap_or(u8::MAX);
            if let Some(r) = canonical
                && e.labels.push((r, idx(first), count)).is_err()
            {
                ok = false;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    Some(k.offset),
                    "more labels than a profile holds:",
                    Arg::Count(MAX_EMOTION_LABELS as u32),
                );
            }
        }
        ok
    }
}
