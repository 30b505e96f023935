"""Chat templates from Python: the core's one table of families, read and stripped in-process as
``care serve`` does it (the Rust tests hold the per-model fixtures; these check the binding)."""

from __future__ import annotations

import pytest

import care_rl
from care_rl import CareError

QWEN = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nI feel lost.<|im_end|>\n<|im_start|>assistant\n"
)


def test_families_are_the_cores():
    assert care_rl.TEMPLATE_FAMILIES == ["chatml", "llama3", "mistral", "gemma", "deepseek", "phi3"]


def test_read_prompt():
    family, messages = care_rl.read_prompt(QWEN)
    assert family == "chatml"
    assert messages == [
        ("system", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
        ("user", "I feel lost."),
    ]
    gemma = "<bos><start_of_turn>user\n你好 🙂<end_of_turn>\n<start_of_turn>model\n"
    assert care_rl.read_prompt(gemma, template="gemma") == ("gemma", [("user", "你好 🙂")])
    # Not templated, or templates off: one user message.
    assert care_rl.read_prompt("I feel lost.") == (None, [("user", "I feel lost.")])
    assert care_rl.read_prompt(QWEN, template="none") == (None, [("user", QWEN)])


def test_read_prompt_refuses_half_templated_prompts_and_bad_names():
    with pytest.raises(CareError) as e:
        care_rl.read_prompt("<|im_start|>user\nhi <|im_start|>assistant\nx<|im_end|>")
    assert e.value.code == "invalid_argument"
    assert "template_mismatch" in str(e.value) and "byte 20" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.read_prompt("x" * ((1 << 20) + 1), template="chatml")
    assert e.value.code == "capacity"
    with pytest.raises(CareError, match="template=\"qwen\""):
        care_rl.read_prompt(QWEN, template="qwen")


def test_strip_end_tokens():
    assert care_rl.strip_end_tokens("I hear you.<|im_end|>") == ("I hear you.", "<|im_end|>")
    assert care_rl.strip_end_tokens("I hear you.</s>", template="chatml") == ("I hear you.</s>", "")
    assert care_rl.strip_end_tokens("<|eot_id|>", template="llama3") == ("", "<|eot_id|>")
    assert care_rl.strip_end_tokens("ok [END]", template="none", extra=["[END]"]) == ("ok", " [END]")
    assert care_rl.strip_end_tokens("a<|im_end|>b") == ("a<|im_end|>b", "")
    with pytest.raises(CareError) as e:
        care_rl.strip_end_tokens("x", extra=[" "])
    assert e.value.code == "invalid_argument" and "bad_end_suffix" in str(e.value)
