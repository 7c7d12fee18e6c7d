"""`clawrl bench learn`'s settings (DESIGN §8) and its seeds."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from clawrl.config.base import ComponentSettings, Names, RangeList, as_flag_list, flag_spelling

REPORT_SEEDS = "10-14"  # the learning benchmark's report seeds: never used for tuning (0-5 were, before issue 12)
TUNING_SEEDS = "100-104"  # its development seeds: settings are tuned on these
SEED_SETS = {"report": REPORT_SEEDS, "tuning": TUNING_SEEDS}


def parse_seeds(text: str | Iterable[int]) -> list[int]:
    """`"10-12,20"` → `[10, 11, 12, 20]`: comma-separated non-negative seeds and inclusive ranges, no repeats
    (a list of seeds, such as a `BenchConfig` field, as it is)."""
    if not isinstance(text, str):
        return list(text)
    seeds: list[int] = []
    for part in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if match is None:
            raise ValueError(f"not a seed or a range of seeds: {part!r} (expected e.g. 10-14,20)")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise ValueError(f"empty range of seeds: {part!r}")
        seeds += range(low, high + 1)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed is repeated in {text!r}")
    return seeds


def _seeds_from_text(value: Any) -> Any:
    return parse_seeds(value) if isinstance(value, str) else value


def _no_repeats(seeds: list[int] | None) -> list[int] | None:
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise ValueError("a seed is repeated")
    return seeds


# Seeds (`10-14,20` in a flag or a variable, a list in Python; written back as ranges)
Seeds = Annotated[list[int], NoDecode, BeforeValidator(_seeds_from_text), AfterValidator(_no_repeats),
                  as_flag_list(RangeList), PlainSerializer(flag_spelling)]
OptionalSeeds = Annotated[list[int] | None, NoDecode, BeforeValidator(_seeds_from_text), AfterValidator(_no_repeats),
                          as_flag_list(RangeList), PlainSerializer(flag_spelling)]


class BenchConfig(ComponentSettings):
    """`clawrl bench learn` (DESIGN §8): arms, sessions, seeds, the simulated user and the held-out set.

    Its environment variables are `CLAWRL_BENCH_<FIELD>`, so that they never change a server's
    settings (`CLAWRL_MODEL`, `CLAWRL_METHOD`) by accident.
    """

    model_config = SettingsConfigDict(env_prefix="CLAWRL_BENCH_")

    method: Literal["none", "memory", "rl", "opd", "combine", "memory_combine", "memory_then_weights", "all"] = Field(
        "all",
        description="Arm to run: `none` (control: no training), `memory` (clawrl serve --memory on: the judge's hints "
        "as notes in later system prompts), `rl`, `opd`, `combine` (clawrl serve --method ...), `memory_combine` "
        "(memory notes while --method combine trains on the turns as served), `memory_then_weights` (the notes, "
        "trained into the weights with --memory-train without-notes and retired once followed), or `all` of them.",
    )
    sessions: int = Field(36, ge=1, description="Sessions per arm and seed.")
    seeds: int = Field(3, ge=1, description="Seeds per arm (--first-seed, the next, ...).")
    first_seed: int = Field(
        0,
        ge=0,
        description="The first seed (the user's problems, held-out prompts and request seeds): seeds 0-2 are the "
        "ones the benchmark's defaults were tuned on, so compare changes on later ones too.",
    )
    seed_list: OptionalSeeds = Field(
        None,
        description="Seeds to run instead of --seeds/--first-seed: comma-separated seeds and ranges (`10-14,20`), or "
        f"a named set: `report` ({REPORT_SEEDS}, never used for tuning) or `tuning` (--tuning-seeds).",
    )
    tuning_seeds: Seeds = Field(
        parse_seeds(TUNING_SEEDS),
        description="The development seeds the trained arms' settings are tuned on (seeds and ranges, 100 and up): "
        "results.json records them, and the seeds of a run outside them as its report seeds.",
    )
    summary: Path | None = Field(
        None,
        description="Also write the run's results.json to this path (e.g. docs/results/learn.json).",
    )
    out: Path = Field(
        Path("runs/bench-learn"),
        description="Output directory: results.json, report.md, learning.png, and one run directory per arm and seed.",
    )
    persona: Literal["student", "teacher", "terse", "student-strict"] = Field(
        "student",
        description="Simulated user: `student` (every step, no bold or numbered lists), `teacher` (detailed, warm), "
        "`terse` (the result in one short sentence) or `student-strict` (the student's style and the right result).",
    )
    users: Names = Field(
        [],
        description="Two or more personas who share one server (e.g. `student,teacher,terse`): runs the multi-user "
        "benchmark instead (arms none, shared and per_user, `clawrl.sim.multi_user`); --persona and --method are then "
        "unused.",
    )
    user_arms: Names = Field(
        ["none", "shared", "per_user"],
        description="With --users: the arms to run, of `none`, `shared` and `per_user` (e.g. `shared,per_user` for a "
        "tuning sweep that needs no control).",
    )
    model: str = Field(
        "tiny-pretrained",
        description="Model the arms serve (clawrl serve --model): `tiny-pretrained` (built locally), a local "
        "directory or a hub id.",
    )
    model_seed: int = Field(0, description="Seed of the locally built model (clawrl serve --seed).")
    pretrain_styles: str = Field(
        "default",
        description="The unprompted style mix `tiny-pretrained` is pre-trained with: `default` (today's model: 70% "
        "AI-like, 14% plain, 10% warm, 6% terse answers to a question with no instruction), `balanced` (a quarter "
        "each), or weights such as `ai=0.4,plain=0.2,warm=0.2,terse=0.2`. Another mix is another model, built once "
        "into the cache under its own key, its pretrain.json recording the mix; the arms serve its directory.",
    )
    problems_per_session: int = Field(2, ge=1, description="Word problems the user asks per session.")
    heldout_prompts: int = Field(48, ge=1, description="Held-out prompts per evaluation (side turns).")
    eval_every: int = Field(
        1,
        ge=1,
        description="Evaluate the held-out set after every K-th session (besides before the first and after the "
        "last), when what answers changed since the last evaluation. 1 draws the whole curve; a larger K gives the "
        "same final score with a coarser curve, and most of a trained arm's time is its evaluations.",
    )
    max_tokens: int = Field(256, ge=16, description="max_tokens of every answer the user reads.")
    temperature: float = Field(1.0, ge=0, le=2, description="Sampling temperature of every request.")
    top_p: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Nucleus sampling top_p of every request (0.95 keeps the tiny model's long tail of unlikely "
        "tokens from garbling answers whatever their style).",
    )
    catch_up: bool = Field(
        True,
        description="Between sessions of a trained arm, the user waits until training has caught up with what was "
        "played (as a real user's pause between conversations would allow); --no-catch-up starts the next session at "
        "once, so what has been trained by then depends on the machine's speed.",
    )
    settle_s: float = Field(
        120.0,
        ge=0,
        description="How long a trained arm may take to train and serve what is due, between sessions and after the last.",
    )
    user_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint (base URL up to /v1) of a model that words the user's replies; "
        "unset: scripted replies.",
    )
    user_model: str | None = Field(None, description="Model id at --user-url that plays the user.")
    user_api_key: str | None = Field(None, description="Bearer key for --user-url, when it needs one.")
    user_wrong_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Noisy user: probability that the user reacts as if the answer's satisfaction were flipped "
        "(complains about a good answer, thanks for a bad one). The benchmark still scores the truth.",
    )
    user_quiet_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Noisy user: probability that a satisfied user says nothing about it (just asks the next "
        "question, or leaves without thanks).",
    )
    user_vague_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Noisy user: probability that a complaint does not say why (\"that's not it. try again.\"), so "
        "the rule judge finds no hint in it.",
    )
    user_move_on_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Noisy user: probability that an unsatisfied user does not complain but asks the next question "
        "(or leaves), with nothing said about the answer.",
    )
    serve_args: str = Field(
        "",
        description="Extra `clawrl serve` flags for every arm, e.g. \"--judge openai --judge-url URL --judge-model M\".",
    )

    @model_validator(mode="before")
    @classmethod
    def _named_seed_sets(cls, data: Any) -> Any:
        # `--seed-list report|tuning` stands for that set's seeds (`tuning`: --tuning-seeds, as given)
        if isinstance(data, dict) and isinstance(data.get("seed_list"), str) and data["seed_list"].strip() in SEED_SETS:
            name = data["seed_list"].strip()
            data = {**data, "seed_list": data.get("tuning_seeds", TUNING_SEEDS) if name == "tuning" else SEED_SETS[name]}
        return data

    def user_noise(self) -> dict[str, float]:
        """The noisy user's rates by `UserSession` field name: `wrong_rate`, `quiet_rate`, ..."""
        return {name.removeprefix("user_"): getattr(self, name) for name in type(self).model_fields
                if name.startswith("user_") and name.endswith("_rate")}

    def run_seeds(self) -> list[int]:
        """The seeds this run plays: --seed-list, or --seeds from --first-seed."""
        if self.seed_list is None:
            return list(range(self.first_seed, self.first_seed + self.seeds))
        return list(self.seed_list)

    @model_validator(mode="after")
    def _user_url_needs_user_model(self) -> Self:
        if self.user_url and not self.user_model:
            raise ValueError("--user-url needs --user-model (the model id at that endpoint that plays the user)")
        return self
