"""The judge loop's settings (DESIGN §5): which backend scores turns, and how the worker paces itself."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from clawrl.config.base import ComponentSettings


class JudgeConfig(ComponentSettings):
    """The judge loop (DESIGN §5): which backend scores turns, and how the worker paces itself."""

    judge: Literal["auto", "rule", "openai", "engine", "engine+rule", "off"] = Field(
        "auto",
        description="Judge backend: `auto` (the default: the served model judges its own turns, as `engine`, "
        "unless it is one of the tiny models, which get `rule`; with --judge-url and --judge-model, `openai`; "
        "with --judge-model alone, `engine` on that model), `rule` (the offline judge: rules, a lexicon and a "
        "small classifier trained on a labelled corpus of replies), "
        "`openai` (a language model behind any OpenAI-compatible endpoint: --judge-url, --judge-model), "
        "`engine` (the serving model itself, or a second local model named by --judge-model), "
        "`engine+rule` (the engine's votes with the offline judge's score as one more vote) or "
        "`off` (record only; run `clawrl judge` elsewhere).",
    )
    judge_concurrency: int = Field(4, ge=1, description="Turns judged at the same time per worker.")
    judge_timeout_s: float = Field(60.0, gt=0, description="Limit on judging one turn; then it is retried.")
    judge_lease_s: float = Field(
        300.0,
        gt=0,
        description="How long a claimed turn stays reserved for its worker; a killed worker's turns are retried after it.",
    )
    judge_poll_s: float = Field(0.5, gt=0, description="Pause between looks for new turns when idle.")
    judge_url: str | None = Field(
        None,
        description="Base URL of the OpenAI-compatible judge endpoint, up to `/v1` (needed by --judge openai).",
    )
    judge_model: str | None = Field(
        None,
        description="With --judge openai: the model id the endpoint serves (required). With --judge engine: a local "
        "model directory or hub id to judge with instead of the serving model. Stored with each judgment.",
    )
    judge_api_key: str | None = Field(
        None, description="Sent as `Authorization: Bearer <key>` to the judge endpoint when set."
    )
    prm_m: int = Field(
        3,
        ge=1,
        description="PRM votes (and hint-judge samples) per turn, run concurrently; the majority wins, a tie is 0 "
        "(3, as upstream: one sampled vote is noisy). The rule judge is deterministic and ignores it; "
        "`engine+rule` adds its score as vote m + 1.",
    )
    judge_temperature: float = Field(
        0.6,
        ge=0,
        description="Sampling temperature of the judge calls; above 0 so that several votes can disagree.",
    )
    judge_max_tokens: int = Field(
        512, ge=1, description="Response limit of one judge call: room for the reasoning before the boxed score."
    )
    judge_retries: int = Field(
        4,
        ge=1,
        description="Attempts per judge call on transport errors, timeouts and 5xx (back-off 0.2 s, 0.4 s, ...); "
        "4xx is never retried.",
    )
    judge_max_attempts: int = Field(
        5,
        ge=1,
        description="Claims of one turn before judging it is given up (a turn whose judge prompt can never work, "
        "say); such a turn stays unjudged and untrained, and the worker moves on.",
    )
    hint_top_k: int = Field(
        4,
        ge=1,
        description="k of overlap-guided hint selection: top-k tokens per response position compared between the "
        "student prompt and each hinted teacher prompt.",
    )
    judge_actors: int = Field(
        0,
        ge=0,
        description="With --placement ray: judge workers run as this many Ray actors, each its own `clawrl judge` "
        "(its store connection, its backend, leases so that no turn is judged twice), supervised and restarted "
        "by the server. 0 (the default): the judge runs in the server process, where the served model can judge "
        "(`--judge engine`) and pick hints by overlap; an actor has no served model.",
    )
    judge_cpus: float = Field(
        1.0,
        gt=0,
        description="With --judge-actors: CPUs Ray reserves for each judge actor (1: the offline judge's rules and "
        "classifier run on one core at a time; an endpoint judge mostly waits).",
    )
    judge_gpus: float = Field(
        0.0,
        ge=0,
        description="With --judge-actors: GPUs for each judge actor (1 for `--judge engine --judge-model` on a GPU "
        "cluster: each actor then loads the judge model on its own GPU).",
    )
    judge_call_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Limit on one judge call; a call that runs past it is retried (--judge-timeout-s bounds the turn).",
    )

    @model_validator(mode="after")
    def _openai_needs_an_endpoint(self) -> Self:
        if self.judge == "openai" and not (self.judge_url and self.judge_model):
            missing = [flag for flag, value in (("--judge-url", self.judge_url), ("--judge-model", self.judge_model)) if not value]
            raise ValueError(f"--judge openai needs --judge-url and --judge-model (missing: {', '.join(missing)})")
        return self

