"""Settings as a user gives them: environment variables, flags, and combinations that are refused."""

from __future__ import annotations

import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from clawrl.cli import build_parser, config_from_args
from clawrl.config import (
    BackgroundConfig,
    BenchConfig,
    DashboardConfig,
    EngineConfig,
    EnvConfig,
    EnvServeConfig,
    EnvsServeSettings,
    JudgeConfig,
    LossConfig,
    RolloutSettings,
    ServeConfig,
    ServeSettings,
    StoreConfig,
    TrainConfig,
    TrainSettings,
)
from clawrl.trainer_process import settings_env

SERVER_CONFIGS = (EngineConfig, StoreConfig, ServeConfig, DashboardConfig, JudgeConfig, LossConfig, TrainConfig,
                  BackgroundConfig)
UPSTREAM_NAMES = ("PORT", "SERVED_MODEL_NAME", "SGLANG_API_KEY")
CLAWRL = Path(sys.executable).parent / "clawrl"  # the installed command, next to this interpreter


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting of the machine running the tests leaks into them."""
    for name in os.environ:
        if name.startswith("CLAWRL_") or name in UPSTREAM_NAMES:
            monkeypatch.delenv(name)


def env_name(config: type[BaseSettings], field: str) -> str:
    return f"{config.model_config['env_prefix']}{field.upper()}"


# Fields with a format or bounds of their own: a value in that format.
FORMATTED = {(BenchConfig, "seed_list"): "20-22", (BenchConfig, "tuning_seeds"): "200-201",
             (BackgroundConfig, "background_nice"): "5", (ServeConfig, "memory_notes"): "32",
             (ServeConfig, "memory_retire_turns"): "8", (ServeConfig, "memory_retire_samples"): "2",
             (ServeConfig, "memory_retire_sampled"): "untold"}


def other_value(config: type[BaseSettings], field: str) -> str:
    """A valid value of the field, as an environment variable's text, that is not its default
    (or, for a choice of one, that one)."""
    if (config, field) in FORMATTED:
        return FORMATTED[config, field]
    info = config.model_fields[field]
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if typing.get_origin(annotation) is list:  # a list: as its flag takes it
        item = typing.get_args(annotation)[0]
        item = typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item
        if typing.get_origin(item) is typing.Literal:  # a list of choices: the last two
            return ",".join(typing.get_args(item)[-2:])
        return {str: "from-env,and-more", int: "2,3"}[item]
    if annotation is bool:
        return "false" if info.default else "true"
    if typing.get_origin(annotation) is typing.Literal:
        # from the end: the first choices (`--judge openai`) need other settings with them
        choices = typing.get_args(annotation)
        return next((choice for choice in reversed(choices) if choice != info.default), choices[0])
    # within every field's bounds (ports, body sizes, probabilities, ...) and nobody's default
    return {int: "2048", float: "0.75", str: "from-env", SecretStr: "from-env", Path: "/from/env"}[annotation]


ALL_FIELDS = [(config, field) for config in (*SERVER_CONFIGS, BenchConfig, EnvConfig, EnvServeConfig)
              for field in config.model_fields]
# settings that a validator refuses alone, with what they need
COMPANIONS = {(BenchConfig, "user_url"): {"user_model": "from-env"}, (EngineConfig, "engine"): {"engine_url": "http://e/v1"}}


@pytest.mark.parametrize(("config", "field"), ALL_FIELDS, ids=[f"{c.__name__}.{f}" for c, f in ALL_FIELDS])
def test_every_field_reads_its_environment_variable(config: type[BaseSettings], field: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    value, companions = other_value(config, field), COMPANIONS.get((config, field), {})
    for name, companion in {field: value, **companions}.items():
        monkeypatch.setenv(env_name(config, name), companion)
    from_env = getattr(config(), field)
    assert from_env == getattr(config(**{field: value, **companions}), field)
    if from_env == config.model_fields[field].default:  # a choice of one: the variable is read if a wrong one is refused
        monkeypatch.setenv(env_name(config, field), "no-such-choice")
        with pytest.raises(ValidationError):
            config()


def test_upstream_variable_names_are_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "31000")
    monkeypatch.setenv("SERVED_MODEL_NAME", "upstream-name")
    monkeypatch.setenv("SGLANG_API_KEY", "upstream-key")
    serve = ServeConfig()
    assert (serve.port, serve.served_model_name, serve.api_key) == (31000, "upstream-name", "upstream-key")
    assert DashboardConfig().api_key == "upstream-key"
    monkeypatch.setenv("CLAWRL_PORT", "32000")  # the clawrl name wins when both are set
    assert ServeConfig().port == 32000


def test_only_the_named_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_KEY", "unprefixed")  # a field's bare name is not one of its variables
    monkeypatch.setenv("MODEL", "unprefixed")
    assert ServeConfig().api_key is None and EngineConfig().model == "tiny"
    monkeypatch.setenv("CLAWRL_MODEL", "served")  # a server's variables never reach the bench, nor the reverse
    monkeypatch.setenv("CLAWRL_BENCH_SESSIONS", "5")
    monkeypatch.setenv("CLAWRL_BENCH_MODEL", "benched")
    assert BenchConfig().model == "benched" and BenchConfig().sessions == 5
    assert EngineConfig().model == "served"


def test_keyword_construction_uses_field_names() -> None:
    assert EngineConfig(model="x").model == "x"
    serve = ServeConfig(port=1234, api_key="k", served_model_name="n")
    assert (serve.port, serve.api_key, serve.served_model_name) == (1234, "k", "n")
    assert DashboardConfig(api_key="k").api_key == "k"
    assert BenchConfig(sessions=2, user_url="http://user/v1", user_model="u").sessions == 2


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWRL_PORT", "31000")
    monkeypatch.setenv("PORT", "31001")
    monkeypatch.setenv("CLAWRL_JUDGE_MODEL", "env-judge")
    monkeypatch.setenv("CLAWRL_LR", "0.5")
    args = build_parser().parse_args(["serve", "--port", "31002", "--judge-model", "flag-judge"])
    assert config_from_args(ServeConfig, args).port == 31002
    assert config_from_args(JudgeConfig, args).judge_model == "flag-judge"
    assert config_from_args(TrainConfig, args).lr == 0.5  # no flag: the environment's

    monkeypatch.setenv("CLAWRL_BENCH_SESSIONS", "5")
    monkeypatch.setenv("CLAWRL_BENCH_SEEDS", "2")
    bench = config_from_args(BenchConfig, build_parser().parse_args(["bench", "learn", "--sessions", "7"]))
    assert (bench.sessions, bench.seeds) == (7, 2)


def test_serve_hands_its_trainer_settings_to_the_trainer_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`clawrl serve` starts `clawrl train` with CLAWRL_* variables that rebuild the same settings."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    args = build_parser().parse_args(
        ["serve", "--model", "some/model", "--run-dir", str(tmp_path), "--method", "rl", "--full", "--lr", "0.001",
         "--lora-target-modules", "q_proj,v_proj", "--eps-high", "0.3", "--report-to", "tensorboard,mlflow", "--loss-agg", "seq-mean",
         "--background-cpus", ",".join(map(str, cpus))]
    )
    serve = config_from_args(ServeSettings, args)
    assert serve.background.background_cpus == cpus  # a list, from its flag's spelling
    configs = [serve.engine, serve.store, serve.train, serve.background]
    for name, value in settings_env(*configs).items():
        monkeypatch.setenv(name, value)
    trainer = config_from_args(TrainSettings, build_parser().parse_args(["train"]))  # what the child reads
    assert [trainer.engine, trainer.store, trainer.train, trainer.background] == configs
    assert [EngineConfig(), StoreConfig(), TrainConfig(), BackgroundConfig()] == configs
    assert LossConfig().method == "rl" and LossConfig().eps_high == 0.3 and LossConfig().loss_agg == "seq-mean"
    assert trainer.train.report_to == ["tensorboard", "mlflow"]


def test_the_trainer_child_gets_the_data_key_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """`CLAWRL_DATA_KEY` reaches `clawrl train` as the key, not as pydantic's '**********'."""
    monkeypatch.setenv("CLAWRL_DATA_KEY", "the-key")
    store = StoreConfig()
    assert "the-key" not in repr(store)
    assert settings_env(store)["CLAWRL_DATA_KEY"] == "the-key"


def test_an_unknown_tracker_is_refused_by_name() -> None:
    assert TrainConfig(report_to="").report_to == [] and TrainConfig().report_to == []
    with pytest.raises(ValidationError, match="tensorboard"):
        TrainConfig(report_to="tensorboard,comet")


def test_list_settings_are_lists_given_and_written_as_their_flags_take_them(monkeypatch: pytest.MonkeyPatch) -> None:
    env = EnvConfig(toolcall_kinds="arithmetic, units", toolcall_levels="1,2", swe_libraries="")
    assert (env.toolcall_kinds, env.toolcall_levels, env.swe_libraries) == (["arithmetic", "units"], [1, 2], [])
    assert EnvConfig(toolcall_kinds=["units"]).toolcall_kinds == ["units"]  # a list, in Python
    assert EnvConfig().toolcall_kinds == ["arithmetic", "number_theory", "units", "word"]
    dumped = env.model_dump(mode="json")  # the flag's spelling: a dump read back as variables gives the same
    assert (dumped["toolcall_kinds"], dumped["toolcall_levels"], dumped["swe_libraries"]) == ("arithmetic,units", "1,2", "")
    for field in ("toolcall_kinds", "toolcall_levels", "swe_libraries"):
        monkeypatch.setenv(f"CLAWRL_ENV_{field.upper()}", str(getattr(env, field)))
    assert EnvConfig() == EnvConfig(toolcall_kinds="arithmetic,units", toolcall_levels="1,2")
    with pytest.raises(ValidationError, match="valid integer"):
        EnvConfig(toolcall_levels="1,two")
    with pytest.raises(ValidationError, match="comma-separated names"):
        EnvConfig(web_families="click-button;enter-text")

    bench = BenchConfig(seed_list="10-12,20", tuning_seeds="100-101")
    assert (bench.seed_list, bench.tuning_seeds) == ([10, 11, 12, 20], [100, 101])
    assert (str(bench.seed_list), str(bench.tuning_seeds)) == ("10-12,20", "100-101")  # as --seed-list takes them
    monkeypatch.setenv("CLAWRL_BENCH_SEED_LIST", "tuning")  # a named set, from the environment too
    monkeypatch.setenv("CLAWRL_BENCH_TUNING_SEEDS", "102,104")
    assert BenchConfig().seed_list == [102, 104] and BenchConfig().run_seeds() == [102, 104]
    assert BenchConfig(seed_list="report").seed_list == [10, 11, 12, 13, 14]

    assert BackgroundConfig().background_cpus == "auto"
    cpu = min(os.sched_getaffinity(0))
    assert BackgroundConfig(background_cpus=f"{cpu}").background_cpus == [cpu]
    assert BackgroundConfig(background_cpus=[cpu]).model_dump()["background_cpus"] == str(cpu)


def test_each_command_reads_one_settings_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWRL_MAX_BATCH_SIZE", "5")
    monkeypatch.setenv("CLAWRL_JUDGE", "rule")
    args = build_parser().parse_args(["serve", "--port", "31002", "--method", "opd", "--background-nice", "3"])
    settings = config_from_args(ServeSettings, args)
    assert isinstance(settings, ServeSettings) and isinstance(settings.engine, EngineConfig)
    assert (settings.serve.port, settings.train.method, settings.background.background_nice) == (31002, "opd", 3)
    assert (settings.engine.max_batch_size, settings.judge.judge) == (5, "rule")  # the environment's, no flag
    assert ServeSettings().engine.max_batch_size == 5  # every component from the environment

    envs = config_from_args(EnvsServeSettings, build_parser().parse_args(["envs", "serve", "--env", "web", "--port", "9000"]))
    assert (envs.env.env, envs.server.port, envs.server.host, envs.server.max_episodes) == ("web", 9000, "127.0.0.1", 64)
    assert (envs.server.idle_timeout_s, envs.server.step_timeout_s) == (600.0, 120.0)
    monkeypatch.setenv("CLAWRL_ENV_MAX_EPISODES", "7")
    assert config_from_args(EnvsServeSettings, build_parser().parse_args(["envs", "serve"])).server.max_episodes == 7
    with pytest.raises(SystemExit, match=r"^error: --step-timeout-s \(CLAWRL_ENV_STEP_TIMEOUT_S\): Input should be greater than 0"):
        config_from_args(EnvsServeSettings, build_parser().parse_args(["envs", "serve", "--step-timeout-s", "0"]))

    rollout = config_from_args(RolloutSettings, build_parser().parse_args(["rollout", "--policy", "oracle", "--seed", "4"]))
    assert (rollout.rollout.policy, rollout.rollout.seed, rollout.env.env) == ("oracle", 4, "toolcall")


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--engine", "vllm", "--method", "rl", "--lora-rank", "128"],
      "--lora-rank 128 is above --max-lora-rank 64; raise --max-lora-rank or lower --lora-rank"),
     (["--engine", "openai", "--engine-url", "http://e/v1", "--method", "rl", "--full"],
      "--engine openai cannot swap in full-weight versions (a remote server has no call for it); "
      "train LoRA adapters (drop --full) or use --engine vllm"),
     (["--engine", "openai"], "--engine openai needs --engine-url; give the server's base URL (e.g. http://127.0.0.1:8000/v1)"),
     (["--quantize", "nf4", "--method", "rl", "--full"],
      "--quantize nf4 keeps the base frozen in 4 bits; --full would train every weight: drop one of them"),
     (["--engine", "vllm", "--quantize", "nf4"],
      "--quantize nf4 works with --engine hf; vLLM has its own quantization (pass it in --vllm-args)")],
)
def test_an_engine_that_cannot_serve_the_trainers_versions_is_refused_when_read(flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as refused:
        config_from_args(ServeSettings, build_parser().parse_args(["serve", *flags]))
    assert refused.value.code == f"error: {message}"


def test_engine_rules_apply_only_where_they_matter() -> None:
    vllm, openai = EngineConfig(engine="vllm"), EngineConfig(engine="openai", engine_url="http://e/v1")
    assert ServeSettings(engine=vllm, train=TrainConfig(lora_rank=128)).train.method is None  # no trainer
    assert ServeSettings(engine=vllm, train=TrainConfig(method="rl", lora_rank=128, full=True)).train.full
    assert ServeSettings(engine=vllm, train=TrainConfig(method="rl", lora_rank=64)).engine.max_lora_rank == 64
    assert ServeSettings(engine=openai, train=TrainConfig(method="rl")).engine.engine == "openai"
    with pytest.raises(ValidationError, match="above --max-lora-rank"):
        ServeSettings(engine=EngineConfig(engine="vllm", max_lora_rank=8), train=TrainConfig(method="opd"))
    # the trainer alone publishes what it is asked to: the serving engine's limits are serve's rule
    assert TrainSettings(engine=vllm, train=TrainConfig(method="rl", lora_rank=128)).train.lora_rank == 128
    # but a 4-bit base is frozen wherever it is trained
    with pytest.raises(ValidationError, match="keeps the base frozen in 4 bits"):
        TrainSettings(engine=EngineConfig(quantize="nf4"), train=TrainConfig(full=True))
    assert TrainSettings(engine=EngineConfig(quantize="nf4"), train=TrainConfig(method="rl")).engine.quantize == "nf4"


@pytest.mark.parametrize(
    ("settings", "missing"),
    [({}, "--judge-url, --judge-model"), ({"judge_url": "http://judge/v1"}, "--judge-model"),
     ({"judge_model": "m"}, "--judge-url")],
)
def test_the_openai_judge_needs_an_endpoint_and_a_model(settings: dict[str, Any], missing: str) -> None:
    with pytest.raises(ValidationError, match=f"--judge openai needs --judge-url and --judge-model \\(missing: {missing}\\)"):
        JudgeConfig(judge="openai", **settings)


def test_the_openai_judge_with_an_endpoint_and_a_model_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert JudgeConfig(judge="openai", judge_url="http://judge/v1", judge_model="m").judge == "openai"
    assert JudgeConfig(judge="rule").judge_url is None  # only the openai judge needs them
    monkeypatch.setenv("CLAWRL_JUDGE", "openai")  # the combination may come from the environment too
    monkeypatch.setenv("CLAWRL_JUDGE_URL", "http://judge/v1")
    with pytest.raises(ValidationError, match="missing: --judge-model"):
        JudgeConfig()
    assert JudgeConfig(judge_model="m").judge_model == "m"


def test_a_simulated_user_endpoint_needs_its_model() -> None:
    with pytest.raises(ValidationError, match="--user-url needs --user-model"):
        BenchConfig(user_url="http://user/v1")
    assert BenchConfig(user_url="http://user/v1", user_model="u").user_model == "u"
    assert BenchConfig().user_url is None  # scripted replies need neither


def test_a_side_turn_rule_must_be_a_regular_expression() -> None:
    with pytest.raises(ValidationError, match="not a regular expression"):
        ServeConfig(side_turn_system_regex="(title")
    assert ServeConfig(side_turn_system_regex=r"^Generate a title").side_turn_system_regex == r"^Generate a title"


def test_config_from_args_turns_a_refused_setting_into_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["judge", "--judge", "openai", "--judge-model", "m"])
    with pytest.raises(SystemExit) as refused:
        config_from_args(JudgeConfig, args)
    assert refused.value.code == "error: --judge openai needs --judge-url and --judge-model (missing: --judge-url)"

    monkeypatch.setenv("CLAWRL_JUDGE_CONCURRENCY", "0")
    with pytest.raises(SystemExit) as refused:
        config_from_args(JudgeConfig, build_parser().parse_args(["judge"]))
    assert refused.value.code == (
        "error: --judge-concurrency (CLAWRL_JUDGE_CONCURRENCY): Input should be greater than or equal to 1 (got '0')"
    )

    monkeypatch.setenv("PORT", "not-a-port")  # an aliased setting names all its variables
    with pytest.raises(SystemExit, match=r"^error: --port \(CLAWRL_PORT or PORT\): Input should be a valid integer"):
        config_from_args(ServeConfig, build_parser().parse_args(["serve"]))


def clean_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("CLAWRL_") and name not in UPSTREAM_NAMES}


def test_the_cli_reports_a_bad_combination_in_one_line(tmp_path: Path) -> None:
    judge = subprocess.run([CLAWRL, "judge", "--judge", "openai", "--judge-url", "http://judge/v1", "--run-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env=clean_env())
    assert judge.returncode == 1
    assert judge.stderr.strip().splitlines() == ["error: --judge openai needs --judge-url and --judge-model (missing: --judge-model)"]

    bench = subprocess.run([CLAWRL, "bench", "learn", "--user-url", "http://user/v1", "--out", str(tmp_path / "bench")],
                           capture_output=True, text=True, timeout=120, env=clean_env())
    assert bench.returncode == 1 and "Traceback" not in bench.stderr
    assert bench.stderr.strip().splitlines()[-1].startswith("error: --user-url needs --user-model")
    assert not (tmp_path / "bench").exists()  # refused before anything ran
