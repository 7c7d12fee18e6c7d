"""Data-parallel training (DESIGN §10, issue 34): M ranks take the step one process takes.

Two real processes joined by gloo on this CPU each run their share of a batch's micro-batches
(`train.data_parallel`); in float64 the summed gradient, the parameters after a clipped AdamW step,
several PPO steps (π_old scored in shares and gathered) and the reported figures equal those of
one process, on both ranks. The sharding balances packed tokens and places every micro-batch once.
A real trainer with `--train-workers 2` publishes the version one process publishes, loses a
worker killed in the middle of a step, starts its group again and publishes on from the last
version, every sample trained exactly once, and the engine serves what it trained.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from peft import get_peft_model, LoraConfig
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig, LossConfig, TrainConfig
from clawrl.engines.hf import HFEngine
from clawrl.model.scoring import score_response
from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.train.data_parallel import all_reduce_sum, shard
from clawrl.train.policy import ADAPTER_WEIGHTS, TrainedPolicy
from clawrl.train.trainer import Trainer
from clawrl.train.update import update_step
from clawrl.types import Sample, TrainingExample
from tests.helpers import HINT, Conversation, random_ids, random_tree_prompts, turn

K = 3
CONFIG = LossConfig(method="combine", kl_beta=0.5, entropy_coef=0.01, opd_topk=K)
# name: (optimizer, update_step options); SGD at lr 1 without a clip moves each weight by minus its gradient
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gradient": ("sgd", {"micro_batch_size": 2, "grad_clip": math.inf, "share_prefix": True}),
    "one micro-batch": ("sgd", {"micro_batch_size": 8, "grad_clip": math.inf}),  # rank 1 runs none of it
    "adamw, clipped": ("adamw", {"micro_batch_size": 2, "grad_clip": 1.0}),
    "epochs, mini-batches": ("sgd", {"micro_batch_size": 1, "grad_clip": math.inf, "ppo_epochs": 2, "mini_batches": 2}),
}
REPORTED = ("loss", "entropy", "kl_to_reference", "topk_reverse_kl", "mean_advantage", "logprob_drift", "mean_is_weight",
            "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps")  # fmt: skip


def policy(model_dir: Path) -> torch.nn.Module:
    """The tiny model in float64 with a LoRA adapter initialised at random (so every weight has a gradient)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))


def examples() -> list[TrainingExample]:
    """Eight samples of uneven lengths sharing prefixes, each with its own reward, behaviour and teacher."""
    generator, made = torch.Generator().manual_seed(1), []
    for row, prompt in enumerate(random_tree_prompts(seed=7, rows=8)):
        response = random_ids(2 + row % 4, seed=500 + row)
        behaviour = (-3.0 + torch.rand(len(response), generator=generator)).tolist()
        teacher: dict[str, Any] = {}
        if row % 3 == 1:
            teacher["teacher_logprobs"] = [logprob + 0.5 for logprob in behaviour]
        elif row % 3 == 2:
            teacher["teacher_topk_ids"] = torch.randint(0, 2048, (len(response), K), generator=generator).tolist()
            teacher["teacher_topk_logprobs"] = [[math.log(0.3)] * K for _ in response]
        answered = turn(f"t{row}", "s", [], "", prompt_token_ids=prompt, response_token_ids=response, response_logprobs=behaviour)
        made.append(TrainingExample(answered, Sample(f"t{row}", "ready", "rl", 1.0 if row % 2 else -1.0, 0, **teacher)))
    return made


def run_case(model: torch.nn.Module, case: str, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """One update of `case` on a copy of `model`: the trainable weights after it, and the reported figures."""
    model = copy.deepcopy(model)
    kind, options = CASES[case]
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=1.0) if kind == "sgd" else torch.optim.AdamW(trainable, lr=1e-2)
    metrics = update_step(model, optimizer, examples(), CONFIG, group=group, **options)
    weights = {name: parameter.detach().clone() for name, parameter in model.named_parameters() if parameter.requires_grad}
    return {"weights": weights, "metrics": {name: getattr(metrics, name) for name in REPORTED}}


def bucket_sums(rank: int) -> list[torch.Tensor]:
    """Tensors of three dtypes and shapes, summed over the ranks in buckets of 64 bytes (several per dtype)."""
    scale = rank + 1
    tensors = [torch.full((5,), 0.5 * scale, dtype=torch.float64), torch.arange(7) * scale,
               torch.ones(3, 2) * scale, torch.full((20,), 0.25 * scale, dtype=torch.float64)]  # fmt: skip
    all_reduce_sum(tensors, dist.group.WORLD, bucket_bytes=64)
    return tensors


def rank_main(rank: int, world: int, port: int, model_dir: Path, out_dir: Path) -> None:
    """One rank of the group (a spawned process): every case, its results saved for the test to compare."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = policy(model_dir)
        results: dict[str, Any] = {case: run_case(model, case, dist.group.WORLD) for case in CASES}
        results["summed"] = bucket_sums(rank)
        torch.save(results, out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_take_the_step_of_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    mp.start_processes(rank_main, args=(2, free_port(), tiny_model_dir, tmp_path), nprocs=2, start_method="spawn")
    torch.set_num_threads(1)
    model = policy(tiny_model_dir)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters() if parameter.requires_grad}
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    for case in CASES:
        alone = run_case(model, case, None)
        for results in ranks:
            together = results[case]
            assert together["weights"].keys() == alone["weights"].keys() == before.keys()
            for name, weight in alone["weights"].items():
                assert not torch.equal(weight, before[name]), (case, name)  # every weight moved
                torch.testing.assert_close(together["weights"][name], weight, rtol=1e-9, atol=1e-12, msg=f"{case}: {name}")
            assert together["metrics"] == pytest.approx(alone["metrics"], rel=1e-6, abs=1e-9), case
        assert all(torch.equal(ranks[0][case]["weights"][name], ranks[1][case]["weights"][name]) for name in before)
    expected = [torch.full((5,), 1.5, dtype=torch.float64), torch.arange(7) * 3, torch.ones(3, 2) * 3,
                torch.full((20,), 0.75, dtype=torch.float64)]  # fmt: skip
    for results in ranks:
        assert all(torch.equal(got, want) and got.dtype == want.dtype for got, want in zip(results["summed"], expected))


def test_micro_batches_are_shared_out_by_packed_tokens() -> None:
    costs = [900, 100, 400, 400, 300, 100]
    owners = shard(costs, 2)
    loads = [sum(cost for cost, owner in zip(costs, owners) if owner == rank) for rank in (0, 1)]
    assert sorted(loads) == [1100, 1100] and owners == shard(costs, 2)  # balanced, and the same every time
    assert shard(costs, 1) == [0] * 6 and sorted(shard([5, 5], 3)) == [0, 1]  # more ranks than micro-batches
    assert shard([], 2) == []


def judged_sessions(run_dir: Path, model_dir: Path) -> list[str]:
    """Two sessions of three corrected turns each (six samples: two batches of three), and their ids."""
    store = Store.for_run_dir(run_dir)
    talk = Conversation(store, AutoTokenizer.from_pretrained(model_dir))
    taught = []
    for session in ("S", "R"):
        for index in range(3):
            turn_id = f"{session}{index}"
            talk.turn(turn_id, session, f"Write note {index}.", "**Note**: 1. Friday.", after=f"{session}{index - 1}" if index else None)
            talk.judge(turn_id, -1, HINT)
            taught.append(turn_id)
        talk.turn(f"{session}3", session, "thanks", "Welcome.", after=f"{session}2")
    store.close()
    return taught


def test_two_train_workers_publish_what_one_trainer_does_and_outlive_a_lost_worker(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone_dir, together_dir = tmp_path / "alone", tmp_path / "together"
    taught = judged_sessions(alone_dir, tiny_model_dir)
    shutil.copytree(alone_dir, together_dir)
    engine_config = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    options = {"method": "combine", "batch_size": 3, "lr": 1e-2, "train_poll_s": 0.1, "micro_batch_size": 1}
    alone = Trainer(TrainConfig(**options), engine_config, Store.for_run_dir(alone_dir), alone_dir)
    alone.start()
    assert alone.run(max_steps=1) == 1
    store = Store.for_run_dir(together_dir)
    together = Trainer(TrainConfig(**options, train_workers=2), engine_config, store, together_dir)
    together.start()
    try:
        assert together.run(max_steps=1) == 1
        one, two = (load_file(run / "policy/shared/v1" / ADAPTER_WEIGHTS) for run in (alone_dir, together_dir))
        assert one.keys() == two.keys()
        for name in one:  # float32 here: the same step up to the order of the sums
            torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)
        assert together.workers is not None
        killed = together.workers.processes[0]
        real_update = TrainedPolicy.update

        def killing_update(policy: TrainedPolicy, *args: Any) -> Any:
            """Rank 0's next update, after its worker was SIGKILLed mid-step (it had the batch already)."""
            monkeypatch.setattr(TrainedPolicy, "update", real_update)
            os.kill(killed.pid, signal.SIGKILL)
            killed.join(10)
            return real_update(policy, *args)

        monkeypatch.setattr(TrainedPolicy, "update", killing_update)
        assert together.run(max_steps=1) == 1  # the lost step thrown away, the group started again, the step redone
        assert killed.exitcode == -signal.SIGKILL and together.workers.failures == 0
        assert [process.is_alive() for process in together.workers.processes] == [True]
    finally:
        together.close()
        alone.close()
    assert [(row.version, row.parent) for row in store.training.versions()] == [(1, 0), (2, 1)]
    trained = [sample for number in (1, 2) for sample in
               json.loads((together_dir / f"policy/shared/v{number}/manifest.json").read_text())["sample_ids"]]  # fmt: skip
    assert sorted(trained) == sorted(taught)  # every sample exactly once
    turn_ids = store.turns.turn("S0")

    async def served() -> list[float]:
        engine = HFEngine(engine_config)
        await engine.start()
        try:
            await engine.load_version(2, Path(store.training.version(2).path))
            return (await engine.score(turn_ids.prompt_token_ids, turn_ids.response_token_ids)).logprobs
        finally:
            await engine.close()

    trained_logprobs = score_response(together.model, turn_ids.prompt_token_ids, turn_ids.response_token_ids, 0).logprobs
    torch.testing.assert_close(torch.tensor(asyncio.run(served())), torch.tensor(trained_logprobs), rtol=0, atol=1e-4)


def test_clawrl_train_with_two_workers_publishes_every_sample_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The command a user runs (and `clawrl serve --train-workers 2` starts): the workers spawned
    from `python -m clawrl.cli train`, two steps published, then a clean stop."""
    taught = judged_sessions(tmp_path, tiny_model_dir)
    command = [
        sys.executable, "-m", "clawrl.cli", "train", "--model", str(tiny_model_dir), "--run-dir", str(tmp_path),
        "--device", "cpu", "--cpu-threads", "1", "--method", "rl", "--batch-size", "3", "--lr", "0.01",
        "--train-poll-s", "0.1", "--train-workers", "2", "--steps", "2",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "data-parallel trainer: 2 ranks (gloo)" in result.stderr
    training = Store.for_run_dir(tmp_path).training
    assert [(row.version, row.parent) for row in training.versions()] == [(1, 0), (2, 1)]
    trained = [sample for row in training.versions() for sample in json.loads((Path(row.path) / "manifest.json").read_text())["sample_ids"]]
    assert sorted(trained) == sorted(taught)
