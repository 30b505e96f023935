//! The vocabularies `care analyze` reads labels with: the strategy label sets (`--labels`) and
//! the emotion-to-valence map (`--valence`).

use care_core::Dimension;
use care_core::strategy::LABELS;

use super::record::{Emotions, LABEL_IDS};

/// One strategy label of a set: its canonical spelling, its dimension (paper Table 10; `None`
/// for a label the table does not map) and the other spellings read as it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelDef {
    /// Canonical spelling (the report shows it).
    pub name: &'static str,
    /// Its empathy dimension, if the paper maps it to one.
    pub dimension: Option<Dimension>,
    /// Other accepted spellings.
    pub aliases: Vec<&'static str>,
}

/// The names `--labels` accepts, in help order.
pub const LABEL_SET_NAMES: [&str; 4] = ["care", "esconv", "mint", "appendix-e"];

/// A set of strategy labels: what a line's `tactics` may name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSet {
    /// Its name (one of [`LABEL_SET_NAMES`]).
    pub name: &'static str,
    /// The labels, in report order; a label's index is its id in a record.
    pub labels: Vec<LabelDef>,
}

impl Default for LabelSet {
    fn default() -> Self {
        LabelSet::care()
    }
}

use Dimension::{Affective as A, Cognitive as C, Proactive as P};

fn def(name: &'static str, dimension: Option<Dimension>, aliases: &[&'static str]) -> LabelDef {
    LabelDef {
        name,
        dimension,
        aliases: aliases.to_vec(),
    }
}

impl LabelSet {
    /// The set `name` (see [`LABEL_SET_NAMES`]).
    pub fn named(name: &str) -> Result<LabelSet, String> {
        match name {
            "care" => Ok(LabelSet::care()),
            "esconv" => Ok(LabelSet::esconv()),
            "mint" => Ok(LabelSet::mint()),
            "appendix-e" => Ok(LabelSet::appendix_e()),
            other => Err(format!(
                "--labels: unknown label set {other:?}; use one of {}",
                LABEL_SET_NAMES.join(", ")
            )),
        }
    }

    /// `care`: ESConv and MINT together, exactly as `care-core` reads them for `r_align`
    /// (SPEC §5: MINT `information` and ESConv `Information` are one label, `Other` is ESConv's
    /// `Others`).
    pub fn care() -> LabelSet {
        let mut labels: Vec<(u8, LabelDef)> = Vec::new();
        for l in &LABELS {
            match labels.iter_mut().find(|(id, _)| *id == l.id) {
                Some((_, d)) => d.aliases.push(l.name),
                None => labels.push((l.id, def(l.name, Some(l.dimension), &[]))),
            }
        }
        LabelSet {
            name: "care",
            labels: labels.into_iter().map(|(_, d)| d).collect(),
        }
    }

    /// `esconv`: the eight ESConv support strategies (paper Table 10), `Questions` and `Other`
    /// accepted for `Question` and `Others`.
    pub fn esconv() -> LabelSet {
        LabelSet {
            name: "esconv",
            labels: vec![
                def("Question", Some(C), &["Questions"]),
                def("Restatement or Paraphrasing", Some(C), &[]),
                def("Others", Some(C), &["Other"]),
                def("Reflection of feelings", Some(A), &[]),
                def("Affirmation and Reassurance", Some(A), &[]),
                def("Self-disclosure", Some(A), &[]),
                def("Providing Suggestions", Some(P), &[]),
                def("Information", Some(P), &[]),
            ],
        }
    }

    /// `mint`: the fifteen MINT tactics of paper Table 10; a space may stand for an underscore.
    pub fn mint() -> LabelSet {
        LabelSet {
            name: "mint",
            labels: vec![
                def("questioning", Some(C), &[]),
                def("paraphrasing", Some(C), &[]),
                def("contextualizing", Some(C), &[]),
                def("reappraisal", Some(C), &[]),
                def("validation", Some(A), &[]),
                def("emotional_expression", Some(A), &["emotional expression"]),
                def("terms_of_endearment", Some(A), &["terms of endearment"]),
                def("self_disclosure", Some(A), &["self disclosure"]),
                def("solidarity", Some(A), &[]),
                def("gratitude", Some(A), &[]),
                def("spirituality", Some(A), &[]),
                def("advice", Some(P), &[]),
                def("information", Some(P), &[]),
                def("empowerment", Some(P), &[]),
                def("assistance", Some(P), &[]),
            ],
        }
    }

    /// `appendix-e`: the ten strategies of the MINT annotator as the paper names them in §5
    /// (Figure 5) and Appendix E (Figure 10): `appraisal` (Appendix E's word for §5's
    /// `reappraisal`, which is accepted for it) and `other` ("other supportive behaviors", not
    /// ESConv's `Others`, and mapped to no dimension), with the dimensions of Table 10.
    pub fn appendix_e() -> LabelSet {
        LabelSet {
            name: "appendix-e",
            labels: vec![
                def("questioning", Some(C), &[]),
                def("paraphrasing", Some(C), &[]),
                def("appraisal", Some(C), &["reappraisal"]),
                def("validation", Some(A), &[]),
                def("emotional_expression", Some(A), &["emotional expression"]),
                def("advice", Some(P), &[]),
                def("information", Some(P), &[]),
                def("empowerment", Some(P), &[]),
                def("assistance", Some(P), &[]),
                def("other", None, &[]),
            ],
        }
    }

    /// The id of `label`: trimmed, ASCII-case-insensitive, `[Label]` accepted, aliases included.
    pub fn lookup(&self, label: &str) -> Option<u8> {
        let mut s = label.trim();
        if let Some(inner) = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
            s = inner.trim();
        }
        self.labels
            .iter()
            .position(|d| {
                d.name.eq_ignore_ascii_case(s)
                    || d.aliases.iter().any(|a| a.eq_ignore_ascii_case(s))
            })
            .and_then(|i| u8::try_from(i).ok())
            .filter(|&i| usize::from(i) < LABEL_IDS)
    }

    /// The label with id `id`.
    pub fn get(&self, id: u8) -> Option<&LabelDef> {
        self.labels.get(usize::from(id))
    }
}

/// Most distinct valence names.
pub const MAX_VALENCES: usize = 8;

/// The emotion-to-valence map: each emotion of the vocabulary has at most one valence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Valence {
    /// Valence names in report order.
    pub names: Vec<String>,
    /// Per emotion index, its valence index (`None`: not mapped, not in the valence views).
    pub of_emotion: Vec<Option<usize>>,
}

/// The default map: Ekman's six emotions by the valence the paper reads Figure 4 with.
pub const DEFAULT_VALENCE: &str =
    "joy=positive,surprise=neutral,fear=negative,sadness=negative,disgust=negative,anger=negative";

/// The order in which the usual valence names are shown, whatever order the map gives them.
const VALENCE_ORDER: [&str; 3] = ["positive", "neutral", "negative"];

impl Valence {
    /// The default map, then `overrides` (`emotion=valence,...`, each replacing its emotion's
    /// entry), for the emotion vocabulary `emotions`. Default entries of emotions the
    /// vocabulary lacks are dropped; an override naming one is an error.
    pub fn new(emotions: &Emotions, overrides: &str) -> Result<Valence, String> {
        let mut map: Vec<Option<String>> = vec![None; emotions.names().len()];
        for (list, strict) in [(DEFAULT_VALENCE, false), (overrides, true)] {
            if list.trim().is_empty() {
                continue;
            }
            for item in list.split(',') {
                let Some((e, v)) = item.split_once('=') else {
                    return Err(format!(
                        "--valence: {item:?} is not emotion=valence (for example joy=positive)"
                    ));
                };
                let (e, v) = (e.trim(), v.trim());
                if v.is_empty() || v.chars().count() > 32 {
                    return Err(format!(
                        "--valence: the valence of {e:?} must be 1 to 32 characters"
                    ));
                }
                match emotions.lookup(e) {
                    Some(i) => map[i] = Some(v.to_ascii_lowercase()),
                    None if strict => {
                        return Err(format!(
                            "--valence: {e:?} is not an emotion of the vocabulary ({})",
                            emotions.names().join(", ")
                        ));
                    }
                    None => {}
                }
            }
        }
        let mut names: Vec<String> = Vec::new();
        for known in VALENCE_ORDER {
            if map.iter().flatten().any(|v| v == known) {
                names.push(known.to_owned());
            }
        }
        for v in map.iter().flatten() {
            if !names.contains(v) {
                names.push(v.clone());
            }
        }
        if names.len() > MAX_VALENCES {
            return Err(format!(
                "--valence: {} valences, at most {MAX_VALENCES}",
                names.len()
            ));
        }
        let of_emotion = map
            .iter()
            .map(|v| v.as_ref().and_then(|v| names.iter().position(|n| n == v)))
            .collect();
        Ok(Valence { names, of_emotion })
    }

    /// The valence index of emotion `e`.
    pub fn of(&self, e: usize) -> Option<usize> {
        self.of_emotion.get(e).copied().flatten()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn label_sets() {
        let care = LabelSet::care();
        assert_eq!(care.lookup("information"), care.lookup("Information"));
        assert_eq!(care.lookup("Other"), care.lookup("Others"));
        assert_eq!(care.lookup("appraisal"), None);
        let e = LabelSet::appendix_e();
        assert_eq!(e.labels.len(), 10);
        let appraisal = e.lookup("appraisal").unwrap();
        assert_eq!(e.lookup(" Reappraisal "), Some(appraisal));
        let other = e.lookup("other").unwrap();
        assert_eq!(e.get(other).unwrap().dimension, None);
        assert_eq!(
            e.lookup("Others"),
            None,
            "Appendix E's other is not ESConv's Others"
        );
        assert_eq!(
            e.lookup("emotional expression"),
            e.lookup("emotional_expression")
        );
        let es = LabelSet::esconv();
        assert_eq!(es.lookup("[Questions]"), Some(0));
        assert_eq!(es.lookup("questioning"), None);
        let mint = LabelSet::mint();
        assert_eq!(mint.labels.len(), 15);
        assert_eq!(mint.lookup("Question"), None);
        for name in LABEL_SET_NAMES {
            let s = LabelSet::named(name).unwrap();
            assert!(s.labels.len() <= LABEL_IDS, "{name}");
            assert_eq!(s.name, name);
        }
        assert!(LabelSet::named("MINT").is_err());
    }

    #[test]
    fn valence_map() {
        let e = Emotions::default();
        let v = Valence::new(&e, "").unwrap();
        assert_eq!(v.names, ["positive", "neutral", "negative"]);
        assert_eq!(v.of(e.lookup("joy").unwrap()), Some(0));
        assert_eq!(v.of(e.lookup("surprise").unwrap()), Some(1));
        assert_eq!(v.of(e.lookup("anger").unwrap()), Some(2));
        let o = Valence::new(&e, "surprise=positive, fear = Alarm").unwrap();
        assert_eq!(o.names, ["positive", "negative", "alarm"]);
        assert_eq!(o.of(e.lookup("surprise").unwrap()), Some(0));
        assert_eq!(o.of(e.lookup("fear").unwrap()), Some(2));
        assert!(Valence::new(&e, "boredom=negative").is_err());
        assert!(Valence::new(&e, "joy").is_err());
        let custom = Emotions::parse_list("calm,tense").unwrap();
        let c = Valence::new(&custom, "").unwrap();
        assert!(
            c.names.is_empty() && c.of(0).is_none(),
            "no default entry applies"
        );
    }
}
