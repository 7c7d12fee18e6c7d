"""The locally built tiny model: loading, long context, chat template, tokenizer, determinism, cache.

Everything downstream (the server, the engines, the trainer, the demo) treats this directory as
if it were a hub checkpoint, so these tests check it through the public ``Auto*`` classes only.
"""

from __future__ import annotations

import json
import time
import unicodedata
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from clawrl.sim import tiny
from clawrl.sim.corpus import TARGET_CHARS, build_corpus
from clawrl.sim.tiny import build_tiny_model, tiny_model_path
from tests.helpers import WEATHER_TOOL

# Odd spacing on purpose: string arguments must be rendered verbatim, not re-encoded.
STRING_ARGUMENTS = '{"city":"Lyon" }'
CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Lyon and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": STRING_ARGUMENTS}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 14}'},
    {"role": "assistant", "content": "Lyon is 14 °C. Now Oslo.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
    ]},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp_c": -3}'},
    {"role": "developer", "content": "Answer in one sentence."},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def render(tokenizer, messages: list[dict], **kwargs: object) -> str:  # noqa: ANN001
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


# --------------------------------------------------------------------------- loading and shape


def test_loads_with_auto_classes_and_runs_forward(model, tokenizer) -> None:  # noqa: ANN001
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 2_000_000
    assert len(tokenizer) == model.config.vocab_size == tiny.VOCAB_SIZE
    ids = tokenizer("Hello there!", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_config_and_generation_config(model_dir: Path, tokenizer) -> None:  # noqa: ANN001
    config = AutoConfig.from_pretrained(model_dir)
    assert config.max_position_embeddings >= 16384
    assert config.tie_word_embeddings
    im_end, end_of_text = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    generation = GenerationConfig.from_pretrained(model_dir)
    assert generation.eos_token_id == [im_end, end_of_text]
    assert generation.pad_token_id == end_of_text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.model_max_length >= 16384
    assert (model_dir / "model.safetensors").is_file()


def test_auto_tokenizer_behaves_like_the_trained_one(model_dir: Path, tokenizer) -> None:  # noqa: ANN001
    # transformers 5 rebuilds qwen2 tokenizers on load; the saved pipeline must already be that one.
    saved = json.loads((model_dir / "tokenizer.json").read_text())
    loaded = json.loads(tokenizer.backend_tokenizer.to_str())
    for part in ("normalizer", "pre_tokenizer", "decoder"):
        assert loaded[part] == saved[part], part
    trained = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for doc in build_corpus(seed=7, target_chars=5_000):
        assert tokenizer.encode(doc, add_special_tokens=False) == trained.encode(doc, add_special_tokens=False).ids


def test_forty_kilobyte_system_prompt_fits_and_runs(model, tokenizer) -> None:  # noqa: ANN001
    system = "\n".join(build_corpus(seed=3, target_chars=40_000))
    assert len(system.encode()) >= 40_000
    prompt = render(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
                    tools=[WEATHER_TOOL], add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert 5_000 < len(ids) <= model.config.max_position_embeddings
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits
    assert logits.shape == (1, 1, model.config.vocab_size)
    assert torch.isfinite(logits).all()


# --------------------------------------------------------------------------- chat template


def test_template_renders_every_role_tools_and_tool_calls(tokenizer) -> None:  # noqa: ANN001
    text = render(tokenizer, CONVERSATION, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a weather bot.\n\n")
    assert text.count("You are a weather bot.") == 1  # the system prompt moved into the tools block
    assert f"<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>" in text
    assert "<|im_start|>user\nWeather in Lyon and Oslo?<|im_end|>\n" in text
    assert ("<|im_start|>assistant\n<tool_call>\n"
            f'{{"name": "get_weather", "arguments": {STRING_ARGUMENTS}}}\n</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>assistant\nLyon is 14 °C. Now Oslo.<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n') in text
    assert '<|im_start|>tool\n{"temp_c": 14}<|im_end|>\n' in text
    assert "<|im_start|>system\nAnswer in one sentence.<|im_end|>\n" in text  # developer -> system
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_template_without_tools_is_plain_chatml(tokenizer) -> None:  # noqa: ANN001
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    assert render(tokenizer, messages) == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert render(tokenizer, messages[1:], tools=[WEATHER_TOOL]).startswith("<|im_start|>system\n# Tools\n")


def test_assistant_turn_is_exactly_the_generated_text(tokenizer) -> None:  # noqa: ANN001
    # What the model generates after the generation prompt (content, tool calls, <|im_end|>) must
    # be what the template renders when that turn is replayed in the next request.
    history, reply = CONVERSATION[:4], CONVERSATION[4]
    prompt = render(tokenizer, history, tools=[WEATHER_TOOL], add_generation_prompt=True)
    replayed = render(tokenizer, [*history, reply], tools=[WEATHER_TOOL])
    generated = ('Lyon is 14 °C. Now Oslo.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                 "</tool_call><|im_end|>")
    assert replayed == prompt + generated + "\n"


def test_template_marks_assistant_tokens(tokenizer) -> None:  # noqa: ANN001
    encoded = tokenizer.apply_chat_template(CONVERSATION[:2] + [{"role": "assistant", "content": "Sunny."}],
                                            return_dict=True, return_assistant_tokens_mask=True)
    marked = [t for t, m in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(marked) == "Sunny.<|im_end|>"


# --------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", [
    "Grüße aus Köln — 東京 🚀 مرحبا שלום",
    "  leading and trailing spaces \t\r\n\n",
    "don't STOP: 1234567890 x=3.14e-5; {\"a\": [1, 2]} <tool_call>\n</tool_call> <tools></tools>",
    "emoji sequences 👩‍💻🏳️‍🌈 and control \x00\x07\x1b[0m chars",
    "\U0001f600" * 5 + "ǅ ﬁ ① Ⅻ",
])
def test_text_round_trips_through_encode_and_decode(tokenizer, text: str) -> None:  # noqa: ANN001
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # tool markup is not special


def test_decomposed_text_comes_back_composed(tokenizer) -> None:  # noqa: ANN001
    # Qwen2's NFC normalizer (forced by transformers on load) composes "e" + U+0301 into "é".
    decomposed = unicodedata.normalize("NFD", "café")
    assert tokenizer.decode(tokenizer.encode(decomposed, add_special_tokens=False)) == "café"


def test_special_and_tool_tokens_are_single_tokens(tokenizer) -> None:  # noqa: ANN001
    tokens = [*tiny.SPECIAL_TOKENS, *tiny.TOOL_TOKENS]
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in tokens]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(tokens)
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat = tokenizer.encode("<|im_start|>user\nhi<|im_end|><tool_call>", add_special_tokens=False)
    assert tokenizer.decode(chat, skip_special_tokens=True) == "user\nhi<tool_call>"


# --------------------------------------------------------------------------- determinism and cache


def test_same_seed_gives_identical_weights_other_seed_differs(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    weights = (model_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    # One tokenizer for every seed: only the weights depend on it.
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_corpus_is_deterministic_and_has_both_styles() -> None:
    corpus = build_corpus(seed=0)
    assert corpus == build_corpus(seed=0) != build_corpus(seed=1)
    text = "".join(corpus)
    assert len(text) >= TARGET_CHARS
    for piece in ("**Final answer**:", "So the answer is", "<tool_call>\n{", "Traceback (most recent call last):",
                  "def ", "too AI-like"):
        assert piece in text, piece


def test_tiny_model_path_builds_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tiny_model_path(tmp_path, seed=2)
    assert first == tmp_path / "tiny-v2-seed2"
    assert AutoConfig.from_pretrained(first).model_type == "qwen2"
    stamp = (first / "model.safetensors").stat().st_mtime_ns

    def must_not_build(out_dir: Path, seed: int = 0) -> Path:
        raise AssertionError("the cached model was rebuilt")

    monkeypatch.setattr(tiny, "build_tiny_model", must_not_build)
    started = time.perf_counter()
    assert tiny_model_path(tmp_path, seed=2) == first
    assert time.perf_counter() - started < 0.1
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp


def test_tiny_model_path_tolerates_losing_the_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tiny-v2-seed0"

    def build_while_a_rival_finishes_first(out_dir: Path, seed: int = 0) -> Path:
        build_tiny_model(target, seed)  # the rival's finished directory appears first
        return build_tiny_model(out_dir, seed)

    monkeypatch.setattr(tiny, "build_tiny_model", build_while_a_rival_finishes_first)
    assert tiny_model_path(tmp_path, seed=0) == target
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the loser's staging copy is gone
    assert AutoTokenizer.from_pretrained(target).eos_token == "<|im_end|>"
