//! The fixed notes of violations: what is wrong, as static text. Every note a violation can
//! carry is one of these (the validator, the level check and the JSON scanner can only produce
//! a [`Note`] from this table), so that a deserialized violation gets its `&'static str` back.

/// One note of the table below (only this module makes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note(&'static str);

impl Note {
    /// The text.
    pub(crate) const fn as_str(self) -> &'static str {
        self.0
    }
}

macro_rules! notes {
    ($($name:ident = $text:literal;)+) => {
        $(pub(crate) const $name: Note = Note($text);)+
        /// Every note, in table order.
        #[cfg_attr(not(feature = "serde"), allow(dead_code))]
        pub(crate) const ALL: &[&str] = &[$($text),+];
    };
}

notes! {
    NOT_UTF8 = "the text is not valid UTF-8";
    EMPTY_TEXT = "the text is empty";
    TEXT_BEFORE = "text before the JSON value";
    TEXT_AFTER = "text after the JSON value";
    RUBRIC_NOT_OBJECT = "the rubric must be a JSON object, found";
    DUPLICATE_KEY = "duplicate key";
    UNKNOWN_KEY = "unknown key";
    ENVELOPE_RUBRIC_NOT_OBJECT = "\"rubric\" must be an object";
    UNKNOWN_KEY_IN_RUBRIC = "unknown key in \"rubric\"";
    MISSING_KEY = "missing key";
    CATEGORIES_NOT_ARRAY = "\"categories\" must be an array";
    STRING_TOO_LONG = "string too long for the scratch buffer";
    CATEGORY_NOT_OBJECT = "a category must be an object, found";
    CATEGORY_TWICE = "category given more than once:";
    CATEGORY_OUT_OF_ORDER = "category out of order, it must come before";
    CATEGORY_MISSING = "category missing";
    WEIGHTS_SUM_TO = "category weights sum to";
    DUPLICATE_TITLE = "duplicate title";
    UNKNOWN_CATEGORY = "unknown category";
    CATEGORY_NOT_STRING = "\"category\" must be a string, found";
    BLANK_RATIONALE = "blank weight_rationale";
    RATIONALE_NOT_STRING = "\"weight_rationale\" must be a string, found";
    WEIGHT_OUT_OF_RANGE = "category_weight outside [0, 1]:";
    WEIGHT_NOT_NUMBER = "\"category_weight\" must be a number, found";
    CRITERIA_NOT_ARRAY = "\"criteria\" must be an array, found";
    CATEGORY_KEY_ORDER = "keys must be in the order category, weight_rationale, category_weight, criteria";
    CRITERION_NOT_OBJECT = "a criterion must be an object, found";
    TOO_MANY_CRITERIA = "more criteria than this library stores per category:";
    CRITERIA_COUNT = "wrong number of criteria:";
    TITLE_NOT_STRING = "\"title\" must be a string, found";
    DESCRIPTION_NOT_STRING = "\"description\" must be a string, found";
    BLANK_TITLE = "blank title";
    BLANK_DESCRIPTION = "blank description";
    CRITERION_KEY_ORDER = "keys must be in the order title, description";
    META_WORD = "forbidden meta word";
    LEVEL_SUFFIX_MISSING = "description must end with";
    ANCHOR_MISSING = "missing anchor";
    ANCHOR_TWICE = "anchor appears more than once:";
    ANCHORS_OUT_OF_ORDER = "anchors out of order at";
    ANCHOR_WITHOUT_TEXT = "no text after anchor";
    UNTERMINATED_STRING = "unterminated string";
    TRUNCATED_U_ESCAPE = "truncated \\u escape";
    INVALID_U_ESCAPE = "invalid \\u escape";
    LONE_LOW_SURROGATE = "lone low surrogate in \\u escape";
    LONE_HIGH_SURROGATE = "lone high surrogate in \\u escape (no low surrogate follows)";
    INVALID_ESCAPE = "invalid escape";
    CONTROL_CHARACTER = "control character in string";
    INVALID_NUMBER = "invalid number";
    FRACTION_DIGITS = "invalid number: digits expected after '.'";
    EXPONENT_DIGITS = "invalid number: exponent digits expected";
    UNEXPECTED_END = "unexpected end of input";
    TOO_DEEP = "nesting deeper than 64 levels";
    INVALID_LITERAL = "invalid literal";
    EXPECTED_VALUE = "expected a JSON value";
    EXPECTED_COLON = "expected ':' after an object key";
    EXPECTED_KEY = "expected a string key";
    EXPECTED_COMMA = "expected ',' or a closing bracket";
}

/// The note with text `s`, as the table's `&'static str`.
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) fn lookup(s: &str) -> Option<&'static str> {
    ALL.iter().copied().find(|n| *n == s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn notes_are_unique_one_line_texts() {
        for (i, n) in super::ALL.iter().enumerate() {
            assert!(!n.is_empty() && !n.contains('\n'), "{n:?}");
            assert!(!super::ALL[..i].contains(n), "{n:?} twice");
            assert_eq!(super::lookup(n), Some(*n));
        }
        assert_eq!(super::lookup("no such note"), None);
    }
}
