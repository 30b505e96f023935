//! [`SyntaxIndex`]: what a caller's syntax pass learned, and the step over a top-level member
//! that it allows.

use super::STRING_INDEX_CAPACITY;
use crate::json::{self, Cursor};

/// What a caller's syntax pass learned about one JSON value in a text, for
/// [`validate_indexed_into`]: the value's extent, where its strings start and end, and the
/// extent of the containers that are its direct children. Offsets are bytes into the text
/// given to [`validate_indexed_into`].
///
/// Fill it while checking the text: [`SyntaxIndex::string`] for every string in text order
/// (keys included), [`SyntaxIndex::child`] for each container directly inside the value, and
/// [`SyntaxIndex::value`] last. What is not recorded costs the validator a scan of those bytes,
/// never a different result: strings past the first 128, a string that starts before the
/// previous one ended (out of order), containers past the first 8 and offsets past
/// `u32::MAX` are dropped.
///
/// [`validate_indexed_into`]: super::validate_indexed_into
#[derive(Clone, Debug)]
pub struct SyntaxIndex {
    pub(super) value: Option<(usize, usize)>,
    pub(super) strings: json::StringIndex<STRING_INDEX_CAPACITY>,
}

impl Default for SyntaxIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl SyntaxIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        SyntaxIndex {
            value: None,
            strings: json::StringIndex::new(),
        }
    }

    /// Forgets everything recorded, for the next text.
    pub fn clear(&mut self) {
        self.value = None;
        self.strings.clear();
    }

    /// Records a string: `start` at its opening quote, `end` just after its closing quote, and
    /// whether it holds an escape.
    #[inline]
    pub fn string(&mut self, start: usize, end: usize, escaped: bool) {
        let in_order = self.strings.spans().is_empty() || start >= self.strings.last_end();
        if in_order && start < end {
            self.strings.record(start, end, escaped);
        }
    }

    /// Records a container that is a direct child of the value: `start` at its opening bracket,
    /// `end` just after its closing one.
    #[inline]
    pub fn child(&mut self, start: usize, end: usize) {
        if start < end {
            self.strings.record_child(start, end);
        }
    }

    /// Records the checked value: `start` at its first byte, `end` just after its last.
    pub fn value(&mut self, start: usize, end: usize) {
        self.value = (start < end).then_some((start, end));
    }

    /// Whether this index says only what the validator's own syntax pass says about `text`: the
    /// value at the recorded start is one JSON value that ends at the recorded end, and every
    /// recorded string and child is one that pass records, at the same place. It costs that
    /// pass; for tests and debug checks of a caller's syntax pass.
    #[must_use]
    pub fn matches(&self, text: &str) -> bool {
        let Some((start, end)) = self.value else {
            return false;
        };
        let mut own = json::StringIndex::<STRING_INDEX_CAPACITY>::new();
        json::scan_value_indexed(text.as_bytes(), start, &mut own) == Ok(end)
            && self.strings.within(&own)
    }
}

/// Skips the value at `cur`, a member of the top-level object: in one step when the syntax pass
/// recorded its extent (debug builds check that against [`Cursor::skip_value`]), else by
/// walking over it.
pub(super) fn skip_child<const N: usize>(
    cur: &mut Cursor<'_, '_>,
    index: &json::StringIndex<N>,
    verify: bool,
) {
    let _ = cur.peek();
    match index.child_end(cur.pos) {
        Some(end) => {
            debug_assert!(
                !verify
                    || end == {
                        let mut s = *cur;
                        s.skip_value();
                        s.pos
                    },
                "child extent and skip disagree at {}",
                cur.pos
            );
            cur.pos = end;
        }
        None => cur.skip_value(),
    }
}
