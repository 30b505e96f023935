//! Chat templates: the prompts real templates write, read back; hostile prompts refused;
//! end tokens stripped from the end only. The fixtures are the outputs of the models' own
//! `chat_template`s (Hugging Face `apply_chat_template` with `add_generation_prompt=True`, as
//! recorded by llama.cpp's and mistral.rs's template tests and the templates on the Hub).
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use care_core::template::{
    ChatRole, ChatTurn, MAX_END_SUFFIX_BYTES, MAX_END_SUFFIXES, MAX_PROMPT_BYTES,
    MAX_PROMPT_MESSAGES, TemplateError, TemplateFamily, check_end_suffixes, detect_template,
    parse_prompt, render_prompt, strip_end_tokens,
};
use proptest::prelude::*;

use ChatRole::{Assistant as A, System as S, User as U};

fn parse(prompt: &str, family: TemplateFamily) -> Result<Vec<(ChatRole, String)>, TemplateError> {
    let mut out = vec![ChatTurn::default(); MAX_PROMPT_MESSAGES];
    let n = parse_prompt(prompt, family, &mut out)?;
    Ok(out[..n]
        .iter()
        .map(|t| (t.role, t.content.to_owned()))
        .collect())
}

fn turns(list: &[(ChatRole, &str)]) -> Vec<(ChatRole, String)> {
    list.iter().map(|(r, c)| (*r, (*c).to_owned())).collect()
}

/// The conversation of the template tests: system, then user/assistant alternating, ending with
/// the user.
fn conversation(system: Option<&str>) -> Vec<(ChatRole, String)> {
    let mut v = Vec::new();
    if let Some(s) = system {
        v.push((S, s.to_owned()));
    }
    v.extend(turns(&[
        (U, "Hello"),
        (A, "Hi there"),
        (U, "Who are you"),
        (A, "I am an assistant"),
        (U, "Another question"),
    ]));
    v
}

const SYS: &str = "You are a helpful assistant";

/// (model, family, prompt as its template writes it, messages it holds).
type Fixture = (
    &'static str,
    TemplateFamily,
    &'static str,
    Vec<(ChatRole, String)>,
);

fn fixtures() -> Vec<Fixture> {
    use TemplateFamily::*;
    vec![
        (
            "Qwen2.5-Instruct (default system prompt)",
            ChatMl,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\nI am an assistant<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
            conversation(Some(
                "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
            )),
        ),
        (
            "teknium/OpenHermes-2.5-Mistral-7B",
            ChatMl,
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
            conversation(Some(SYS)),
        ),
        (
            "Qwen3 (enable_thinking=False)",
            ChatMl,
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\nI am an assistant<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            conversation(None),
        ),
        (
            "microsoft/phi-4",
            ChatMl,
            "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>",
            conversation(Some(SYS)),
        ),
        (
            "Llama-3 Instruct",
            Llama3,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            conversation(Some(SYS)),
        ),
        (
            "Llama-3.1 Instruct (its dated system header)",
            Llama3,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            turns(&[
                (
                    S,
                    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024",
                ),
                (U, "Hello"),
            ]),
        ),
        (
            "mistralai/Mistral-7B-Instruct-v0.1",
            Mistral,
            "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]   I am an assistant   </s> [INST] Another question [/INST]",
            conversation(None),
        ),
        (
            "mistralai/Mixtral-8x7B-Instruct-v0.1",
            Mistral,
            "<s>[INST] Hello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]",
            conversation(None),
        ),
        (
            "meta-llama/Llama-2-13b-chat-hf",
            Mistral,
            "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]",
            conversation(Some(SYS)),
        ),
        (
            "mistralai/Mistral-Large-Instruct-2411 (v7)",
            Mistral,
            "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
            conversation(Some(SYS)),
        ),
        (
            "mistralai/Mistral-Nemo-Instruct-2407 (v3-tekken, system folded into the last turn)",
            Mistral,
            "<s>[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]You are a helpful assistant\n\nAnother question[/INST]",
            turns(&[
                (U, "Hello"),
                (A, "Hi there"),
                (U, "Who are you"),
                (A, "I am an assistant"),
                (U, "You are a helpful assistant\n\nAnother question"),
            ]),
        ),
        (
            "google/gemma-7b-it",
            Gemma,
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
            conversation(None),
        ),
        (
            "google/gemma-3-it (system folded into the first turn)",
            Gemma,
            "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
            turns(&[
                (U, "You are a helpful assistant\n\nHello"),
                (A, "Hi there"),
                (U, "Another question"),
            ]),
        ),
        (
            "deepseek-ai/DeepSeek-R1",
            DeepSeek,
            "<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are you<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜><think>\n",
            conversation(Some(SYS)),
        ),
        (
            "deepseek-ai/DeepSeek-V3 (no system prompt)",
            DeepSeek,
            "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>",
            turns(&[(U, "Hello")]),
        ),
        (
            "microsoft/Phi-3-small-8k-instruct",
            Phi3,
            "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n",
            conversation(Some(SYS)),
        ),
        (
            "microsoft/Phi-3-mini-4k-instruct (bos)",
            Phi3,
            "<s><|user|>\nHello<|end|>\n<|assistant|>\n",
            turns(&[(U, "Hello")]),
        ),
    ]
}

#[test]
fn real_template_prompts_read_back_into_their_messages() {
    for (model, family, prompt, want) in fixtures() {
        assert_eq!(detect_template(prompt), Some(family), "{model}");
        assert_eq!(parse(prompt, family).as_ref(), Ok(&want), "{model}");
        // No other family reads it.
        for other in TemplateFamily::ALL.into_iter().filter(|f| *f != family) {
            assert!(parse(prompt, other).is_err(), "{model} read as {other}");
        }
    }
}

#[test]
fn render_writes_what_the_real_templates_write() {
    use TemplateFamily::*;
    let write = |family, system: Option<&str>| {
        let mut msgs = conversation(system);
        // The templates that keep the reply's spaces show them.
        if let Some(m) = msgs.iter_mut().find(|(_, c)| c == "I am an assistant") {
            m.1 = "   I am an assistant   ".to_owned();
        }
        let turns: Vec<ChatTurn<'_>> = msgs.iter().map(|(r, c)| ChatTurn::new(*r, c)).collect();
        let mut out = String::new();
        render_prompt(&mut out, family, &turns, true).unwrap();
        out
    };
    let fixture = |model: &str| {
        fixtures()
            .into_iter()
            .find(|f| f.0 == model)
            .map(|f| f.2)
            .unwrap()
    };
    assert_eq!(
        write(ChatMl, Some(SYS)),
        fixture("teknium/OpenHermes-2.5-Mistral-7B")
    );
    assert_eq!(write(Llama3, Some(SYS)), fixture("Llama-3 Instruct"));
    assert_eq!(
        write(Mistral, Some(SYS)),
        format!(
            "<s>{}",
            fixture("mistralai/Mistral-Large-Instruct-2411 (v7)")
        )
    );
    assert_eq!(write(Gemma, None), fixture("google/gemma-7b-it"));
    assert_eq!(
        write(DeepSeek, Some(SYS)),
        fixture("deepseek-ai/DeepSeek-R1").trim_end_matches("<think>\n")
    );
    assert_eq!(
        write(Phi3, Some(SYS)),
        fixture("microsoft/Phi-3-small-8k-instruct")
    );
}

#[test]
fn a_prompt_ending_after_a_complete_turn_reads_too() {
    let p = "<|im_start|>user\nHello<|im_end|>\n";
    assert_eq!(parse(p, TemplateFamily::ChatMl), Ok(turns(&[(U, "Hello")])));
    assert_eq!(parse("", TemplateFamily::ChatMl), Ok(vec![]));
}

fn malformed_at(e: Result<Vec<(ChatRole, String)>, TemplateError>) -> (usize, &'static str) {
    match e {
        Err(TemplateError::Malformed {
            offset, expected, ..
        }) => (offset, expected),
        other => panic!("expected a template mismatch, got {other:?}"),
    }
}

#[test]
fn half_templated_and_nested_prompts_are_refused_with_where_and_why() {
    use TemplateFamily::*;
    // A plain text that only mentions a marker.
    let p = "Why does my prompt show <|im_start|> tokens?";
    assert_eq!(detect_template(p), Some(ChatMl));
    assert_eq!(
        malformed_at(parse(p, ChatMl)),
        (0, "a turn start <|im_start|>")
    );
    // A turn that never ends.
    let p = "<|im_start|>user\nI feel lost";
    assert_eq!(
        malformed_at(parse(p, ChatMl)),
        (17, "the turn's end <|im_end|>")
    );
    // A message holding another turn's markup (nested tokens).
    let p = "<|im_start|>user\nhi <|im_start|>assistant\nsure<|im_end|>\n<|im_start|>assistant\n";
    let (at, why) = malformed_at(parse(p, ChatMl));
    assert_eq!((at, why), (20, "no template token inside a message"));
    // Text after the generation prompt (a prefilled reply).
    let p = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, here";
    assert_eq!(
        malformed_at(parse(p, ChatMl)).1,
        "the turn's end <|im_end|>"
    );
    // An unknown role.
    let p = "<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        malformed_at(parse(p, ChatMl)).1,
        "a role system, user or assistant"
    );
    // Text before the first turn.
    let p = "Context: <|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    assert_eq!(
        malformed_at(parse(p, Llama3)),
        (0, "a turn header <|start_header_id|>")
    );
    // A Llama 2 system block that never closes.
    let p = "<s>[INST] <<SYS>>\nbe kind [/INST]";
    assert_eq!(
        malformed_at(parse(p, Mistral)).1,
        "the system block's end <</SYS>>"
    );
    // A reply without its end.
    let p = "[INST] hi [/INST] hello [INST] again [/INST]";
    assert_eq!(malformed_at(parse(p, Mistral)).1, "the reply's end </s>");
    let p = "<｜User｜>hi<｜Assistant｜>hello";
    assert_eq!(
        malformed_at(parse(p, DeepSeek)).1,
        "the reply's end <｜end▁of▁sentence｜>"
    );
    let p = "<start_of_turn>narrator\nOnce<end_of_turn>\n";
    assert_eq!(
        malformed_at(parse(p, Gemma)).1,
        "a role system, user or assistant"
    );
    let p = "<|user|>\nhi<|end|>\n<|tool|>\n{}<|end|>\n";
    assert_eq!(
        malformed_at(parse(p, Phi3)).1,
        "a turn start <|system|>, <|user|> or <|assistant|>"
    );
    // A role header that never ends within the longest role name.
    let p = format!("<|im_start|>{}", "u".repeat(100));
    assert_eq!(
        malformed_at(parse(&p, ChatMl)).1,
        "a role name and the end of the turn header"
    );
    // Nothing templated at all.
    assert_eq!(detect_template("I feel lost since my friend left."), None);
}

#[test]
fn sizes_are_capped() {
    let long = "a".repeat(MAX_PROMPT_BYTES + 1);
    assert_eq!(
        parse(&long, TemplateFamily::ChatMl),
        Err(TemplateError::TooLong {
            bytes: MAX_PROMPT_BYTES + 1
        })
    );
    let p = "<|im_start|>user\na<|im_end|>\n".repeat(3);
    let mut out = [ChatTurn::default(); 2];
    assert_eq!(
        parse_prompt(&p, TemplateFamily::ChatMl, &mut out),
        Err(TemplateError::TooManyMessages { limit: 2 })
    );
    let p = "<|im_start|>user\na<|im_end|>\n".repeat(MAX_PROMPT_MESSAGES + 1);
    assert_eq!(
        parse(&p, TemplateFamily::ChatMl),
        Err(TemplateError::TooManyMessages {
            limit: MAX_PROMPT_MESSAGES
        })
    );
    assert_eq!(check_end_suffixes(&["<|custom_end|>"]), Ok(()));
    assert_eq!(check_end_suffixes::<&str>(&[]), Ok(()));
    for (bad, index) in [
        (vec![""], 0),
        (vec!["ok", " \n"], 1),
        (vec!["x".repeat(MAX_END_SUFFIX_BYTES + 1).leak() as &str], 0),
    ] {
        assert_eq!(
            check_end_suffixes(&bad),
            Err(TemplateError::BadEndSuffix { index })
        );
    }
    let many = vec!["<e>"; MAX_END_SUFFIXES + 1];
    assert_eq!(
        check_end_suffixes(&many),
        Err(TemplateError::BadEndSuffix {
            index: MAX_END_SUFFIXES
        })
    );
}

#[test]
fn unicode_content_and_headers() {
    // Multibyte text right after a role header (the header search stops on a character
    // boundary), emoji, right-to-left text and zero-width characters inside messages.
    let content = "你好，我很难过 🙂 مرحبا \u{200b}";
    let p = format!("<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(
        parse(&p, TemplateFamily::ChatMl),
        Ok(vec![(U, content.trim().to_owned())])
    );
    let p = format!("<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n");
    assert_eq!(
        parse(&p, TemplateFamily::Gemma),
        Ok(vec![(U, content.trim().to_owned())])
    );
    // A role made of multibyte characters is an unknown role, not a panic.
    let p = format!("<|im_start|>{}\nhi<|im_end|>", "é".repeat(40));
    assert!(parse(&p, TemplateFamily::ChatMl).is_err());
}

#[test]
fn end_tokens_are_stripped_from_the_end_only() {
    use TemplateFamily::*;
    let kardia = "<|emotion_begin|>sad<|emotion_end|><|response_begin|>I hear you.<|response_end|>";
    let all = &TemplateFamily::ALL[..];
    let cases: [(&str, &[TemplateFamily], &str, &str); 13] = [
        (
            "I hear you.<|im_end|>",
            &[ChatMl],
            "I hear you.",
            "<|im_end|>",
        ),
        // Several tokens and the whitespace between them.
        (
            "I hear you. \n<|im_end|>\n<|endoftext|>",
            &[ChatMl],
            "I hear you.",
            " \n<|im_end|>\n<|endoftext|>",
        ),
        // A response that is only an end token becomes empty.
        ("<|eot_id|>", &[Llama3], "", "<|eot_id|>"),
        (
            "<|im_end|><|im_end|>",
            &[ChatMl],
            "",
            "<|im_end|><|im_end|>",
        ),
        // A token inside the response stays.
        ("a<|im_end|>b", &[ChatMl], "a<|im_end|>b", ""),
        // Trailing whitespace alone is kept (not an end token).
        ("I hear you.  \n", &[ChatMl], "I hear you.  \n", ""),
        // Another family's token is not stripped under a family...
        ("I hear you.</s>", &[ChatMl], "I hear you.</s>", ""),
        // ...but is without one (no templated prompt to tell the family).
        ("I hear you.</s>", all, "I hear you.", "</s>"),
        // No family: only the extra suffixes.
        ("I hear you.</s>", &[], "I hear you.</s>", ""),
        (
            "That hurts.<end_of_turn>\n<eos>",
            &[Gemma],
            "That hurts.",
            "<end_of_turn>\n<eos>",
        ),
        (
            "好的<｜end▁of▁sentence｜>",
            &[DeepSeek],
            "好的",
            "<｜end▁of▁sentence｜>",
        ),
        // A profile's own special tokens are not end tokens.
        (kardia, all, kardia, ""),
        // Half a token is text.
        ("I hear you.<|im_en", all, "I hear you.<|im_en", ""),
    ];
    for (response, family, text, removed) in cases {
        let s = strip_end_tokens(response, family, &[]);
        assert_eq!((s.text, s.removed), (text, removed), "{response:?}");
    }
    let with_kardia = format!("{kardia}<|im_end|>");
    assert_eq!(strip_end_tokens(&with_kardia, &[ChatMl], &[]).text, kardia);
    // Extra suffixes, mixed with the family's tokens; an empty one is ignored.
    let s = strip_end_tokens("ok [END]<|im_end|>", &[ChatMl], &["", "[END]"]);
    assert_eq!((s.text, s.removed), ("ok", " [END]<|im_end|>"));
}

const PIECES: [&str; 26] = [
    "a",
    "I feel",
    " ",
    "\n",
    "\t",
    "é",
    "你好",
    "🙂",
    "مرحبا",
    "\u{200b}",
    "<",
    ">",
    "|",
    "[",
    "]",
    "{",
    "}",
    "<think>",
    "</think>",
    "<s>",
    "<|im_start|>",
    "<|eot_id|>",
    "[INST]",
    "<start_of_turn>",
    "<｜User｜>",
    "<|end|>",
];

/// Any text made of hostile pieces: every family's markers, unicode, think blocks.
fn content() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(&PIECES[..]), 0..12).prop_map(|v| v.concat())
}

/// A message content that holds no structural token of `family` and would not be read as
/// markup there (no Llama 2 system block, no Mistral reply end). No piece forms a marker with
/// its neighbours, so leaving out the pieces that are markers is enough.
fn content_for(family: TemplateFamily) -> impl Strategy<Value = String> {
    let extra: &[&str] = match family {
        TemplateFamily::Mistral => &["</s>", "<<SYS>>"],
        _ => &[],
    };
    let pieces: Vec<&str> = PIECES
        .into_iter()
        .filter(|p| !family.markers().iter().chain(extra).any(|m| p.contains(m)))
        .collect();
    proptest::collection::vec(proptest::sample::select(pieces), 0..12).prop_map(|v| v.concat())
}

/// A dialogue for `family`: an optional system message, user/assistant pairs, the user last.
fn dialogue() -> impl Strategy<
    Value = (
        TemplateFamily,
        Option<String>,
        Vec<(String, String)>,
        String,
    ),
> {
    proptest::sample::select(&TemplateFamily::ALL[..]).prop_flat_map(|f| {
        (
            Just(f),
            proptest::option::of(content_for(f)),
            proptest::collection::vec((content_for(f), content_for(f)), 0..3),
            content_for(f),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Relation: reading back what `render_prompt` writes gives the messages (contents
    /// trimmed), for every family, for a dialogue of an optional system message and
    /// user/assistant turns ending with the user (Gemma folds the system message into the first
    /// user turn, as its template does).
    #[test]
    fn parse_reads_back_render((family, system, pairs, last) in dialogue()) {
        let mut msgs: Vec<(ChatRole, String)> = Vec::new();
        if let Some(s) = &system {
            msgs.push((S, s.clone()));
        }
        for (u, a) in pairs {
            msgs.push((U, u));
            msgs.push((A, a));
        }
        msgs.push((U, last));
        // DeepSeek's system prompt is the text before the first turn: a blank one is no message.
        if family == TemplateFamily::DeepSeek {
            msgs.retain(|(r, c)| *r != S || !c.trim().is_empty());
        }
        let turns: Vec<ChatTurn<'_>> =
            msgs.iter().map(|(r, c)| ChatTurn::new(*r, c)).collect();
        let mut prompt = String::new();
        render_prompt(&mut prompt, family, &turns, true).unwrap();
        let mut want: Vec<(ChatRole, String)> =
            msgs.iter().map(|(r, c)| (*r, c.trim().to_owned())).collect();
        if family == TemplateFamily::Gemma && let Some(s) = &system {
            want.remove(0);
            if let Some(first) = want.iter_mut().find(|(r, _)| *r == U) {
                first.1 = format!("{}\n\n{}", s.trim(), first.1).trim().to_owned();
            }
        }
        prop_assert_eq!(parse(&prompt, family), Ok(want), "{:?}", prompt);
    }

    /// Relation: `text` followed by `removed` is the response, stripping again removes nothing,
    /// and `removed` is only end tokens and whitespace (empty when nothing was stripped).
    #[test]
    fn strip_splits_the_response(
        response in content(),
        tail in proptest::collection::vec(
            proptest::sample::select(&["<|im_end|>", "</s>", "<eos>", " ", "\n", "<|eot_id|>", "x"][..]),
            0..5,
        ),
        families in proptest::sample::subsequence(TemplateFamily::ALL.to_vec(), 0..=6),
    ) {
        let r = format!("{response}{}", tail.concat());
        let s = strip_end_tokens(&r, &families, &["[END]"]);
        prop_assert_eq!(format!("{}{}", s.text, s.removed), r.clone());
        let again = strip_end_tokens(s.text, &families, &["[END]"]);
        prop_assert_eq!((again.text, again.removed), (s.text, ""));
        if !s.removed.is_empty() {
            prop_assert!(s.text.trim_end() == s.text);
            prop_assert!(!s.removed.trim().is_empty());
        }
    }

    /// Relation: any text either reads into at most `out.len()` messages or is refused; never a
    /// panic (hostile pieces: every family's markers, unicode, think blocks).
    #[test]
    fn any_text_reads_or_is_refused(
        text in content(),
        family in proptest::sample::select(&TemplateFamily::ALL[..]),
        cap in 0usize..4,
    ) {
        let mut out = vec![ChatTurn::default(); cap];
        if let Ok(n) = parse_prompt(&text, family, &mut out) {
            prop_assert!(n <= cap);
        }
    }
}

/// Fuzz finding (`chat_template`): a Gemma prompt with a system turn and no user turn after it
/// rendered as `<bos>` alone, dropping the text; two system turns kept only the last.
#[test]
fn gemma_render_drops_no_system_text() {
    use TemplateFamily::Gemma;
    let render = |turns: &[ChatTurn<'_>]| {
        let mut out = String::new();
        render_prompt(&mut out, Gemma, turns, false).unwrap();
        out
    };
    let lone = render(&[ChatTurn::new(ChatRole::System, "Be kind.")]);
    assert_eq!(
        lone,
        "<bos><start_of_turn>user\nBe kind.\n\n<end_of_turn>\n"
    );
    let two = render(&[
        ChatTurn::new(ChatRole::System, "Be kind."),
        ChatTurn::new(ChatRole::System, "Be brief."),
        ChatTurn::new(ChatRole::User, "I failed."),
    ]);
    assert_eq!(
        two,
        "<bos><start_of_turn>user\nBe kind.\n\nBe brief.\n\nI failed.<end_of_turn>\n"
    );
    let mut back = [ChatTurn::default(); 4];
    let n = parse_prompt(&two, Gemma, &mut back).unwrap();
    assert_eq!(
        &back[..n],
        [ChatTurn::new(
            ChatRole::User,
            "Be kind.\n\nBe brief.\n\nI failed."
        )]
    );
}
