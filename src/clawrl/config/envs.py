"""The general-agent environments' settings (DESIGN §9): which one, its episodes, rollouts and its HTTP server."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from clawrl.config.base import ComponentSettings, Names, Numbers, split_commas


class EnvConfig(ComponentSettings):
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
    toolcall_kinds: Names = Field(
        ["arithmetic", "number_theory", "units", "word"],
        description="Comma-separated kinds of tool-call problems the splits draw from (a micro split: e.g. `arithmetic`).",
    )
    toolcall_levels: Numbers = Field([1, 2, 3], description="Comma-separated difficulty levels (1-3) the tool-call splits draw from.")
    terminal_tasks_dir: Path | None = Field(
        None,
        description="A directory of terminal task folders (Harbor layout); unset: the built-in generated tasks, "
        "written once under --cache-dir.",
    )
    terminal_seed: int = Field(0, ge=0, description="Seed of the built-in terminal task generator.")
    terminal_task_prefixes: Names = Field(
        [],
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
    swe_kinds: Names = Field(
        [],
        description="Comma-separated bug kinds of the built-in SWE instances (operator, comparison, boolean, constant, "
        "condition, removal): a micro split; empty: every kind.",
    )
    swe_libraries: Names = Field(
        [],
        description="Comma-separated built-in SWE libraries (datehelp, intervals, stackcalc, statkit, textkit, "
        "unitconv): a micro split; empty: all of them.",
    )
    web_families: Names = Field(
        [],
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

    # The lists as lists (they are typed so now; these accessors stay for the environments that call them,
    # and take a field that `model_copy(update=...)` set to text, unvalidated, as its flag would).
    def toolcall_kind_list(self) -> list[str]:
        return _listed(self.toolcall_kinds)

    def toolcall_level_list(self) -> list[int]:
        levels = _listed(self.toolcall_levels)
        if not all(isinstance(level, int) or level.isdigit() for level in levels):
            raise ValueError(f"--toolcall-levels takes numbers, e.g. 1,2: {self.toolcall_levels!r}")
        return [int(level) for level in levels]

    def terminal_prefix_list(self) -> list[str]:
        return _listed(self.terminal_task_prefixes)

    def swe_kind_list(self) -> list[str]:
        return _listed(self.swe_kinds)

    def swe_library_list(self) -> list[str]:
        return _listed(self.swe_libraries)

    def web_family_list(self) -> list[str]:
        return _listed(self.web_families)


def _listed(value: Any) -> list[Any]:
    return list(split_commas(value))


class RolloutConfig(ComponentSettings):
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
    placement: Literal["local", "ray"] = Field(
        "local", description="Where the episodes run: `local`, in this process (--concurrency at a time, one pool of "
        "environments); `ray`, spread over --rollout-actors Ray actors on the cluster at RAY_ADDRESS (a cluster on "
        "this machine when unset), each with its own pool of --concurrency environments and its own connection to "
        "--server; the episodes under way on an actor that dies end as failed (docs/cluster.md). Needs `pip install "
        "'clawrl[ray]'`."
    )
    rollout_actors: int = Field(
        2, ge=1, description="With --placement ray: Ray actors the episodes are spread over (each takes the next "
        "planned episode whenever one of its --concurrency slots is free)."
    )
    actor_cpus: float = Field(
        1.0, ge=0, description="With --placement ray: CPUs Ray reserves for each rollout actor (its environments "
        "run there: a sandboxed command, a browser)."
    )

    @model_validator(mode="after")
    def _one_player(self) -> Self:
        if (self.policy is None) == (self.server is None):
            raise ValueError("rollout needs --policy oracle|random (a scripted policy) or --server URL (a clawrl server's model), one of them")
        return self


class EnvServeConfig(ComponentSettings):
    """`clawrl envs serve`: where the environment server listens and how many episodes it runs.

    Its environment variables are `CLAWRL_ENV_<FIELD>`, as the environment's own.
    """

    model_config = SettingsConfigDict(env_prefix="CLAWRL_ENV_")

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    max_episodes: int = Field(
        64, gt=0, description="Most episodes running at once (one environment each; an episode that ends gives its "
        "environment back, warm for the next /reset)."
    )
    idle_timeout_s: float = Field(
        600.0, gt=0, description="Close an episode (and its sandbox) nobody has touched for this long, and a warm "
        "environment unused for this long."
    )
    step_timeout_s: float = Field(
        120.0, gt=0, description="A step that runs longer fails its episode (500) and closes its environment."
    )
