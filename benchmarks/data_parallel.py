"""Step time of the data-parallel update (`--train-workers`): one process against M gloo processes.

Every rank builds the tiny model (random weights, the trainer's LoRA: rank 16, alpha 32, all
linear projections) and the same batch (random token ids, rewards ±1), and times `update_step`
with the group (`clawrl.train.data_parallel`); rank 0 reports the median over `--repeats` steps
after one warm-up step. Each rank has one CPU thread, so M ranks need M free cores to gain: on a
machine whose cores are shared the figure says what it costs, not what it saves.

    python benchmarks/data_parallel.py --workers 1,2 --batch 16 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from peft import LoraConfig, get_peft_model

from clawrl.config import LossConfig
from clawrl.serve.runner import free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.train.update import update_step
from clawrl.types import Sample, TrainingExample, Turn, TurnSampling


def batch(size: int, prompt_tokens: int, response_tokens: int) -> list[TrainingExample]:
    generator = torch.Generator().manual_seed(0)
    examples = []
    for index in range(size):
        prompt = torch.randint(0, 2048, (prompt_tokens + index % 7,), generator=generator).tolist()
        response = torch.randint(0, 2048, (response_tokens + index % 5,), generator=generator).tolist()
        turn = Turn(id=f"t{index}", session_id="s", kind="main", model="m", policy_version=0, messages=[], tools=None,
                    sampling=TurnSampling(), prompt_token_ids=prompt, response_token_ids=response,
                    response_logprobs=[-2.0] * len(response), response_text="", tool_calls=None, finish_reason="stop")  # fmt: skip
        examples.append(TrainingExample(turn, Sample(turn.id, "ready", "rl", 1.0 if index % 2 else -1.0, 0)))
    return examples


def rank_main(rank: int, world: int, port: int, model_dir: Path, options: argparse.Namespace, out: Path) -> None:
    torch.set_num_threads(1)
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        group = dist.group.WORLD
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    examples = batch(options.batch, options.prompt_tokens, options.response_tokens)
    seconds = []
    for _ in range(options.repeats + 1):
        started = time.perf_counter()
        update_step(model, optimizer, examples, LossConfig(), micro_batch_size=options.micro_batch_size, group=group)
        seconds.append(time.perf_counter() - started)
    if rank == 0:
        out.write_text(str(statistics.median(seconds[1:])))
    if group is not None:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated rank counts")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=120)
    parser.add_argument("--response-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model_dir = build_tiny_model(Path(folder) / "model", seed=0)
        print("| train workers | step (s, median) |\n|---|---|")
        for world in (int(count) for count in options.workers.split(",")):
            out = Path(folder) / f"step-{world}.txt"
            args = (world, free_port(), model_dir, options, out)
            mp.start_processes(rank_main, args=args, nprocs=world, start_method="spawn")
            print(f"| {world} | {float(out.read_text()):.3f} |")


if __name__ == "__main__":
    main()
