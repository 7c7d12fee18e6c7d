"""Pre-training the tiny model: the conversations it learns from (sim/chats.py), determinism, the cache.

Training is exercised at a toy size (a few steps of a one-layer model); whether the real
pre-trained model follows instructions is measured by benchmarks/tiny_pretrained_styles.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.judge.rule import rule_hints
from clawrl.messages import HINT_MARKER
from clawrl.sim import chats, pretrain
from clawrl.sim.answers import TERSE_MAX_WORDS, has_markup, is_warm, sentences, word_count
from clawrl.sim.chats import (
    DEFAULT_STYLES,
    HINTS,
    chat,
    default_chat,
    hint_strings_shared_with_pretraining,
    hinted_chat,
    remembered_chat,
)
from clawrl.model.notes import NOTES_HEADING
from clawrl.sim.personas import PERSONAS, STUDENT, evaluation_hints
from clawrl.sim.pretrain import PretrainConfig, content_key, encode_chat, pretrained_model_path, tiny_tokenizer, weights_digest

TOY = PretrainConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=64, steps=3, batch_size=4, warmup_steps=1, max_tokens=128, threads=1)


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 - a transformers tokenizer
    return tiny_tokenizer()


# --------------------------------------------------------------------------- the conversations


def test_hints_are_the_rule_judges_extractions_in_the_teacher_prompt_format() -> None:
    for correction in STUDENT.pretraining.corrections:
        assert set(rule_hints([{"role": "user", "content": correction}])) <= set(HINTS["student"])
    rng = random.Random(0)
    for _ in range(50):
        messages = hinted_chat(rng)
        user = messages[-2]["content"]
        question, hint = user.split(f"\n\n{HINT_MARKER} ")
        assert question and any(hint in HINTS[who] for who in HINTS), hint
        assert messages[-1]["role"] == "assistant"


def test_the_simulated_users_hints_never_appear_in_pretraining() -> None:
    assert hint_strings_shared_with_pretraining() == 0
    corpus = random.Random(4)
    said = " ".join(message["content"].lower() for _ in range(2000) for message in chat(corpus)
                    if message["role"] != "assistant")
    for persona in PERSONAS.values():
        assert evaluation_hints(persona)
        for hint in evaluation_hints(persona):
            assert hint.rstrip(".?").lower() not in said, hint


def test_the_count_of_shared_hints_sees_a_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    leaked = sorted(evaluation_hints(STUDENT))[0]
    monkeypatch.setitem(chats.HINTS, "student", [*HINTS["student"], f"{leaked} Thanks."])
    assert hint_strings_shared_with_pretraining() == 1


def _one_short_sentence(answer: str) -> bool:
    return "\n" not in answer.strip() and sentences(answer) == 1 and word_count(answer) <= TERSE_MAX_WORDS


def test_without_an_instruction_the_answer_is_mostly_ai_like() -> None:
    rng = random.Random(1)
    answers = [default_chat(rng)[-1]["content"] for _ in range(2000)]
    styled = Counter(
        "warm" if is_warm(a) else "ai" if has_markup(a) else "terse" if _one_short_sentence(a) else "plain"
        for a in answers
    )
    # formatted warm answers count as warm here, so the markup share is the "ai" share alone
    for style in ("ai", "plain", "terse"):
        assert abs(styled[style] / 2000 - DEFAULT_STYLES[style]) < 0.04, style


def test_memory_notes_are_followed() -> None:
    rng = random.Random(2)
    followed = 0
    for _ in range(200):
        messages = remembered_chat(rng)
        assert NOTES_HEADING in messages[0]["content"]
        notes = messages[0]["content"]
        answer = messages[-1]["content"]
        if any(note in notes for note in HINTS["student"]):
            followed += not has_markup(answer)
    assert followed > 60


def test_conversations_render_with_the_chat_template_and_train_on_assistant_tokens_only(tokenizer) -> None:  # noqa: ANN001
    rng = random.Random(3)
    for _ in range(30):
        messages = chat(rng)
        ids, labels = encode_chat(tokenizer, messages, max_tokens=2048)
        trained = [token for token in labels if token != -100]
        assert trained and len(trained) < len(ids)
        text = tokenizer.decode(trained)
        assert text.endswith("<|im_end|>") and messages[-1]["content"] in text
        assert "<|im_start|>user" not in text


# --------------------------------------------------------------------------- training and the cache


def test_pretraining_is_deterministic_at_a_tiny_size(tmp_path: Path) -> None:
    first = pretrain.pretrain(tmp_path / "a", seed=0, config=TOY)
    again = pretrain.pretrain(tmp_path / "b", seed=0, config=TOY)
    other = pretrain.pretrain(tmp_path / "c", seed=1, config=TOY)
    weights = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != weights
    assert first.losses == again.losses != other.losses and len(first.losses) == TOY.steps
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert model.config.hidden_size == 32 and tokenizer.eos_token == "<|im_end|>"
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_cache_key_covers_seed_config_and_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    key = content_key(0, TOY)
    assert key == content_key(0, TOY)
    assert key != content_key(1, TOY)
    assert key != content_key(0, PretrainConfig(**{**TOY.__dict__, "steps": 4}))
    monkeypatch.setattr(chats, "FOLLOW_RATE", 0.5)  # a change to how the corpus is written
    assert content_key(0, TOY) != key


def test_pretrained_model_path_builds_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    real = pretrain.pretrain

    def counting(out_dir: Path, seed: int = 0, config: PretrainConfig = TOY, progress=None):  # noqa: ANN001, ANN202
        built.append(seed)
        return real(out_dir, seed, config, progress)

    monkeypatch.setattr(pretrain, "pretrain", counting)
    path = pretrained_model_path(tmp_path, seed=0, config=TOY)
    assert path.name == f"tiny-pretrained-seed0-{content_key(0, TOY)}"
    assert pretrained_model_path(tmp_path, seed=0, config=TOY) == path
    assert built == [0]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [path.name]
    assert (path / "pretrain.json").is_file()
    # what the weights depend on beyond seed, corpus and settings, and a digest to compare builds by
    record = json.loads((path / "pretrain.json").read_text())
    assert record["build"]["torch"] == torch.__version__ and record["build"]["cpu_capability"]
    assert record["weights_sha256"] == weights_digest(path)
    again = real(tmp_path / "again", 0, TOY)
    assert again is not None and weights_digest(tmp_path / "again") == record["weights_sha256"]  # same machine, same bits


# --------------------------------------------------------------------------- another unprompted style mix


BALANCED = tuple(chats.style_mix("balanced").items())


def test_style_mixes_by_name_or_weights() -> None:
    assert chats.style_mix("default") is DEFAULT_STYLES
    assert chats.style_mix(" balanced ") == {"ai": 0.25, "plain": 0.25, "warm": 0.25, "terse": 0.25}
    assert chats.style_mix("terse=2,ai=4,plain=2,warm=2") == {"ai": 4.0, "plain": 2.0, "warm": 2.0, "terse": 2.0}
    for wrong in ("bogus", "ai=0.5,plain=0.5", "ai=1,plain=1,warm=1,terse=x", "ai=1,plain=1,warm=1,terse=-1",
                  "ai=1,ai=1,plain=1,warm=1,terse=1", "ai=0,plain=0,warm=0,terse=0", "ai=1,plain=1,warm=1,loud=1"):
        with pytest.raises(ValueError):
            chats.style_mix(wrong)


def test_the_default_mix_draws_todays_conversations() -> None:
    assert [chat(random.Random(seed)) for seed in range(20)] == \
        [chat(random.Random(seed), DEFAULT_STYLES) for seed in range(20)]
    rng = random.Random(1)
    answers = [default_chat(rng, chats.style_mix("balanced"))[-1]["content"] for _ in range(2000)]
    terse = sum(_one_short_sentence(answer) for answer in answers) / 2000
    warm = sum(is_warm(answer) for answer in answers) / 2000
    assert abs(terse - 0.25) < 0.04 and abs(warm - 0.25) < 0.05


def test_another_mix_is_another_model_and_the_default_keeps_its_identity(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    default, balanced = TOY, PretrainConfig(**{**TOY.__dict__, "styles": BALANCED})
    # today's model: the same key and record whether the default mix is left out or spelt out
    assert "styles" not in default.identity()
    assert default.identity() == {name: value for name, value in default.__dict__.items() if name != "styles"}
    spelt_out = PretrainConfig(**{**TOY.__dict__, "styles": tuple(DEFAULT_STYLES.items())})
    assert content_key(0, spelt_out) == content_key(0, default) and spelt_out.identity() == default.identity()
    assert content_key(0, balanced) != content_key(0, default)
    assert balanced.identity()["styles"] == dict(BALANCED)
    path = pretrained_model_path(tmp_path, seed=0, config=balanced)
    assert path.name == f"tiny-pretrained-seed0-{content_key(0, balanced)}"
    assert json.loads((path / "pretrain.json").read_text())["config"]["styles"] == dict(BALANCED)
    # the benchmark serves that directory under the model's name, and records the mix
    from clawrl.config import BenchConfig
    from clawrl.sim import bench
    from clawrl.sim.report import command_line

    built: list[PretrainConfig] = []
    monkeypatch.setattr(bench, "pretrained_model_path",
                        lambda cache, seed, config: built.append(config) or path)  # type: ignore[func-returns-value]
    config = BenchConfig(pretrain_styles="balanced")
    assert bench.served_model_flags(config) == ["--model", str(path), "--served-model-name", "tiny-pretrained"]
    assert built[-1].styles == BALANCED and built[-1].steps == PretrainConfig().steps
    assert bench.model_build(path)["styles"] == dict(BALANCED)
    assert command_line(config).endswith(" --pretrain-styles balanced")
    assert bench.served_model_flags(BenchConfig()) == ["--model", "tiny-pretrained"]
    assert "--pretrain-styles" not in command_line(BenchConfig())
    with pytest.raises(ValueError):
        bench.pretrain_config(BenchConfig(pretrain_styles="balanced", model="tiny"))
