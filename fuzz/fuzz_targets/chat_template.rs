//! Chat templates on arbitrary text, as trainers send prompts and responses: detection, parsing
//! and end-token stripping never panic; a parsed prompt's messages are trimmed slices of the
//! prompt; rendering the parsed messages and parsing the render gives them back (Gemma's with
//! the system texts folded into a user turn); stripping splits a response into a prefix and the
//! removed suffix, and is idempotent on that prefix.
#![no_main]

use care_core::template::{
    ChatRole, ChatTurn, TemplateFamily, detect_template, parse_prompt, render_prompt,
    strip_end_tokens,
};
use libfuzzer_sys::fuzz_target;

/// What parsing a render of `turns` gives: the turns themselves, except Gemma's, which has no
/// system role: its system texts open the next user turn, or become a user turn of their own
/// when none follows (`render_prompt`'s rule).
fn expected_back(family: TemplateFamily, turns: &[ChatTurn<'_>]) -> Vec<(ChatRole, String)> {
    if family != TemplateFamily::Gemma {
        return turns
            .iter()
            .map(|t| (t.role, t.content.to_owned()))
            .collect();
    }
    let mut out = Vec::new();
    let mut pending = String::new();
    for t in turns {
        match t.role {
            ChatRole::System => {
                pending.push_str(t.content.trim());
                pending.push_str("\n\n");
            }
            ChatRole::User => {
                let text = format!("{pending}{}", t.content.trim());
                out.push((ChatRole::User, text.trim().to_owned()));
                pending.clear();
            }
            ChatRole::Assistant => out.push((ChatRole::Assistant, t.content.trim().to_owned())),
        }
    }
    if !pending.is_empty() {
        out.push((ChatRole::User, pending.trim().to_owned()));
    }
    out
}

/// Messages read per prompt (the server's bound is larger; 64 covers what a fuzzer builds).
const TURNS: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = core::str::from_utf8(data) else {
        return;
    };
    let _ = detect_template(text);
    for family in TemplateFamily::ALL {
        let mut out = [ChatTurn::default(); TURNS];
        let Ok(n) = parse_prompt(text, family, &mut out) else {
            continue;
        };
        assert!(n <= TURNS);
        let turns = &out[..n];
        let range = text.as_ptr() as usize..=text.as_ptr() as usize + text.len();
        for t in turns {
            assert_eq!(t.content, t.content.trim(), "{family:?}: untrimmed {t:?}");
            let at = t.content.as_ptr() as usize;
            assert!(range.contains(&at) && range.contains(&(at + t.content.len())));
        }
        for generation_prompt in [false, true] {
            let mut again = String::new();
            if render_prompt(&mut again, family, turns, generation_prompt).is_err() {
                continue;
            }
            let mut back = [ChatTurn::default(); TURNS];
            if let Ok(m) = parse_prompt(&again, family, &mut back) {
                let got: Vec<(ChatRole, &str)> =
                    back[..m].iter().map(|t| (t.role, t.content)).collect();
                let want = expected_back(family, turns);
                let want: Vec<(ChatRole, &str)> =
                    want.iter().map(|(r, c)| (*r, c.as_str())).collect();
                assert_eq!(got, want, "{family:?} render {again:?}");
            }
        }
    }
    let families: &[&[TemplateFamily]] = &[&TemplateFamily::ALL, &[], &[TemplateFamily::ChatMl]];
    for fams in families {
        let s = strip_end_tokens(text, fams, &["</s>", "###"]);
        assert_eq!(s.text.len() + s.removed.len(), text.len());
        assert!(text.starts_with(s.text) && text.ends_with(s.removed));
        if !s.removed.is_empty() {
            let twice = strip_end_tokens(s.text, fams, &["</s>", "###"]);
            // The run removed was maximal: nothing more ends the kept text.
            assert!(twice.removed.is_empty(), "{text:?} -> {s:?} -> {twice:?}");
        }
    }
});
