//! The rubric part of a profile: `rubric`, `scores`, `dimensions` with their criteria, and
//! `vetoes`.

use super::super::{
    CritLayout, DimLayout, MAX_DIMENSIONS, MAX_PROFILE_CRITERIA, MAX_VETOES, RubricSource, Veto,
};
use super::{
    MAX_CRITERION_WEIGHT, PROFILE_WEIGHT_TOLERANCE, Parser, ProfileCode, ProfilePath, idx,
    is_blank, names_equal,
};
use crate::format::{Arg, ShortText};
use crate::json::{Kind, PlainCursor};
use crate::rubric::Dimension;

impl<'a> Parser<'a> {
    pub(super) fn rubric(&mut self, c: &mut PlainCursor<'a>) {
        let at = c.pos;
        let Some(s) = c.string() else {
            self.wrong_type(c, ProfilePath::Root, "\"rubric\" must be a string, found");
            return;
        };
        if s.eq_str("fixed") {
            self.layout.rubric = RubricSource::Fixed;
        } else if s.eq_str("generated") {
            self.layout.rubric = RubricSource::Generated;
        } else {
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                Some(at),
                "\"rubric\" must be \"fixed\" or \"generated\", found",
                Arg::Text(ShortText::from_chars(s.chars())),
            );
        }
    }

    pub(super) fn scores(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("scores");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"scores\" must be an object, found");
            return;
        }
        let mut m = [None; 2];
        self.members(c, path, &["min", "max"], &mut m);
        let [min, max] = m;
        let min = match min {
            Some(mut c) => self.small_int(&mut c, path, "\"min\" must be a number, found"),
            None => {
                self.missing(path, "min");
                None
            }
        };
        let max = match max {
            Some(mut c) => self.small_int(&mut c, path, "\"max\" must be a number, found"),
            None => {
                self.missing(path, "max");
                None
            }
        };
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo >= hi {
                self.push(
                    ProfileCode::ScoreRange,
                    path,
                    None,
                    "min must be below max; max is",
                    Arg::Count(u32::from(hi)),
                );
            } else {
                self.layout.min = lo;
                self.layout.max = hi;
            }
        }
    }

    pub(super) fn dimensions(&mut self, c: &mut PlainCursor<'a>) {
        if c.kind() != Kind::Array {
            self.wrong_type(
                c,
                ProfilePath::Root,
                "\"dimensions\" must be an array, found",
            );
            return;
        }
        let generated = self.layout.rubric == RubricSource::Generated;
        // Every weight is a number (in range or not): their sum is then checked too.
        let mut weights_ok = true;
        let mut weight_sum = 0.0f64;
        let mut n = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Dimension(idx(n));
            n += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a dimension must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 3];
            self.members(&mut item, path, &["name", "weight", "criteria"], &mut m);
            let [name, weight, criteria] = m;
            let name = match name {
                Some(mut c) => self.name(&mut c, path, "\"name\" must be a string, found"),
                None => {
                    self.missing(path, "name");
                    None
                }
            };
            if let Some(r) = name {
                let s = self.get(r);
                let dup = self
                    .layout
                    .dims
                    .iter()
                    .any(|d| names_equal(self.get(d.name), s));
                if dup {
                    self.push(
                        ProfileCode::DuplicateName,
                        path,
                        None,
                        "dimension name given before:",
                        Arg::Text(ShortText::new(s)),
                    );
                }
            }
            let mut dim = DimLayout {
                name: name.unwrap_or_default(),
                first: u8::try_from(self.layout.criteria.len()).unwrap_or(u8::MAX),
                ..DimLayout::default()
            };
            if generated {
                if weight.is_some() || criteria.is_some() {
                    self.push(
                        ProfileCode::Generated,
                        path,
                        None,
                        "a generated rubric's dimension has no \"weight\" or \"criteria\"",
                        Arg::None,
                    );
                }
            } else {
                match weight {
                    Some(mut c) => {
                        let w = self.number(&mut c, path, "\"weight\" must be a number, found");
                        if let Some(w) = w {
                            weight_sum += w;
                        }
                        match w {
                            Some(w) if (0.0..=1.0).contains(&w) => dim.weight = w,
                            Some(w) => {
                                self.push(
                                    ProfileCode::WeightRange,
                                    path,
                                    None,
                                    "weight outside [0, 1]:",
                                    Arg::Number(w),
                                );
                            }
                            None => weights_ok = false,
                        }
                    }
                    None => {
                        weights_ok = false;
                        self.missing(path, "weight");
                    }
                }
                match criteria {
                    Some(mut c) => {
                        if c.kind() == Kind::Array {
                            self.criteria(&mut c, n - 1, &mut dim);
                        } else {
                            self.wrong_type(&mut c, path, "\"criteria\" must be an array, found");
                        }
                    }
                    None => self.missing(path, "criteria"),
                }
            }
            if self.layout.dims.push(dim).is_err() {
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more dimensions than a profile holds:",
                    Arg::Count(MAX_DIMENSIONS as u32),
                );
                break;
            }
        }
        if n == 0 {
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                None,
                "\"dimensions\" must hold at least one dimension",
                Arg::None,
            );
            return;
        }
        if generated {
            let care = self.layout.dims.len() == 3
                && self
                    .layout
                    .dims
                    .iter()
                    .zip(Dimension::ALL)
                    .all(|(d, c)| self.get(d.name) == c.json_name());
            if !care {
                self.push(
                    ProfileCode::Generated,
                    ProfilePath::Root,
                    None,
                    "a generated rubric needs the three CARE dimensions in order",
                    Arg::None,
                );
            }
            if (self.layout.min, self.layout.max) != (0, 5) {
                self.push(
                    ProfileCode::Generated,
                    ProfilePath::Member("scores"),
                    None,
                    "a generated rubric is scored 0..5",
                    Arg::None,
                );
            }
        } else if weights_ok && self.layout.dims.len() == n {
            let sum = weight_sum;
            if sum.is_nan() || (sum - 1.0).abs() > PROFILE_WEIGHT_TOLERANCE {
                self.push(
                    ProfileCode::WeightSum,
                    ProfilePath::Root,
                    None,
                    "dimension weights sum to",
                    Arg::Number(sum),
                );
            }
        }
    }

    fn criteria(&mut self, c: &mut PlainCursor<'a>, d: usize, dim: &mut DimLayout) {
        let first = self.layout.criteria.len();
        let mut n = 0usize;
        let mut full = false;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Criterion(idx(d), idx(n));
            n += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a criterion must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 3];
            self.members(&mut item, path, &["title", "description", "weight"], &mut m);
            let [title, description, weight] = m;
            let mut crit = CritLayout {
                weight: 1.0,
                ..CritLayout::default()
            };
            match title {
                Some(mut c) => {
                    let at = c.pos;
                    if let Some(r) = self.string(&mut c, path, "\"title\" must be a string, found")
                    {
                        let s = self.get(r);
                        if is_blank(s) {
                            self.push(
                                ProfileCode::EmptyText,
                                path,
                                Some(at),
                                "blank title",
                                Arg::None,
                            );
                        } else if self
                            .layout
                            .criteria
                            .get(first..)
                            .unwrap_or(&[])
                            .iter()
                            .any(|x| names_equal(self.get(x.title), s))
                        {
                            self.push(
                                ProfileCode::DuplicateName,
                                path,
                                Some(at),
                                "criterion title given before in this dimension:",
                                Arg::Text(ShortText::new(s)),
                            );
                        }
                        crit.title = r;
                    }
                }
                None => self.missing(path, "title"),
            }
            match description {
                Some(mut c) => {
                    let at = c.pos;
                    if let Some(r) =
                        self.string(&mut c, path, "\"description\" must be a string, found")
                    {
                        if is_blank(self.get(r)) {
                            self.push(
                                ProfileCode::EmptyText,
                                path,
                                Some(at),
                                "blank description",
                                Arg::None,
                            );
                        }
                        crit.description = r;
                    }
                }
                None => self.missing(path, "description"),
            }
            if let Some(mut c) = weight
                && let Some(w) = self.number(&mut c, path, "\"weight\" must be a number, found")
            {
                if w == 0.0 || !w.is_finite() || w.abs() > MAX_CRITERION_WEIGHT {
                    self.push(
                        ProfileCode::CriterionWeight,
                        path,
                        None,
                        "criterion weight must be finite, non-zero and at most 1e6 in size:",
                        Arg::Number(w),
                    );
                }
                crit.weight = w;
            }
            if self.layout.criteria.push(crit).is_err() && !full {
                full = true;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more criteria than a profile holds:",
                    Arg::Count(MAX_PROFILE_CRITERIA as u32),
                );
            }
        }
        let stored = self.layout.criteria.get(first..).unwrap_or(&[]);
        dim.count = u8::try_from(stored.len()).unwrap_or(u8::MAX);
        let w0 = stored.first().map_or(0.0, |c| c.weight);
        dim.equal_weights = w0 > 0.0 && stored.iter().all(|c| c.weight == w0);
        let path = ProfilePath::Dimension(idx(d));
        if n == 0 {
            self.push(
                ProfileCode::CriteriaCount,
                path,
                None,
                "a dimension of a fixed rubric needs at least one criterion",
                Arg::None,
            );
        } else if !full && !stored.iter().any(|c| c.weight > 0.0) {
            self.push(
                ProfileCode::CriterionWeight,
                path,
                None,
                "no criterion has a positive weight",
                Arg::None,
            );
        }
    }

    pub(super) fn vetoes(&mut self, c: &mut PlainCursor<'a>) {
        if c.kind() != Kind::Array {
            self.wrong_type(c, ProfilePath::Root, "\"vetoes\" must be an array, found");
            return;
        }
        let mut i = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Veto(idx(i));
            i += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a veto must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 2];
            self.members(&mut item, path, &["dimension", "min_score"], &mut m);
            let [dimension, min_score] = m;
            let dim = match dimension {
                Some(mut c) => {
                    let at = c.pos;
                    self.string(&mut c, path, "\"dimension\" must be a string, found")
                        .and_then(|r| {
                            let s = self.get(r);
                            let found = self.layout.dims.iter().position(|d| self.get(d.name) == s);
                            if found.is_none() {
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "veto names no dimension:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                            found
                        })
                }
                None => {
                    self.missing(path, "dimension");
                    None
                }
            };
            let min = match min_score {
                Some(mut c) => {
                    let v = self.small_int(&mut c, path, "\"min_score\" must be a number, found");
                    match v {
                        Some(v) if (self.layout.min..=self.layout.max).contains(&v) => Some(v),
                        Some(v) => {
                            self.push(
                                ProfileCode::ScoreRange,
                                path,
                                None,
                                "min_score outside the score range:",
                                Arg::Count(u32::from(v)),
                            );
                            None
                        }
                        None => None,
                    }
                }
                None => {
                    self.missing(path, "min_score");
                    None
                }
            };
            let (Some(d), Some(min)) = (dim, min) else {
                continue;
            };
            let d = idx(d);
            if self.layout.vetoes.iter().any(|v| v.dimension == d) {
                self.push(
                    ProfileCode::DuplicateName,
                    path,
                    None,
                    "a second veto of one dimension",
                    Arg::None,
                );
                continue;
            }
            if self
                .layout
                .vetoes
                .push(Veto {
                    dimension: d,
                    min_score: min,
                })
                .is_err()
            {
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more vetoes than a profile holds:",
                    Arg::Count(MAX_VETOES as u32),
                );
                break;
            }
        }
    }
}
