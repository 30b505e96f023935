//! JSON strings written fast: the judge prompts the loop sends are kilobytes of mostly plain
//! text, and `serde_json` looks at them a byte at a time. Output is byte-identical to
//! `serde_json`'s (a test checks it).

/// `s` as a JSON string literal (quotes included), escaped exactly as `serde_json` does:
/// `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control characters as `\u00xx`, everything
/// else as it is.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    // Whether a word holds a byte below 0x20, a quote or a backslash (exact as a whole: a
    // borrow only spreads above a byte that already matched).
    let special = |w: u64| {
        let below_space = w.wrapping_sub(LO * 0x20) & !w;
        let q = w ^ (LO * u64::from(b'"'));
        let quote = q.wrapping_sub(LO) & !q;
        let b = w ^ (LO * u64::from(b'\\'));
        let backslash = b.wrapping_sub(LO) & !b;
        (below_space | quote | backslash) & HI != 0
    };
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0; // start of the bytes not yet copied
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            if !special(u64::from_le_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let c = bytes[i];
        let esc: Option<&[u8]> = match c {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            0x08 => Some(b"\\b"),
            0x0c => Some(b"\\f"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f => None,
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[run..i]);
        match esc {
            Some(e) => out.extend_from_slice(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 15)]);
            }
        }
        i += 1;
        run = i;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn byte_identical_to_serde_json() {
        let mut cases: Vec<String> = vec![
            String::new(),
            "plain".into(),
            "exactly8".into(),
            "a \"quoted\" \\ path\n\tnext\r\u{8}\u{c}".into(),
            "é ü 中文 🙂 \u{7f} \u{1f} \u{0}".into(),
            "## Rubric\n- criterion_title: Validate Feelings\n  levels: [0] none [5] full\n"
                .repeat(40),
        ];
        // Every byte value below 0x80 at every position of a word, in plain text.
        for c in 0u8..0x80 {
            for at in 0..9 {
                let mut t = "abcdefghijklmnop".to_owned();
                t.insert(at, char::from(c));
                cases.push(t);
            }
        }
        for s in &cases {
            let mut out = Vec::new();
            write_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }
}
