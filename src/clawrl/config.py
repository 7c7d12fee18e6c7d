"""Configuration: one pydantic-settings object per component.

Every field is documented, has a default that works, and can be overridden by an environment
variable `CLAWRL_<FIELD>` or a `clawrl` flag `--<field-with-dashes>` (flags win over the
environment). A few upstream (OpenClaw-RL) variable names are accepted as aliases so its users can
switch without renaming their deployment's environment.

Settings that only make sense together are checked here, by validators on the settings classes, so
that a bad combination is refused when the settings are read, whichever command reads them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _with_upstream(name: str, *upstream: str) -> AliasChoices:
    """`CLAWRL_<NAME>` first, then upstream's names for the same setting.

    pydantic-settings does not put `env_prefix` in front of an alias, so a field with upstream
    names has to list its own `CLAWRL_` name too; keyword construction still uses the field name
    (`populate_by_name`).
    """
    return AliasChoices(f"CLAWRL_{name.upper()}", *upstream)


class _Settings(BaseSettings):
    # `env_prefix` gives every field its `CLAWRL_<FIELD>` variable (case-insensitive).
    model_config = SettingsConfigDict(env_prefix="CLAWRL_", populate_by_name=True, extra="ignore")


def describe_settings_error(config: type[BaseSettings], error: ValidationError) -> str:
    """One line for the `clawrl` user: each problem with the flag and the variables that set it."""
    problems = []
    for item in error.errors(include_url=False):
        if not item["loc"]:  # a cross-field validator: its message already names the flags
            problems.append(str(item["ctx"]["error"]) if "ctx" in item else item["msg"])
            continue
        problems.append(f"{_setting_names(config, str(item['loc'][0]))}: {item['msg']} (got {item['input']!r})")
    return "; ".join(problems)


def _setting_names(config: type[BaseSettings], where: str) -> str:
    """`--flag (VARIABLE)` of the field that an error's location names.

    pydantic reports a value read through an alias under the first alias, whichever one the user
    set (`CLAWRL_PORT` for `PORT=abc`), so an aliased field lists all of its variables.
    """
    for name, info in config.model_fields.items():
        aliases = info.validation_alias.choices if isinstance(info.validation_alias, AliasChoices) else []
        if where == name or where in aliases:
            variables = aliases or [f"{config.model_config.get('env_prefix', '')}{name.upper()}"]
            return f"--{name.replace('_', '-')} ({' or '.join(map(str, variables))})"
    return where


class EngineConfig(_Settings):
    """The model runtime that serves requests (DESIGN §7)."""

    model: str = Field(
        "tiny",
        description="Model to serve: a local Hugging Face directory, a hub id, or `tiny` for the "
        "locally built tiny model (cached under --cache-dir).",
    )
    engine: Literal["hf", "vllm", "openai"] = Field(
        "hf",
        description="Engine kind: `hf` (transformers in this process), `vllm` (a vLLM server that clawrl starts "
        "from --vllm-python and drives with token ids), or `openai` (an OpenAI-compatible server at --engine-url "
        "that takes token-id prompts and returns token ids and log-probs, e.g. a vLLM you run).",
    )
    engine_url: str | None = Field(
        None, description="With --engine openai: the server's base URL, e.g. http://127.0.0.1:8000/v1."
    )
    engine_api_key: str | None = Field(None, description="With --engine openai: a bearer key for --engine-url.")
    engine_timeout_s: float = Field(
        600.0, gt=0, description="With --engine vllm|openai: the longest one call to the server may take."
    )
    vllm_python: Path | None = Field(
        None,
        description="With --engine vllm: the Python of the environment vLLM is installed in; unset: .venv-vllm "
        "in the current directory or beside clawrl's source (what `make test` creates).",
    )
    max_lora_rank: int = Field(
        64, ge=1, description="With --engine vllm: the largest LoRA rank the server accepts (vLLM reserves room for it)."
    )
    max_loras: int = Field(
        4, ge=2, description="With --engine vllm: LoRA versions loaded at once (the current one and those still in use)."
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="With --engine vllm on a CPU: memory for its KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    vllm_args: str = Field(
        "", description="With --engine vllm: more arguments for vLLM's server, as on its command line (e.g. "
        "`--gpu-memory-utilization 0.5`)."
    )
    vllm_start_timeout_s: float = Field(
        600.0, gt=0, description="With --engine vllm: how long the server may take to load before clawrl gives up."
    )
    device: str = Field("auto", description="`auto` (CUDA when present), `cpu` or `cuda[:N]`.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; `auto` is float32 on CPU and bfloat16 on CUDA."
    )
    max_batch_size: int = Field(32, ge=1, description="Most sequences decoded in one batch.")
    prefix_cache_gib: float = Field(
        1.0, ge=0, description="With --engine hf: memory for the KV of recent prompts, so that a prompt starting like "
        "one of them (an agent's next turn) prefills only the rest; per policy version; 0 turns it off. (vLLM has "
        "its own prefix caching.)"
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads when running on the CPU (process-wide; with --engine vllm, the OpenMP "
        "threads of vLLM's CPU worker); unset keeps torch's default. Tiny models run fastest with 1: their "
        "matrices are too small to split.",
    )
    max_context_tokens: int | None = Field(
        None, ge=16, description="Prompt plus response limit; defaults to the model's max_position_embeddings."
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "clawrl", description="Where locally built models (the tiny model) are cached."
    )
    seed: int = Field(0, description="Seed of the tiny model when --model tiny.")
    share_weights: bool = Field(
        True,
        description="On a CPU, the server and the trainer map one copy of the base weights (the page cache keeps "
        "it once); weights stored in another dtype than served are converted once into --cache-dir for that. "
        "Off: each process converts and holds its own copy (docs/sizing.md).",
    )


class StoreConfig(_Settings):
    """The durable trajectory store (DESIGN §2, loop 2)."""

    run_dir: Path = Field(
        Path("runs/default"),
        description="Directory of this run: the database, policy versions and checkpoints live here.",
    )
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; defaults to SQLite at RUN_DIR/clawrl.db."
    )

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.run_dir / 'clawrl.db').resolve()}"


class ServeConfig(_Settings):
    """The OpenAI-compatible HTTP server (DESIGN §3)."""

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(30000, ge=0, le=65535, validation_alias=_with_upstream("port", "PORT"), description="TCP port.")
    api_key: str | None = Field(
        None,
        validation_alias=_with_upstream("api_key", "SGLANG_API_KEY"),
        description="When set, every /v1 request needs `Authorization: Bearer <key>`.",
    )
    served_model_name: str | None = Field(
        None,
        validation_alias=_with_upstream("served_model_name", "SERVED_MODEL_NAME"),
        description="Model id clients use; defaults to the --model value.",
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
    keep_alive_s: float = Field(
        75.0, gt=0, description="How long an idle keep-alive connection stays open. Longer than clients keep theirs "
        "(httpx and the openai SDK: 5 s), so that a client never writes a request into a connection the server is "
        "closing at that moment (the request would be lost unread)."
    )
    default_max_tokens: int = Field(512, ge=1, description="Response limit when a request sets none.")
    session_idle_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="A session with no request for this long is closed; its last turn gets no next state.",
    )
    episode_idle_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A registered episode with no request and no result for this long is ended as failed (its "
        "rollout client is gone), so that the rest of its group can train.",
    )
    side_turn_system_regex: str | None = Field(
        None,
        description="Requests whose system prompt matches this regex are side turns (served, never trained on), "
        "besides known agents' housekeeping requests, which always are (OpenClaw's memory flush and compaction "
        "summaries: serve/sessions.py KNOWN_SIDE_SYSTEM_PROMPTS).",
    )
    policy_poll_s: float = Field(
        0.25,
        gt=0,
        description="How often serving looks in the store for a newly published (or rolled back) policy version.",
    )
    dashboard: bool = Field(
        True,
        description="Serve the dashboard at /dashboard: sessions, verdicts, samples, policy versions and the live "
        "score, read from the store (protected by --api-key when one is set).",
    )

    @field_validator("side_turn_system_regex")
    @classmethod
    def _a_valid_regex(cls, pattern: str | None) -> str | None:
        # refused here, when the settings are read, not by the first request that would use it
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"not a regular expression: {error}") from None
        return pattern


class DashboardConfig(_Settings):
    """`clawrl dashboard`: the dashboard alone, over a run's store, while the loops run elsewhere."""

    dashboard_host: str = Field("127.0.0.1", description="Interface to listen on.")
    dashboard_port: int = Field(30080, ge=0, le=65535, description="TCP port of the dashboard.")
    api_key: str | None = Field(
        None,
        validation_alias=_with_upstream("api_key", "SGLANG_API_KEY"),
        description="When set, the dashboard needs it: as a Bearer token or as the HTTP Basic password (any user).",
    )


class BackgroundConfig(_Settings):
    """How the trainer and the standalone judge give way to serving on a shared machine.

    Serving answers people; training and judging can wait a few milliseconds. So the background
    processes run at a lower CPU priority, on their own cores where the machine has them, with
    few enough threads that they and serving do not oversubscribe the cores.
    """

    background_nice: int = Field(
        10, ge=0, le=19, description="How much lower the trainer's and the standalone judge's CPU priority is than "
        "serving's (a nice increment: 0 = the same, 19 = only idle time when serving is busy)."
    )
    background_cpus: str = Field(
        "auto", description="CPUs the trainer and the standalone judge may run on: a list such as `3`, `2-3` or "
        "`0,2`; `auto` = the upper half of the CPUs this process may use (all of them when it may use one); `all`."
    )
    background_threads: int | None = Field(
        None, ge=1, description="torch threads of the trainer and the standalone judge; unset: --cpu-threads when "
        "given, else one per CPU of --background-cpus when those are not all of the machine's, else half of them "
        "(at least 1): never more busy threads than the cores they may use."
    )

    @field_validator("background_cpus")
    @classmethod
    def _usable_cpus(cls, value: str) -> str:
        # checked where the setting is read, so `clawrl serve` refuses it before its trainer child would
        available = os.sched_getaffinity(0)
        if value not in ("auto", "all") and not parse_cpu_list(value) & available:
            usable = ",".join(map(str, sorted(available)))
            raise ValueError(f"names no CPU this process may use (it may use {usable})")
        return value


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs a list such as `0,2-3` names (ValueError for anything else)."""
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\s*-\s*(\d+))?\s*", part)
        if match is None or int(match[2] or match[1]) < int(match[1]):
            raise ValueError(f"not a CPU or a range of CPUs: {part!r} (expected e.g. 1 or 2-3 or 0,2)")
        cpus.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return cpus


class JudgeConfig(_Settings):
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


# How a batch's per-token losses are summed into one (`clawrl.train.losses.sequence_weights`).
LossAggregation = Literal["token-mean", "seq-mean", "constant"]


class LossConfig(_Settings):
    """The training objective (DESIGN §6): method, PPO clip, KL, entropy, OPD and off-policy knobs.

    `train/update.py` consumes it; it lives here, with no torch import, so that every knob is also a
    `clawrl train` / `clawrl serve` flag through `TrainConfig`, which extends it.
    """

    method: Literal["rl", "opd", "combine"] = Field(
        "combine",
        description="Training signal: `rl` (advantage = reward), `opd` (advantage = clipped teacher-minus-policy "
        "log-prob) or `combine` (w_rl * reward + w_opd * teacher term). A sample without teacher log-probs "
        "contributes the RL term only, whatever the method.",
    )
    eps_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below: the ratio is floored at 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0, description="PPO clip above: the ratio is capped at 1 + eps_high.")
    kl_beta: float = Field(
        0.0,
        ge=0,
        description="Weight of the k3 KL to the reference policy (the adapter-free base for LoRA, the frozen "
        "starting weights for full fine-tuning); 0 skips the reference forward pass entirely.",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus (subtracted from the loss).")
    opd_clip: float = Field(1.0, gt=0, description="C in the OPD advantage clip(log pi_T - log pi_old, -C, C).")
    w_rl: float = Field(1.0, description="Weight of the reward term in the advantage.")
    w_opd: float = Field(1.0, description="Weight of the teacher term (OPD advantage or top-K reverse KL).")
    is_cap: float = Field(
        2.0,
        gt=0,
        description="Cap of the per-token importance weight min(pi_old / pi_behaviour, cap) for off-policy samples.",
    )
    opd_topk: int = Field(
        0,
        ge=0,
        description="With K > 0, keep the teacher's top-K tokens per position and train OPD with the top-K reverse "
        "KL (K + 1 bins) instead of the sampled-token advantage; 0 is off.",
    )
    loss_agg: LossAggregation = Field(
        "token-mean",
        description="How the per-token losses of a batch are summed into one: `token-mean` (every response token of the "
        "batch weighs the same: divided by the batch's token count), `seq-mean` (mean over each response, then over "
        "the responses: every response weighs the same, upstream slime's default) or `constant` (sum over each "
        "response divided by the constant --loss-agg-tokens, then mean over the responses: Dr. GRPO's length-unbiased "
        "sum). Every loss term and statistic is aggregated the same way.",
    )
    loss_agg_tokens: int = Field(
        512,
        ge=1,
        description="C of --loss-agg constant: the fixed normaliser of each response's token sum, best the response "
        "limit the agent asks for (512 is clawrl serve's --default-max-tokens). It only scales the loss and gradient "
        "(AdamW nearly undoes the scale; --grad-clip does not).",
    )


class TrainConfig(LossConfig):
    """The trainer loop (DESIGN §6): which update, on which parameters, how often, and how it publishes.

    `clawrl serve --method ...` starts the trainer as a separate process with these settings;
    `clawrl train` runs it alone.
    """

    method: Literal["rl", "opd", "combine"] | None = Field(
        None,
        description="Update: `rl` (binary reward, A = r), `opd` (on-policy distillation from the hinted teacher) or "
        "`combine` (both). On `clawrl serve`, unset means no trainer; `clawrl train` uses `combine` when unset.",
    )
    batch_size: int = Field(16, ge=1, description="Samples per optimizer step; a step fires when this many are ready.")
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Passes over each batch, one optimizer step per mini-batch in each. 1 (one step per batch) takes "
        "pi_old from the step's own forward pass, so the PPO ratio is 1 and --eps-low/--eps-high never act; above 1 "
        "(or with --mini-batches above 1), pi_old is computed in one extra no-grad pass before the first step and the "
        "clip bounds how far the later steps move each token. Each pass costs about a whole step more.",
    )
    mini_batches: int = Field(
        1,
        ge=1,
        description="Parts each batch is cut into, in its order, for one optimizer step each per pass (--ppo-epochs); "
        "each part's loss is normalised as a batch of its own (--loss-agg over its tokens). 1: the whole batch; more "
        "than the batch's samples: one sample each.",
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Samples per forward/backward pass (gradients are accumulated over the batch): bounds the memory.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="When set, a micro-batch also ends before its packed size (rows x (longest prompt + longest "
        "response), padding included) would pass this many tokens: bounds activations for long agent prompts, "
        "which a sample count does not. A single longer sample still trains, alone.",
    )
    share_prefix: bool = Field(
        True,
        description="Examples of a micro-batch whose prompts share a prefix (a session's turns, a group's rollouts, "
        "one system prompt) compute it once and attend to its keys and values (a prefix tree: a session's turns "
        "share the system prompt, consecutive turns share more): exact up to rounding, and each shared prefix costs "
        "once instead of once per example.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Keep only each decoder layer's input in the forward pass and recompute the layer in the backward "
        "pass: activations of one layer at a time instead of all of them, for a third more compute. For a single "
        "prompt longer than memory allows; it turns prefix sharing off (transformers drops the cache that carries "
        "a prefix into a checkpointed layer).",
    )
    logit_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Response positions whose vocabulary-sized logits exist at once in an update, forward and backward "
        "(recomputed per chunk in the backward pass): bounds the output layer's memory to chunk x vocabulary floats.",
    )
    lr: float | None = Field(None, gt=0, description="AdamW learning rate; unset: 1e-4 with LoRA, 1e-5 with --full.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip per step.")
    full: bool = Field(
        False,
        description="Fine-tune every weight instead of a LoRA adapter (publishes full weights; needs a second copy "
        "of the model in memory for the frozen teacher/reference).",
    )
    lora_rank: int = Field(16, ge=1, description="LoRA rank r.")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale alpha / r).")
    lora_target_modules: str = Field(
        "all-linear",
        description="Modules that get LoRA adapters: `all-linear` (every linear projection except the output head) "
        "or a comma-separated list of module names such as `q_proj,v_proj`.",
    )
    teacher: Literal["base", "policy"] = Field(
        "base",
        description="OPD teacher: `base` (the frozen starting weights) or `policy` (the trainer's current weights), "
        "each given the hint; its log-probs of the recorded response are computed when the sample is built.",
    )
    max_staleness: int = Field(
        8,
        ge=0,
        description="Drop a sample when more than this many versions were published since the version that produced it.",
    )
    reward_baseline_samples: int = Field(
        0,
        ge=0,
        description="Centre each judged turn's reward on the mean of the judge's last N scores of earlier chat turns "
        "(a REINFORCE baseline): r - mean(last N), 0 if none yet. With raw +1/-1 rewards every token of an answer, "
        "the question's numbers included, is pushed the same way, so a run of mostly complaints (or mostly praise) "
        "moves what all answers share, not only what the judge liked; centring cancels that common part. 0 is off "
        "(the raw score, as upstream). Episode samples are group-normalised already and never centred.",
    )
    train_seed: int = Field(0, description="Seed of the trainer (LoRA initialisation, any sampling).")
    tensorboard: bool = Field(False, description="Write TensorBoard event files to RUN_DIR/tensorboard/.")
    train_poll_s: float = Field(1.0, gt=0, description="Pause between looks for new judged turns when idle.")
    episode_gamma: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Discount of an episode's outcome by distance from its end: step t of T gets outcome * gamma^(T-1-t) "
        "(plus the judge term) before group normalisation.",
    )
    step_judge_coef: float = Field(
        0.3,
        ge=0,
        description="Weight of the judge's score (+1, -1, 0) of each episode step in its step reward. Above 0, an "
        "episode group's samples wait until its steps are judged; 0 trains on the outcome alone and waits for no "
        "judge (use it with --judge off). The rule judge pays any step whose tool worked, so on terminal-like tasks it "
        "pays exploration as much as progress (an `ls`, a key press on a page): use 0 there (docs/environments.md, "
        "'Which step reward to use').",
    )

    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (1e-5 if self.full else 1e-4)


REPORT_SEEDS = "10-14"  # the learning benchmark's report seeds: never used for tuning (0-5 were, before issue 12)
TUNING_SEEDS = "100-104"  # its development seeds: settings are tuned on these
SEED_SETS = {"report": REPORT_SEEDS, "tuning": TUNING_SEEDS}


def parse_seeds(text: str) -> list[int]:
    """`"10-12,20"` → `[10, 11, 12, 20]`: comma-separated non-negative seeds and inclusive ranges, no repeats."""
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


class BenchConfig(_Settings):
    """`clawrl bench learn` (DESIGN §8): arms, sessions, seeds, the simulated user and the held-out set.

    Its environment variables are `CLAWRL_BENCH_<FIELD>`, so that they never change a server's
    settings (`CLAWRL_MODEL`, `CLAWRL_METHOD`) by accident.
    """

    model_config = SettingsConfigDict(env_prefix="CLAWRL_BENCH_")

    method: Literal["none", "memory", "rl", "opd", "combine", "memory_combine", "all"] = Field(
        "all",
        description="Arm to run: `none` (control: no training), `memory` (past hints in the system prompt), `rl`, "
        "`opd`, `combine` (clawrl serve --method ...), `memory_combine` (memory notes in the prompt while --method "
        "combine trains), or `all` of them.",
    )
    sessions: int = Field(36, ge=1, description="Sessions per arm and seed.")
    seeds: int = Field(3, ge=1, description="Seeds per arm (--first-seed, the next, ...).")
    first_seed: int = Field(
        0,
        ge=0,
        description="The first seed (the user's problems, held-out prompts and request seeds): seeds 0-2 are the "
        "ones the benchmark's defaults were tuned on, so compare changes on later ones too.",
    )
    seed_list: str | None = Field(
        None,
        description="Seeds to run instead of --seeds/--first-seed: comma-separated seeds and ranges (`10-14,20`), or "
        f"a named set: `report` ({REPORT_SEEDS}, never used for tuning) or `tuning` (--tuning-seeds).",
    )
    tuning_seeds: str = Field(
        TUNING_SEEDS,
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
    persona: Literal["student", "teacher", "student-strict"] = Field(
        "student",
        description="Simulated user: `student` (every step, no bold or numbered lists), `teacher` (detailed, warm) "
        "or `student-strict` (the student's style and the right result).",
    )
    model: str = Field(
        "tiny-pretrained",
        description="Model the arms serve (clawrl serve --model): `tiny-pretrained` (built locally), a local "
        "directory or a hub id.",
    )
    model_seed: int = Field(0, description="Seed of the locally built model (clawrl serve --seed).")
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

    @field_validator("seed_list", "tuning_seeds")
    @classmethod
    def _seeds_parse(cls, value: str | None) -> str | None:
        if value is not None and value not in SEED_SETS:
            parse_seeds(value)
        return value

    def user_noise(self) -> dict[str, float]:
        """The noisy user's rates by `UserSession` field name: `wrong_rate`, `quiet_rate`, ..."""
        return {name.removeprefix("user_"): getattr(self, name) for name in type(self).model_fields
                if name.startswith("user_") and name.endswith("_rate")}

    def run_seeds(self) -> list[int]:
        """The seeds this run plays: --seed-list, or --seeds from --first-seed."""
        if self.seed_list is None:
            return list(range(self.first_seed, self.first_seed + self.seeds))
        return parse_seeds(self.tuning_seeds if self.seed_list == "tuning" else SEED_SETS.get(self.seed_list, self.seed_list))

    @model_validator(mode="after")
    def _user_url_needs_user_model(self) -> Self:
        if self.user_url and not self.user_model:
            raise ValueError("--user-url needs --user-model (the model id at that endpoint that plays the user)")
        return self


class EnvConfig(_Settings):
    """The general-agent environments (DESIGN §9): which one, and how its episodes run.

    Its environment variables are `CLAWRL_ENV_<FIELD>`, apart from the server's and the bench's.
    """

    model_config = SettingsConfigDict(env_prefix="CLAWRL_ENV_")

    env: str = Field("toolcall", description="Environment to run: `toolcall`, `terminal`, `swe` or `web` (`clawrl envs list`).")
    max_steps: int = Field(
        8, ge=1, description="Actions per episode; the episode ends (and is scored) at the limit."
    )
    tool_output_chars: int = Field(
        2000, ge=100, description="A tool's answer longer than this keeps its head and tail (errors are at the end)."
    )
    command_timeout_s: float = Field(
        20.0, gt=0, description="Wall-clock limit of one tool command in the sandbox; the command is killed after it."
    )
    toolcall_train_problems: int = Field(500, ge=1, description="Problems in the tool-call family's train split.")
    toolcall_eval_problems: int = Field(100, ge=1, description="Problems in the tool-call family's eval split.")
    toolcall_kinds: str = Field(
        "arithmetic,number_theory,units,word",
        description="Comma-separated kinds of tool-call problems the splits draw from (a micro split: e.g. `arithmetic`).",
    )
    toolcall_levels: str = Field("1,2,3", description="Comma-separated difficulty levels (1-3) the tool-call splits draw from.")
    terminal_tasks_dir: Path | None = Field(
        None,
        description="A directory of terminal task folders (Harbor layout); unset: the built-in generated tasks, "
        "written once under --cache-dir.",
    )
    terminal_seed: int = Field(0, ge=0, description="Seed of the built-in terminal task generator.")
    terminal_task_prefixes: str = Field(
        "",
        description="Comma-separated task-id prefixes: only tasks whose folder name starts with one are used (a micro "
        "split, e.g. `files-mkdir_write,permissions`); empty: every task.",
    )
    swe_instances: Path | None = Field(
        None,
        description="A JSON Lines file of SWE instances in SWE-bench's schema whose repositories are local git "
        "directories (--swe-repos-dir); unset: the built-in generated instances, written once under --cache-dir.",
    )
    swe_repos_dir: Path | None = Field(
        None,
        description="Directory of the SWE instances' repositories, one git directory per repo, named owner__name; "
        "unset: `repos/` beside --swe-instances.",
    )
    swe_seed: int = Field(0, ge=0, description="Seed of the built-in SWE instance generator.")
    swe_kinds: str = Field(
        "",
        description="Comma-separated bug kinds of the built-in SWE instances (operator, comparison, boolean, constant, "
        "condition, removal): a micro split; empty: every kind.",
    )
    swe_libraries: str = Field(
        "",
        description="Comma-separated built-in SWE libraries (datehelp, intervals, stackcalc, statkit, textkit, "
        "unitconv): a micro split; empty: all of them.",
    )
    web_families: str = Field(
        "",
        description="Comma-separated web task families (e.g. `click-button,enter-text,shipping`; `clawrl envs list` "
        "counts them): a micro split; empty: every family.",
    )
    web_screenshots: bool = Field(
        False, description="Offer the web family's `screenshot` tool (the page as a PNG data URL) besides the text."
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "clawrl",
        description="Where generated tasks and the web pages are written (once per generator seed or version).",
    )


    @field_validator("toolcall_kinds", "toolcall_levels", "terminal_task_prefixes", "swe_kinds", "swe_libraries", "web_families")
    @classmethod
    def _comma_list(cls, value: str) -> str:
        items = [item.strip() for item in value.split(",") if item.strip()]
        if any(not re.fullmatch(r"[\w.-]+", item) for item in items):
            raise ValueError(f"expected comma-separated names, e.g. a,b: {value!r}")
        return ",".join(items)

    def toolcall_kind_list(self) -> list[str]:
        return [kind for kind in self.toolcall_kinds.split(",") if kind]

    def toolcall_level_list(self) -> list[int]:
        levels = [level for level in self.toolcall_levels.split(",") if level]
        if not all(level.isdigit() for level in levels):
            raise ValueError(f"--toolcall-levels takes numbers, e.g. 1,2: {self.toolcall_levels!r}")
        return [int(level) for level in levels]

    def terminal_prefix_list(self) -> list[str]:
        return [prefix for prefix in self.terminal_task_prefixes.split(",") if prefix]

    def swe_kind_list(self) -> list[str]:
        return [kind for kind in self.swe_kinds.split(",") if kind]

    def swe_library_list(self) -> list[str]:
        return [library for library in self.swe_libraries.split(",") if library]

    def web_family_list(self) -> list[str]:
        return [family for family in self.web_families.split(",") if family]


class RolloutConfig(_Settings):
    """`clawrl rollout`: episodes drawn from a split, in groups per task, some at a time."""

    model_config = SettingsConfigDict(env_prefix="CLAWRL_ROLLOUT_")

    policy: Literal["oracle", "random"] | None = Field(
        None,
        description="Scripted policy that plays the episodes without a model: `oracle` (solves every task) or "
        "`random` (well-formed random calls and answers). Give this or --server.",
    )
    server: str | None = Field(
        None,
        description="Base URL of a clawrl server's API (e.g. http://127.0.0.1:30000/v1) whose model plays the episodes: "
        "every step is a recorded turn, and each episode's outcome and step rewards go to its store. Give this or --policy.",
    )
    api_key: str | None = Field(None, description="Bearer key for --server, when the server requires one.")
    max_tokens: int = Field(256, ge=1, description="max_tokens of each model step (with --server).")
    temperature: float = Field(
        1.0, ge=0, le=2, description="Sampling temperature of each model step (with --server); the G rollouts of a "
        "group differ only by sampling, so 0 gives groups with no spread."
    )
    episodes: int = Field(8, ge=1, description="Episodes to run in all.")
    group_size: int = Field(1, ge=1, description="Episodes per task (a GRPO group): tasks drawn = episodes / size.")
    concurrency: int = Field(4, ge=1, description="Episodes running at a time (each in its own environment).")
    split: Literal["train", "eval"] = Field("train", description="Split the tasks are drawn from.")
    seed: int = Field(0, ge=0, description="Seed of the task draw and of the episodes (episode k gets seed + k).")
    step_timeout_s: float = Field(
        120.0, gt=0, description="Wall-clock limit of one environment step; past it the episode fails and its environment is closed."
    )
    episode_timeout_s: float = Field(
        300.0, gt=0, description="Wall-clock limit of one episode; a slower one ends as failed."
    )
    record: Path | None = Field(None, description="Append one JSON line per finished episode to this file.")

    @model_validator(mode="after")
    def _one_player(self) -> Self:
        if (self.policy is None) == (self.server is None):
            raise ValueError("rollout needs --policy oracle|random (a scripted policy) or --server URL (a clawrl server's model), one of them")
        return self
