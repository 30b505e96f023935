//! The bytes trainers send, over real HTTP on 127.0.0.1 with the stub as the LLM: OpenRLHF's
//! `/get_reward` as its current release calls it (one sample per request, the group's samples
//! concurrently, the templated prompt, a query decoded with the template's special tokens, the
//! gold in the label, empty payloads to the other reward endpoints) gives the Kardia profile the
//! same rewards, and the judge the same prompts, as `/v1/reward` on the clean dialogue, for
//! every template family.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use care_core::template::{ChatRole, ChatTurn, TemplateFamily, render_prompt};
use care_loop::fixed::MissingGold;
use care_loop::llm::Role;
use care_loop::server::{ServerOptions, router, serve};
use care_loop::stub::{Stub, StubReply};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};

/// The Kardia judge's answer giving every criterion `score`.
fn kardia_answer(score: u8) -> String {
    let profile: Value =
        serde_json::from_str(care_core::profile::Profile::builtin_json("kardia").unwrap()).unwrap();
    let mut items = Vec::new();
    for d in profile["dimensions"].as_array().unwrap() {
        for c in d["criteria"].as_array().unwrap() {
            items.push(
                json!({"category": d["name"], "criterion_title": c["title"], "score": score}),
            );
        }
    }
    json!({ "criterion_scores": items }).to_string()
}

/// A Kardia output whose judged span is `response`.
fn output(emotion: &str, response: &str) -> String {
    format!(
        "<|understanding_begin|>A student fears her exam.<|understanding_end|>\
         <|reasoning_begin|>Reassure first.<|reasoning_end|>\
         <|emotion_begin|>{emotion}<|emotion_end|>\
         <|response_begin|>{response}<|response_end|>"
    )
}

/// The group: two well-formed outputs (the judge scores `score:N` as N) and a malformed one.
fn group() -> Vec<String> {
    vec![
        output("Afraid", "score:5"),
        output("joy", "score:3"),
        "I am sure you will be fine!".to_owned(),
    ]
}

const SYSTEM: &str = "You are a supportive listener.";

/// The clean dialogue: what a label's `context` holds.
fn clean(with_system: bool) -> Value {
    let mut v = Vec::new();
    if with_system {
        v.push(json!({"role": "system", "content": SYSTEM}));
    }
    v.push(json!({"role": "user", "content": "My exam is tomorrow and I can't breathe."}));
    v.push(
        json!({"role": "assistant", "content": "That sounds frightening. What scares you most?"}),
    );
    v.push(json!({"role": "user", "content": "That I will fail and disappoint everyone."}));
    Value::Array(v)
}

/// The prompt the family's template writes for the clean dialogue (generation prompt included).
fn templated(family: TemplateFamily, with_system: bool) -> String {
    let msgs = clean(with_system);
    let turns: Vec<ChatTurn<'_>> = msgs
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "system" => ChatRole::System,
                "user" => ChatRole::User,
                _ => ChatRole::Assistant,
            };
            ChatTurn::new(role, m["content"].as_str().unwrap())
        })
        .collect();
    let mut p = String::new();
    render_prompt(&mut p, family, &turns, true).unwrap();
    p
}

struct Server {
    addr: SocketAddr,
    stub: Stub,
    _task: tokio::task::JoinHandle<std::io::Result<()>>,
    client: reqwest::Client,
}

impl Server {
    async fn start(missing_gold: MissingGold) -> Server {
        let stub = Stub::start(|req, _| match req.role {
            Role::Generator => panic!("the kardia profile calls no generator"),
            Role::Judge => {
                let n: u8 = req
                    .judged_response()
                    .and_then(|r| r.strip_prefix("score:"))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                StubReply::Content(kardia_answer(n))
            }
        })
        .await
        .unwrap();
        let cfg = LoopConfig {
            judge: EndpointConfig {
                backoff_initial_secs: 0.001,
                backoff_max_secs: 0.002,
                ..EndpointConfig::new(stub.base_url(), "judge")
            }
            .into(),
            profile: "kardia".into(),
            missing_gold,
            ..LoopConfig::default()
        };
        let engine =
            Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(serve(
            listener,
            router(engine, ServerOptions::default(), "http"),
            std::future::pending(),
        ));
        Server {
            addr,
            stub,
            _task: task,
            client: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("http://{}{path}", self.addr))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    /// The judge prompts the stub has seen since `from`.
    fn judge_prompts(&self, from: usize) -> BTreeSet<String> {
        self.stub.calls()[from..]
            .iter()
            .map(|c| c.messages[0].content.clone())
            .collect()
    }
}

/// OpenRLHF's `SingleTurnAgentExecutor` with two `--remote_rm_url` endpoints: each sample is its
/// own request, right after its generation, so a group's samples arrive concurrently; the batch
/// of one is split `ceil(1 / 2)` per endpoint, so the second endpoint gets empty lists.
async fn openrlhf(s: &Server, prompt: &str, queries: &[String], label: &Value) -> Vec<Value> {
    let mut set = tokio::task::JoinSet::new();
    let url = format!("http://{}/get_reward", s.addr);
    for (i, q) in queries.iter().enumerate() {
        let body = json!({"query": [q], "prompts": [prompt], "labels": [label]});
        let (client, url) = (s.client.clone(), url.clone());
        set.spawn(async move {
            let r = client.post(url).json(&body).send().await.unwrap();
            (i, r.status().as_u16(), r.json::<Value>().await.unwrap())
        });
    }
    let empty = json!({"query": [], "prompts": [], "labels": []});
    let (code, v) = s.post("/get_reward", &empty).await;
    assert_eq!(code, 200);
    assert_eq!(v["rewards"], json!([]), "an empty payload gets empty lists");
    let mut out = vec![Value::Null; queries.len()];
    while let Some(done) = set.join_next().await {
        let (i, code, v) = done.unwrap();
        assert_eq!(code, 200, "{v}");
        out[i] = v;
    }
    out
}

async fn same_rewards_as_the_clean_dialogue(family: TemplateFamily, end: &str) {
    let s = Server::start(MissingGold::Refuse).await;
    // Gemma's template folds the system text into the user turn: its clean dialogue has none.
    let with_system = family != TemplateFamily::Gemma;
    let gold = json!({"emotion": "fear"});
    let (code, clean_answer) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"context": clean(with_system), "responses": group(), "gold": gold}]}),
        )
        .await;
    assert_eq!(code, 200, "{clean_answer}");
    let want: Vec<Value> = clean_answer["results"][0]["rewards"]
        .as_array()
        .unwrap()
        .clone();
    // r = 0.8 * (score / 5) + 0.2 * (emotion matches): 1.0, 0.48, and 0 for the malformed one.
    assert_eq!(want[0], json!(1.0));
    assert_eq!(want[2], json!(0.0));
    let clean_judge = s.judge_prompts(0);
    assert_eq!(clean_judge.len(), 2, "the malformed output is not judged");

    let prompt = templated(family, with_system);
    // OpenRLHF decodes prompt + response with the special tokens: the query ends with the
    // template's end token. The label is a JSON string, as a dataset column of text is.
    let queries: Vec<String> = group()
        .iter()
        .map(|o| format!("{prompt}{o}{end}"))
        .collect();
    let label = Value::String(json!({"gold": gold}).to_string());
    let seen = s.stub.calls().len();
    let answers = openrlhf(&s, &prompt, &queries, &label).await;
    let got: Vec<Value> = answers.iter().map(|a| a["rewards"][0].clone()).collect();
    assert_eq!(got, want, "{family}: {answers:?}");
    for a in &answers {
        assert_eq!(
            a["extra_logs"]["care_template_parsed"],
            json!([1.0]),
            "{family}"
        );
        assert_eq!(a["extra_logs"]["care_stripped"], json!([1.0]), "{family}");
    }
    // The judge saw exactly what it saw for the clean dialogue (so the cache answers both).
    assert_eq!(s.judge_prompts(seen), clean_judge, "{family}");

    // The same prompt through the JSON API: the template is reported, the token stripped.
    let (code, v) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"prompt": prompt, "responses": [queries[0].strip_prefix(&prompt).unwrap()], "gold": gold, "meta": {"turn": 2, "emotion": "fear"}}]}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let r = &v["results"][0];
    assert_eq!(
        r["template"],
        json!({"family": family.name(), "status": "parsed"})
    );
    assert_eq!(r["responses"][0]["stripped"], json!(end.trim_start()));
    assert_eq!(r["rewards"], json!([1.0]));
    assert_eq!(r["meta"], json!({"turn": 2, "emotion": "fear"}));
}

#[tokio::test]
async fn chatml_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::ChatMl, "<|im_end|>").await;
}

#[tokio::test]
async fn llama3_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::Llama3, "<|eot_id|>").await;
}

#[tokio::test]
async fn mistral_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::Mistral, "</s>").await;
}

#[tokio::test]
async fn gemma_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::Gemma, "<end_of_turn>\n<eos>").await;
}

#[tokio::test]
async fn deepseek_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::DeepSeek, "<｜end▁of▁sentence｜>").await;
}

#[tokio::test]
async fn phi3_openrlhf_gives_the_clean_dialogues_rewards() {
    same_rewards_as_the_clean_dialogue(TemplateFamily::Phi3, "<|end|>\n<|endoftext|>").await;
}

#[tokio::test]
async fn labels_as_openrlhf_users_write_them() {
    let s = Server::start(MissingGold::Refuse).await;
    let prompt = templated(TemplateFamily::ChatMl, true);
    let q = format!("{prompt}{}<|im_end|>", output("Afraid", "score:5"));
    let gold = json!({"emotion": "fear"});
    // The dialogue and the gold in the label, as an object and as a JSON string; chat messages
    // alone (then no gold: refused below).
    for label in [
        json!({"context": clean(true), "gold": gold}),
        Value::String(json!({"context": clean(true), "gold": gold}).to_string()),
    ] {
        let (code, v) = s
            .post(
                "/get_reward",
                &json!({"query": [q], "prompts": [prompt], "labels": [label]}),
            )
            .await;
        assert_eq!((code, &v["rewards"]), (200, &json!([1.0])), "{v}");
    }
    // A tokenizer whose decode moved a space around a special token: cut all the same.
    let mistral = templated(TemplateFamily::Mistral, false);
    let spaced = mistral.replacen("<s>[INST]", "<s> [INST]", 1);
    assert_ne!(spaced, mistral);
    let q2 = format!("{spaced}{}</s>", output("Afraid", "score:5"));
    let (code, v) = s
        .post(
            "/get_reward",
            &json!({"query": [q2], "prompts": [mistral], "labels": [{"gold": gold}]}),
        )
        .await;
    assert_eq!((code, &v["rewards"]), (200, &json!([1.0])), "{v}");
    let (code, v) = s
        .post(
            "/get_reward",
            &json!({"query": ["something else"], "prompts": [mistral], "labels": [{"gold": gold}]}),
        )
        .await;
    assert_eq!(code, 400, "{v}");
    // A Kardia sample without a gold emotion: refused before any judge call, with its status.
    let before = s.stub.calls().len();
    for label in [
        Value::String(String::new()),
        clean(true),
        json!({"gold": {}}),
    ] {
        let (code, v) = s
            .post(
                "/get_reward",
                &json!({"query": [q], "prompts": [prompt], "labels": [label]}),
            )
            .await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["extra_logs"]["care_valid"], json!([0.0]), "{v}");
    }
    assert_eq!(
        s.stub.calls().len(),
        before,
        "no judge call for a turn without gold"
    );
    let (_, v) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"context": clean(true), "responses": [output("sad", "score:5")]}]}),
        )
        .await;
    let r = &v["results"][0]["responses"][0];
    assert_eq!(r["status"], "missing_gold");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gold.emotion"),
        "{r}"
    );
    // Labels that are none of the accepted forms are refused, naming the sample.
    for bad in [
        json!("sadness"),
        json!(3),
        json!({"dialogue": []}),
        json!([{"speaker": "user"}]),
    ] {
        let (code, v) = s
            .post(
                "/get_reward",
                &json!({"query": [q, q], "prompts": [prompt, prompt], "labels": [Value::Null, bad]}),
            )
            .await;
        assert_eq!(code, 400, "{v}");
        assert_eq!(v["error"]["code"], "bad_label");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("labels[1]"),
            "{v}"
        );
    }
}

#[tokio::test]
async fn a_turn_without_gold_is_scored_without_the_emotion_term_when_configured() {
    let s = Server::start(MissingGold::WithoutEmotion).await;
    let (_, v) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"context": clean(true), "responses": [output("joy", "score:5"), output("joy", "score:3")]}]}),
        )
        .await;
    // Without the term the reward is the rubric part alone: score / 5.
    assert_eq!(v["results"][0]["rewards"], json!([1.0, 0.6]), "{v}");
    let (_, v) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"context": clean(true), "responses": [output("joy", "score:5")], "gold": {"emotion": 7}}]}),
        )
        .await;
    // A gold emotion that is not a label is refused even so.
    assert_eq!(v["results"][0]["responses"][0]["status"], "missing_gold");
}

#[tokio::test]
async fn half_templated_and_nested_prompts_are_read_as_before_and_reported() {
    let s = Server::start(MissingGold::Refuse).await;
    let gold = json!({"emotion": "fear"});
    for (prompt, status, family) in [
        ("I can't breathe before exams.", "plain", Value::Null),
        (
            "<|im_start|>user\nI can't breathe <|im_start|>assistant\nok<|im_end|>\n<|im_start|>assistant\n",
            "unrecognised",
            json!("chatml"),
        ),
        (
            "<|im_start|>user\nI can't breathe",
            "unrecognised",
            json!("chatml"),
        ),
    ] {
        let response = output("fear", "score:5");
        let (code, v) = s
            .post(
                "/v1/reward",
                &json!({"turns": [{"prompt": prompt, "responses": [format!("{response}<|im_end|>")], "gold": gold}]}),
            )
            .await;
        assert_eq!(code, 200, "{v}");
        let r = &v["results"][0];
        assert_eq!(r["template"]["status"], status, "{prompt:?}: {r}");
        assert_eq!(r["template"]["family"], family, "{prompt:?}");
        assert_eq!(r["rewards"], json!([1.0]), "{prompt:?}: {r}");
        // The judge saw the prompt as one user message, as without templates.
        let last = s.stub.calls().last().unwrap().messages[0].content.clone();
        assert!(last.contains(prompt.trim()), "{last}");
    }
    // A response that is only the end token: empty after stripping, so malformed for Kardia
    // (reward 0, not judged), and the token reported.
    let judged = s.stub.calls().len();
    let (_, v) = s
        .post(
            "/v1/reward",
            &json!({"turns": [{"prompt": templated(TemplateFamily::ChatMl, true), "responses": ["<|im_end|>", "\u{1F642} <|im_end|>\n<|endoftext|>"], "gold": gold}]}),
        )
        .await;
    let r = &v["results"][0];
    assert_eq!(r["rewards"], json!([0.0, 0.0]), "{r}");
    assert_eq!(r["responses"][0]["status"], "malformed_output");
    assert_eq!(r["responses"][0]["stripped"], "<|im_end|>");
    assert_eq!(r["responses"][1]["stripped"], " <|im_end|>\n<|endoftext|>");
    assert_eq!(s.stub.calls().len(), judged);
    let (code, metrics) = (
        200,
        reqwest::get(format!("http://{}/metrics", s.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(code, 200);
    assert!(
        metrics.contains(r#"care_prompt_templates_total{family="chatml",status="unrecognised"} 2"#),
        "{metrics}"
    );
    // A meta that is not an object, or too large, is a bad turn.
    for meta in [json!("turn 3"), json!({"blob": "x".repeat(20_000)})] {
        let (code, v) = s
            .post(
                "/v1/reward",
                &json!({"turns": [{"context": clean(true), "responses": ["x"], "gold": gold, "meta": meta}]}),
            )
            .await;
        assert_eq!(code, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("meta"),
            "{v}"
        );
    }
}
