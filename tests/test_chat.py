"""Prompt rendering, tool-call parsing and streaming detokenization on the tiny model's real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from clawrl.messages import answer_fingerprint
from clawrl.model.chat import ResponseDecoder, parse_tool_calls, render_prompt


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def stream_text(tokenizer, text: str, stop: list[str], parse_tools: bool) -> tuple[list[str], ResponseDecoder]:  # noqa: ANN001
    decoder = ResponseDecoder(tokenizer, stop, parse_tools)
    deltas = []
    for token_id in tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]:
        if delta := decoder.extend([token_id]):
            deltas.append(delta)
        if decoder.stopped:
            break
    return deltas, decoder


def test_streamed_deltas_reassemble_the_text_including_multibyte(tokenizer) -> None:  # noqa: ANN001
    text = "Grüße aus Köln — 東京 🚀 and plain words."
    deltas, decoder = stream_text(tokenizer, text, [], parse_tools=False)
    assert "".join(deltas) == text == decoder.text
    assert len(deltas) > 3
    assert not any("\ufffd" in delta for delta in deltas)


def test_an_answer_taken_whole_decodes_to_the_same_text_as_streamed(tokenizer) -> None:  # noqa: ANN001
    """A non-streamed answer is decoded in one call (`extend` with every token): same text, same tool
    markup held back, as feeding it token by token."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for text, parse_tools in [("Grüße aus Köln — 東京 🚀", False),
                              ('Sure.<tool_call>{"name": "ls", "arguments": {}}</tool_call>', True)]:  # fmt: skip
        _, streamed = stream_text(tokenizer, text, [], parse_tools)
        whole = ResponseDecoder(tokenizer, [], parse_tools)
        released = whole.extend(tokenizer.encode(text, add_special_tokens=False) + [end])
        assert whole.text == streamed.text == text
        assert released == text[: streamed.emitted] and whole.emitted == streamed.emitted


def test_stop_string_is_never_shown_even_partially(tokenizer) -> None:  # noqa: ANN001
    deltas, decoder = stream_text(tokenizer, "first line\nEND of it", ["\nEND"], parse_tools=False)
    assert decoder.stopped
    assert "".join(deltas) == "first line" == decoder.text
    assert not any("\n" in delta for delta in deltas)


def test_tool_call_markup_is_held_back(tokenizer) -> None:  # noqa: ANN001
    text = 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    deltas, decoder = stream_text(tokenizer, text, [], parse_tools=True)
    assert "".join(deltas) == "Checking."
    content, calls = parse_tool_calls(decoder.text)
    assert content == "Checking."
    assert calls[0]["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Lyon"})}


def test_malformed_tool_call_stays_text() -> None:
    text = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(text) == (text, [])
    assert parse_tool_calls("<tool_call>[1, 2]</tool_call>") == ("<tool_call>[1, 2]</tool_call>", [])


def test_several_tool_calls() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "" and [c["function"]["name"] for c in calls] == ["a", "b"]
    assert len({c["id"] for c in calls}) == 2


def test_rendered_prompt_ends_with_the_generation_prompt(tokenizer) -> None:  # noqa: ANN001
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    ids = render_prompt(tokenizer, messages, None)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert "hi" in tokenizer.decode(ids)


def test_fingerprint_ignores_whitespace_call_ids_and_argument_formatting() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}
    echoed = {"id": "other", "type": "function", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}
    assert answer_fingerprint(" text\n", [call]) == answer_fingerprint("text", [echoed])
    assert answer_fingerprint("text", [call]) != answer_fingerprint("text", None)
    assert answer_fingerprint("   ", None) is None
