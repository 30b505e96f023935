//! Chat templates, both ways: a chat-templated prompt read back into its messages, and the
//! end-of-turn and end-of-text tokens a policy's response carries stripped off.
//!
//! Trainers hand a reward function the text their tokenizer's chat template produced: OpenRLHF
//! sends the templated prompt and a query decoded with its special tokens (so the response ends
//! with the template's end-of-turn token), and a prompt column may hold templated text. This
//! module is the one table of template families ([`TemplateFamily`]) and the two operations on
//! them; `care serve`, `care reward` and `care_rl` all go through it.
//!
//! * [`parse_prompt`] reads a templated prompt of one family into [`ChatTurn`]s (role and
//!   content, content trimmed), into a caller slice. The whole prompt must follow the family's
//!   template: turn markup, known roles (`system`, `user`, `assistant`; Gemma's `model`), a
//!   message content holding none of the family's structural tokens (a nested or half-templated
//!   prompt is [`TemplateError::Malformed`], never half-read), and after the last turn only the
//!   generation prompt (the assistant header, optionally with an empty or opened `<think>`
//!   block). [`detect_template`] names the family whose turn marker comes first.
//! * [`strip_end_tokens`] removes a run of end tokens (and whitespace between them) from the end
//!   of a response and says what it removed ([`Stripped`]). Only the end: a token inside the
//!   response stays (the judge and the format check see it).
//!
//! Templates that fold the system message into the first user turn (Gemma, Mistral's v1-v3)
//! erase the boundary in the text itself: the parsed user turn holds both. Nothing here
//! allocates; every size is capped ([`MAX_PROMPT_BYTES`], [`MAX_PROMPT_MESSAGES`],
//! [`MAX_END_SUFFIXES`], [`MAX_END_SUFFIX_BYTES`]).
//!
//! ```
//! use care_core::template::{ChatRole, ChatTurn, TemplateFamily, detect_template, parse_prompt,
//!                           strip_end_tokens};
//!
//! let prompt = "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nI feel lost.<|im_end|>\n\
//!               <|im_start|>assistant\n";
//! assert_eq!(detect_template(prompt), Some(TemplateFamily::ChatMl));
//! let mut turns = [ChatTurn::default(); 8];
//! let n = parse_prompt(prompt, TemplateFamily::ChatMl, &mut turns)?;
//! assert_eq!(&turns[..n], &[ChatTurn::new(ChatRole::System, "Be kind."),
//!                           ChatTurn::new(ChatRole::User, "I feel lost.")]);
//!
//! let s = strip_end_tokens("I hear you.<|im_end|>", &[TemplateFamily::ChatMl], &[]);
//! assert_eq!((s.text, s.removed), ("I hear you.", "<|im_end|>"));
//! # Ok::<(), care_core::template::TemplateError>(())
//! ```

use core::fmt;

use crate::names::named_enum;

/// Longest prompt [`parse_prompt`] reads, in bytes (a longer one is [`TemplateError::TooLong`]).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;
/// Most messages [`parse_prompt`] reads from one prompt.
pub const MAX_PROMPT_MESSAGES: usize = 1024;
/// Most extra end suffixes ([`check_end_suffixes`]).
pub const MAX_END_SUFFIXES: usize = 16;
/// Longest extra end suffix, in bytes.
pub const MAX_END_SUFFIX_BYTES: usize = 64;
/// Longest role name read from a template's turn header, in bytes.
const MAX_ROLE_BYTES: usize = 32;

/// A chat-template family: how a family of models writes a conversation as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TemplateFamily {
    /// ChatML: `<|im_start|>role\n...<|im_end|>` (Qwen, Yi, Hermes; Phi-4's `<|im_sep|>` form).
    ChatMl,
    /// Llama 3: `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`.
    Llama3,
    /// Mistral and Llama 2: `[INST] ... [/INST] reply</s>` (with `<<SYS>>` or `[SYSTEM_PROMPT]`).
    Mistral,
    /// Gemma: `<start_of_turn>user|model\n...<end_of_turn>`.
    Gemma,
    /// DeepSeek V3 and R1: `<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>`.
    DeepSeek,
    /// Phi-3: `<|user|>\n...<|end|>\n<|assistant|>\n`.
    Phi3,
}

named_enum!(TemplateFamily, "chat template family", {
    ChatMl => "chatml", "<|im_start|>role ... <|im_end|> (Qwen, Yi, Hermes, Phi-4)";
    Llama3 => "llama3", "<|start_header_id|>role<|end_header_id|> ... <|eot_id|> (Llama 3)";
    Mistral => "mistral", "[INST] ... [/INST] reply</s> (Mistral, Mixtral, Llama 2)";
    Gemma => "gemma", "<start_of_turn>user|model ... <end_of_turn> (Gemma)";
    DeepSeek => "deepseek", "<｜User｜> ... <｜Assistant｜> ... <｜end▁of▁sentence｜> (DeepSeek V3, R1)";
    Phi3 => "phi3", "<|user|> ... <|end|> <|assistant|> (Phi-3)";
});

/// Which template a prompt and its responses use: found in the prompt, none, or one family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TemplateChoice {
    /// The family whose turn marker the prompt shows ([`detect_template`]); responses without
    /// such a prompt lose the end tokens of every family.
    #[default]
    Auto,
    /// No template: the prompt is one user message and responses keep their tokens.
    Off,
    /// This family only.
    Family(TemplateFamily),
}

impl TemplateChoice {
    /// The names accepted besides the family names.
    pub const KEYWORDS: [&'static str; 2] = ["auto", "none"];

    /// `auto`, `none`, or a family name ([`TemplateFamily::NAMES`]).
    pub fn from_name(name: &str) -> Option<TemplateChoice> {
        match name {
            "auto" => Some(TemplateChoice::Auto),
            "none" => Some(TemplateChoice::Off),
            other => TemplateFamily::from_name(other).map(TemplateChoice::Family),
        }
    }

    /// The stable name (`auto`, `none`, or the family's name).
    pub const fn name(self) -> &'static str {
        match self {
            TemplateChoice::Auto => "auto",
            TemplateChoice::Off => "none",
            TemplateChoice::Family(f) => f.name(),
        }
    }
}

impl fmt::Display for TemplateChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// The role of one message of a templated prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ChatRole {
    /// Instructions to the model.
    System,
    /// The user (in an emotional-support dialogue, the seeker).
    #[default]
    User,
    /// The model (Gemma's `model`).
    Assistant,
}

named_enum!(ChatRole, "chat role", {
    System => "system", "Instructions to the model";
    User => "user", "The user (the seeker)";
    Assistant => "assistant", "The model (the supporter)";
});

/// One message of a templated prompt, borrowed from the prompt; `content` is trimmed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChatTurn<'a> {
    /// Who wrote it.
    pub role: ChatRole,
    /// What they wrote, without the template's markup and surrounding whitespace.
    pub content: &'a str,
}

impl<'a> ChatTurn<'a> {
    /// A message.
    pub const fn new(role: ChatRole, content: &'a str) -> Self {
        ChatTurn { role, content }
    }
}

/// Why a prompt is not a templated prompt of a family, or extra suffixes are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TemplateError {
    /// The prompt has more than [`MAX_PROMPT_BYTES`] bytes.
    TooLong {
        /// Its length.
        bytes: usize,
    },
    /// More messages than [`MAX_PROMPT_MESSAGES`] or the output slice holds.
    TooManyMessages {
        /// How many fit.
        limit: usize,
    },
    /// The text stops following the family's template at byte `offset`.
    Malformed {
        /// The family tried.
        family: TemplateFamily,
        /// Byte offset into the prompt.
        offset: usize,
        /// What the template has there.
        expected: &'static str,
    },
    /// Extra end suffix `index` is empty, blank, or longer than [`MAX_END_SUFFIX_BYTES`], or
    /// there are more than [`MAX_END_SUFFIXES`] (then `index` is the first one too many).
    BadEndSuffix {
        /// Which suffix.
        index: usize,
    },
}

impl TemplateError {
    /// A stable snake_case code.
    pub const fn code(&self) -> &'static str {
        match self {
            TemplateError::TooLong { .. } => "prompt_too_long",
            TemplateError::TooManyMessages { .. } => "too_many_messages",
            TemplateError::Malformed { .. } => "template_mismatch",
            TemplateError::BadEndSuffix { .. } => "bad_end_suffix",
        }
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::TooLong { bytes } => write!(
                f,
                "the prompt has {bytes} bytes, more than the {MAX_PROMPT_BYTES} a templated prompt may have"
            ),
            TemplateError::TooManyMessages { limit } => {
                write!(f, "the prompt has more than {limit} messages")
            }
            TemplateError::Malformed {
                family,
                offset,
                expected,
            } => write!(
                f,
                "not a {family} prompt from byte {offset}: the template has {expected} there"
            ),
            TemplateError::BadEndSuffix { index } => write!(
                f,
                "end suffix {index}: give at most {MAX_END_SUFFIXES} suffixes of 1 to \
                 {MAX_END_SUFFIX_BYTES} bytes, not only whitespace"
            ),
        }
    }
}

impl core::error::Error for TemplateError {}

/// What a family's template looks like, as far as reading it back needs.
struct Spec {
    family: TemplateFamily,
    /// Structural tokens: a message content holding one is not a message of this family.
    markers: &'static [&'static str],
    /// What starts a turn; the earliest in a text names the family ([`detect_template`]).
    openers: &'static [&'static str],
    /// Beginning-of-text tokens a prompt may start with.
    bos: &'static [&'static str],
    /// End-of-turn and end-of-text tokens a response may end with.
    end_tokens: &'static [&'static str],
}

/// The one table of template families (the order of [`TemplateFamily::ALL`]).
static SPECS: [Spec; 6] = [
    Spec {
        family: TemplateFamily::ChatMl,
        markers: &["<|im_start|>", "<|im_end|>", "<|im_sep|>"],
        openers: &["<|im_start|>"],
        bos: &[],
        end_tokens: &["<|im_end|>", "<|endoftext|>"],
    },
    Spec {
        family: TemplateFamily::Llama3,
        markers: &[
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
        ],
        openers: &["<|start_header_id|>"],
        bos: &["<|begin_of_text|>"],
        end_tokens: &["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
    },
    Spec {
        family: TemplateFamily::Mistral,
        markers: &["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"],
        openers: &["[INST]", "[SYSTEM_PROMPT]"],
        bos: &["<s>"],
        end_tokens: &["</s>"],
    },
    Spec {
        family: TemplateFamily::Gemma,
        markers: &["<start_of_turn>", "<end_of_turn>"],
        openers: &["<start_of_turn>"],
        bos: &["<bos>"],
        end_tokens: &["<end_of_turn>", "<eos>"],
    },
    Spec {
        family: TemplateFamily::DeepSeek,
        markers: &[
            "<｜begin▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜end▁of▁sentence｜>",
        ],
        openers: &["<｜User｜>"],
        bos: &["<｜begin▁of▁sentence｜>"],
        end_tokens: &["<｜end▁of▁sentence｜>"],
    },
    Spec {
        family: TemplateFamily::Phi3,
        markers: &["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        openers: &["<|system|>", "<|user|>"],
        bos: &["<s>"],
        end_tokens: &["<|end|>", "<|endoftext|>"],
    },
];

fn spec(family: TemplateFamily) -> &'static Spec {
    // SPECS is in the order of TemplateFamily::ALL (a unit test checks it).
    match family {
        TemplateFamily::ChatMl => &SPECS[0],
        TemplateFamily::Llama3 => &SPECS[1],
        TemplateFamily::Mistral => &SPECS[2],
        TemplateFamily::Gemma => &SPECS[3],
        TemplateFamily::DeepSeek => &SPECS[4],
        TemplateFamily::Phi3 => &SPECS[5],
    }
}

impl TemplateFamily {
    /// The end-of-turn and end-of-text tokens [`strip_end_tokens`] removes for this family.
    pub fn end_tokens(self) -> &'static [&'static str] {
        spec(self).end_tokens
    }

    /// The structural tokens of this family's template (turn starts and ends, headers).
    pub fn markers(self) -> &'static [&'static str] {
        spec(self).markers
    }
}

/// The family whose turn marker comes first in `text`, if any family's does: the template a
/// templated prompt was written with. A plain text gives `None`; a text that only mentions a
/// marker gives that family, and [`parse_prompt`] then says whether it really is one.
pub fn detect_template(text: &str) -> Option<TemplateFamily> {
    let mut best: Option<(usize, TemplateFamily)> = None;
    for s in &SPECS {
        for o in s.openers {
            if let Some(at) = text.find(o)
                && best.is_none_or(|(b, _)| at < b)
            {
                best = Some((at, s.family));
            }
        }
    }
    best.map(|(_, f)| f)
}

/// Reads a templated prompt of `family` into `out`; returns how many messages it wrote.
///
/// Leading beginning-of-text tokens are skipped; whitespace between turns is ignored. The
/// prompt may end with the generation prompt (the assistant header, optionally followed by an
/// empty `<think></think>` block or an opened `<think>`) or after a complete turn. Contents are
/// trimmed of whitespace.
///
/// # Errors
/// [`TemplateError::TooLong`] above [`MAX_PROMPT_BYTES`]; [`TemplateError::TooManyMessages`]
/// beyond `out.len()` or [`MAX_PROMPT_MESSAGES`]; [`TemplateError::Malformed`] where the text
/// stops following the template (markup missing, an unknown role, a message content holding
/// one of the family's structural tokens, text after the generation prompt). `out` holds
/// whatever was read before the error.
pub fn parse_prompt<'a>(
    prompt: &'a str,
    family: TemplateFamily,
    out: &mut [ChatTurn<'a>],
) -> Result<usize, TemplateError> {
    if prompt.len() > MAX_PROMPT_BYTES {
        return Err(TemplateError::TooLong {
            bytes: prompt.len(),
        });
    }
    let spec = spec(family);
    let mut r = Reader {
        text: prompt,
        pos: 0,
        spec,
        out,
        n: 0,
    };
    for b in spec.bos {
        if r.eat(b) {
            break;
        }
    }
    match family {
        TemplateFamily::ChatMl => chatml(&mut r)?,
        TemplateFamily::Llama3 => llama3(&mut r)?,
        TemplateFamily::Mistral => mistral(&mut r)?,
        TemplateFamily::Gemma => gemma(&mut r)?,
        TemplateFamily::DeepSeek => deepseek(&mut r)?,
        TemplateFamily::Phi3 => phi3(&mut r)?,
    }
    Ok(r.n)
}

/// A response without the end tokens it ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stripped<'a> {
    /// The response up to the removed run (trailing whitespace before it removed too).
    pub text: &'a str,
    /// What was removed, verbatim (empty when the response ended with no end token).
    pub removed: &'a str,
}

/// Removes the run of end tokens at the end of `response`: the end tokens of `families`
/// ([`TemplateFamily::ALL`] when the family is not known, none to strip only the extra ones) and
/// the `extra` suffixes, with any whitespace before, between and after them. A response that
/// ends with no such token is returned whole (its trailing whitespace kept). Empty extra
/// suffixes are ignored ([`check_end_suffixes`] refuses them).
pub fn strip_end_tokens<'a>(
    response: &'a str,
    families: &[TemplateFamily],
    extra: &[&str],
) -> Stripped<'a> {
    let mut end = response.len();
    let mut any = false;
    loop {
        let head = response.get(..end).unwrap_or("").trim_end();
        let Some(len) = end_token_suffix(head, families, extra) else {
            break;
        };
        end = head.len() - len;
        any = true;
    }
    if !any {
        return Stripped {
            text: response,
            removed: "",
        };
    }
    let text = response.get(..end).unwrap_or("").trim_end();
    Stripped {
        text,
        removed: response.get(text.len()..).unwrap_or(""),
    }
}

/// The length of the end token (or extra suffix) `text` ends with, if any.
fn end_token_suffix(text: &str, families: &[TemplateFamily], extra: &[&str]) -> Option<usize> {
    for f in families {
        for t in f.end_tokens() {
            if text.ends_with(t) {
                return Some(t.len());
            }
        }
    }
    extra
        .iter()
        .find(|t| !t.is_empty() && text.ends_with(**t))
        .map(|t| t.len())
}

/// Checks extra end suffixes: at most [`MAX_END_SUFFIXES`], each 1 to [`MAX_END_SUFFIX_BYTES`]
/// bytes and not only whitespace.
///
/// # Errors
/// [`TemplateError::BadEndSuffix`] naming the first bad one.
pub fn check_end_suffixes<S: AsRef<str>>(extra: &[S]) -> Result<(), TemplateError> {
    for (index, s) in extra.iter().enumerate() {
        let s = s.as_ref();
        if index >= MAX_END_SUFFIXES || s.len() > MAX_END_SUFFIX_BYTES || s.trim().is_empty() {
            return Err(TemplateError::BadEndSuffix { index });
        }
    }
    Ok(())
}

/// Writes `turns` as `family`'s template writes them (one model's template per family: ChatML
/// as Qwen and Hermes write it, Llama 3, Mistral's v7, Gemma with the system texts folded into
/// the next user turn (or, with none after them, written as a user turn of their own: no text
/// is dropped), DeepSeek V3, Phi-3), then the generation prompt when
/// `generation_prompt` is set (Mistral's has none: the prompt ends with `[/INST]`).
/// [`parse_prompt`] reads the result back.
///
/// # Errors
/// Only those of `w`.
pub fn render_prompt<W: fmt::Write>(
    w: &mut W,
    family: TemplateFamily,
    turns: &[ChatTurn<'_>],
    generation_prompt: bool,
) -> fmt::Result {
    match family {
        TemplateFamily::ChatMl => {
            for t in turns {
                write!(w, "<|im_start|>{}\n{}<|im_end|>\n", t.role, t.content)?;
            }
            if generation_prompt {
                w.write_str("<|im_start|>assistant\n")?;
            }
        }
        TemplateFamily::Llama3 => {
            w.write_str("<|begin_of_text|>")?;
            for t in turns {
                write!(
                    w,
                    "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                    t.role,
                    t.content.trim()
                )?;
            }
            if generation_prompt {
                w.write_str("<|start_header_id|>assistant<|end_header_id|>\n\n")?;
            }
        }
        TemplateFamily::Mistral => {
            w.write_str("<s>")?;
            for t in turns {
                match t.role {
                    ChatRole::System => {
                        write!(w, "[SYSTEM_PROMPT] {}[/SYSTEM_PROMPT]", t.content)?;
                    }
                    ChatRole::User => write!(w, "[INST] {}[/INST]", t.content)?,
                    ChatRole::Assistant => write!(w, " {}</s>", t.content)?,
                }
            }
        }
        TemplateFamily::Gemma => {
            w.write_str("<bos>")?;
            // Gemma has no system role: the system texts (all of them, in order) open the next
            // user turn; system texts with no user turn after them become one of their own, so
            // that no text is lost.
            let pending = |w: &mut W, from: usize, to: usize| -> fmt::Result {
                for t in turns.get(from..to).unwrap_or(&[]) {
                    if t.role == ChatRole::System {
                        write!(w, "{}\n\n", t.content.trim())?;
                    }
                }
                Ok(())
            };
            let mut since = 0;
            for (k, t) in turns.iter().enumerate() {
                let role = match t.role {
                    ChatRole::System => continue,
                    ChatRole::User => "user",
                    ChatRole::Assistant => "model",
                };
                writeln!(w, "<start_of_turn>{role}")?;
                if t.role == ChatRole::User {
                    pending(w, since, k)?;
                    since = k + 1;
                }
                writeln!(w, "{}<end_of_turn>", t.content.trim())?;
            }
            if turns
                .get(since..)
                .is_some_and(|rest| rest.iter().any(|t| t.role == ChatRole::System))
            {
                w.write_str("<start_of_turn>user\n")?;
                pending(w, since, turns.len())?;
                w.write_str("<end_of_turn>\n")?;
            }
            if generation_prompt {
                w.write_str("<start_of_turn>model\n")?;
            }
        }
        TemplateFamily::DeepSeek => {
            w.write_str("<｜begin▁of▁sentence｜>")?;
            for t in turns.iter().filter(|t| t.role == ChatRole::System) {
                w.write_str(t.content)?;
            }
            for t in turns {
                match t.role {
                    ChatRole::System => {}
                    ChatRole::User => write!(w, "<｜User｜>{}", t.content)?,
                    ChatRole::Assistant => {
                        write!(w, "<｜Assistant｜>{}<｜end▁of▁sentence｜>", t.content)?;
                    }
                }
            }
            if generation_prompt {
                w.write_str("<｜Assistant｜>")?;
            }
        }
        TemplateFamily::Phi3 => {
            for t in turns {
                write!(w, "<|{}|>\n{}<|end|>\n", t.role, t.content)?;
            }
            if generation_prompt {
                w.write_str("<|assistant|>\n")?;
            }
        }
    }
    Ok(())
}

/// A cursor over the prompt that writes the messages it reads.
struct Reader<'a, 'o> {
    text: &'a str,
    pos: usize,
    spec: &'static Spec,
    out: &'o mut [ChatTurn<'a>],
    n: usize,
}

impl<'a> Reader<'a, '_> {
    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// The text up to `end` (consumed with it), or `None` when `end` does not follow.
    fn until(&mut self, end: &str) -> Option<&'a str> {
        let rest = self.rest();
        let at = rest.find(end)?;
        self.pos += at + end.len();
        rest.get(..at)
    }

    fn malformed(&self, at: usize, expected: &'static str) -> TemplateError {
        TemplateError::Malformed {
            family: self.spec.family,
            offset: at,
            expected,
        }
    }

    /// Records a message whose raw content starts at byte `at`.
    fn push(&mut self, role: ChatRole, content: &'a str, at: usize) -> Result<(), TemplateError> {
        for m in self.spec.markers {
            if let Some(i) = content.find(m) {
                return Err(self.malformed(at + i, "no template token inside a message"));
            }
        }
        let limit = self.out.len().min(MAX_PROMPT_MESSAGES);
        if self.n >= limit {
            return Err(TemplateError::TooManyMessages { limit });
        }
        if let Some(slot) = self.out.get_mut(self.n) {
            *slot = ChatTurn::new(role, content.trim());
        }
        self.n += 1;
        Ok(())
    }

    /// Whether the rest is the generation prompt's tail: blank, or a `<think>` block that is
    /// empty or just opened.
    fn generation_tail(&self) -> bool {
        let t = self.rest().trim_start();
        let t = match t.strip_prefix("<think>") {
            Some(r) => {
                let r = r.trim_start();
                r.strip_prefix("</think>").unwrap_or(r)
            }
            None => t,
        };
        t.trim().is_empty()
    }

    /// A role name up to `end` (consumed with it).
    fn role_until(
        &mut self,
        end: &str,
        names: &[(&str, ChatRole)],
    ) -> Result<ChatRole, TemplateError> {
        let at = self.pos;
        let rest = self.rest();
        let found = head(rest, MAX_ROLE_BYTES + end.len()).find(end);
        let Some(i) = found else {
            return Err(self.malformed(at, "a role name and the end of the turn header"));
        };
        let name = rest.get(..i).unwrap_or("").trim();
        let role = names.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
        let Some(role) = role else {
            return Err(self.malformed(at, "a role system, user or assistant"));
        };
        self.pos += i + end.len();
        Ok(role)
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn head(s: &str, max: usize) -> &str {
    let mut i = max.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    s.get(..i).unwrap_or("")
}

const ROLES: [(&str, ChatRole); 3] = [
    ("system", ChatRole::System),
    ("user", ChatRole::User),
    ("assistant", ChatRole::Assistant),
];

fn chatml(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    loop {
        r.skip_ws();
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        if !r.eat("<|im_start|>") {
            return Err(r.malformed(at, "a turn start <|im_start|>"));
        }
        // Phi-4 writes `<|im_sep|>` after the role where ChatML writes a newline.
        let rest = r.rest();
        let sep = match (rest.find('\n'), rest.find("<|im_sep|>")) {
            (Some(nl), Some(s)) if s < nl => "<|im_sep|>",
            (None, Some(_)) => "<|im_sep|>",
            _ => "\n",
        };
        let role = r.role_until(sep, &ROLES)?;
        if role == ChatRole::Assistant && r.generation_tail() {
            return Ok(());
        }
        let body = r.pos;
        let Some(content) = r.until("<|im_end|>") else {
            return Err(r.malformed(body, "the turn's end <|im_end|>"));
        };
        r.push(role, content, body)?;
    }
}

fn llama3(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    loop {
        r.skip_ws();
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        if !r.eat("<|start_header_id|>") {
            return Err(r.malformed(at, "a turn header <|start_header_id|>"));
        }
        let role = r.role_until("<|end_header_id|>", &ROLES)?;
        if role == ChatRole::Assistant && r.generation_tail() {
            return Ok(());
        }
        let body = r.pos;
        let Some(content) = r.until("<|eot_id|>") else {
            return Err(r.malformed(body, "the turn's end <|eot_id|>"));
        };
        r.push(role, content, body)?;
    }
}

fn mistral(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    loop {
        r.skip_ws();
        // Llama 2 repeats the beginning-of-text token before each later turn.
        r.eat("<s>");
        r.skip_ws();
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        if r.eat("[SYSTEM_PROMPT]") {
            let body = r.pos;
            let Some(content) = r.until("[/SYSTEM_PROMPT]") else {
                return Err(r.malformed(body, "the system prompt's end [/SYSTEM_PROMPT]"));
            };
            r.push(ChatRole::System, content, body)?;
            continue;
        }
        if !r.eat("[INST]") {
            return Err(r.malformed(at, "a turn start [INST]"));
        }
        let body = r.pos;
        let Some(content) = r.until("[/INST]") else {
            return Err(r.malformed(body, "the instruction's end [/INST]"));
        };
        // Llama 2 writes the system prompt in a <<SYS>> block at the start of the first turn.
        let lead = content.len() - content.trim_start().len();
        match content.trim_start().strip_prefix("<<SYS>>") {
            Some(sys_and_user) => {
                let Some((system, user)) = sys_and_user.split_once("<</SYS>>") else {
                    return Err(r.malformed(body + lead, "the system block's end <</SYS>>"));
                };
                r.push(ChatRole::System, system, body + lead)?;
                r.push(ChatRole::User, user, body)?;
            }
            None => r.push(ChatRole::User, content, body)?,
        }
        // The reply to it, if the prompt goes on.
        let rest = r.rest().trim_start();
        if rest.is_empty() {
            return Ok(());
        }
        if rest.starts_with("[INST]") || rest.starts_with("[SYSTEM_PROMPT]") {
            continue;
        }
        let reply = r.pos;
        let Some(content) = r.until("</s>") else {
            return Err(r.malformed(reply, "the reply's end </s>"));
        };
        r.push(ChatRole::Assistant, content, reply)?;
    }
}

fn gemma(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    const GEMMA_ROLES: [(&str, ChatRole); 3] = [
        ("system", ChatRole::System),
        ("user", ChatRole::User),
        ("model", ChatRole::Assistant),
    ];
    loop {
        r.skip_ws();
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        if !r.eat("<start_of_turn>") {
            return Err(r.malformed(at, "a turn start <start_of_turn>"));
        }
        let role = r.role_until("\n", &GEMMA_ROLES)?;
        if role == ChatRole::Assistant && r.generation_tail() {
            return Ok(());
        }
        let body = r.pos;
        let Some(content) = r.until("<end_of_turn>") else {
            return Err(r.malformed(body, "the turn's end <end_of_turn>"));
        };
        r.push(role, content, body)?;
    }
}

fn deepseek(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    const USER: &str = "<｜User｜>";
    const ASSISTANT: &str = "<｜Assistant｜>";
    // The system prompt is the text before the first user turn.
    let at = r.pos;
    let Some(first) = r.rest().find(USER) else {
        return Err(r.malformed(at, "a user turn <｜User｜>"));
    };
    let system = r.rest().get(..first).unwrap_or("");
    if !system.trim().is_empty() {
        r.push(ChatRole::System, system, at)?;
    }
    r.pos += first;
    loop {
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        if r.eat(USER) {
            let body = r.pos;
            let rest = r.rest();
            let end = [rest.find(ASSISTANT), rest.find(USER)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(rest.len());
            r.push(ChatRole::User, rest.get(..end).unwrap_or(""), body)?;
            r.pos += end;
        } else if r.eat(ASSISTANT) {
            if r.generation_tail() {
                return Ok(());
            }
            let body = r.pos;
            let Some(content) = r.until("<｜end▁of▁sentence｜>") else {
                return Err(r.malformed(body, "the reply's end <｜end▁of▁sentence｜>"));
            };
            r.push(ChatRole::Assistant, content, body)?;
            r.skip_ws();
        } else {
            return Err(r.malformed(at, "a turn start <｜User｜> or <｜Assistant｜>"));
        }
    }
}

fn phi3(r: &mut Reader<'_, '_>) -> Result<(), TemplateError> {
    loop {
        r.skip_ws();
        if r.at_end() {
            return Ok(());
        }
        let at = r.pos;
        let role = if r.eat("<|system|>") {
            ChatRole::System
        } else if r.eat("<|user|>") {
            ChatRole::User
        } else if r.eat("<|assistant|>") {
            ChatRole::Assistant
        } else {
            return Err(r.malformed(at, "a turn start <|system|>, <|user|> or <|assistant|>"));
        };
        if role == ChatRole::Assistant && r.generation_tail() {
            return Ok(());
        }
        let body = r.pos;
        let Some(content) = r.until("<|end|>") else {
            return Err(r.malformed(body, "the turn's end <|end|>"));
        };
        r.push(role, content, body)?;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_the_family_order() {
        for (s, f) in SPECS.iter().zip(TemplateFamily::ALL) {
            assert_eq!(s.family, f);
            assert!(core::ptr::eq(spec(f), s));
            for t in s.end_tokens.iter().chain(s.markers).chain(s.openers) {
                assert!(!t.is_empty() && t.trim() == *t);
            }
        }
    }

    #[test]
    fn choice_names() {
        assert_eq!(
            TemplateChoice::from_name("auto"),
            Some(TemplateChoice::Auto)
        );
        assert_eq!(TemplateChoice::from_name("none"), Some(TemplateChoice::Off));
        assert_eq!(
            TemplateChoice::from_name("gemma"),
            Some(TemplateChoice::Family(TemplateFamily::Gemma))
        );
        assert_eq!(TemplateChoice::from_name("Gemma"), None);
        for c in [TemplateChoice::Auto, TemplateChoice::Off]
            .into_iter()
            .chain(TemplateFamily::ALL.map(TemplateChoice::Family))
        {
            assert_eq!(TemplateChoice::from_name(c.name()), Some(c));
        }
    }
}
