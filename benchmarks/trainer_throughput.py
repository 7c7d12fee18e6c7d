"""Training throughput: clawrl's `update_step` against TRL's GRPO loss step, same model, same batch.

Both sides start from the same samples (random token ids, rewards ±1, on-policy behaviour
log-probs), the same weights (one LoRA adapter, rank 16, alpha 32, all linear projections, copied
to both; or full fine-tuning with `--full`) and the same micro-batches (clawrl's length-sorted
chunks), and do one full optimizer step: pack the samples into tensors, forward and backward
every micro-batch with gradient accumulation, clip the gradient to norm 1.0, AdamW step.

* **clawrl**: `clawrl.train.update.update_step` with the default `LossConfig` (PPO with the
  asymmetric clip, truncated importance weights, entropy metric).
* **TRL**: a real `trl.GRPOTrainer` (no generation: it is constructed with a dummy reward
  function and dataset and never trained), whose own `compute_loss` is called on the inputs dict
  its generation step would have produced (`prompt_ids`/`prompt_mask` left-padded,
  `completion_ids`/`completion_mask` right-padded, `advantages`, `num_items_in_batch`), then
  `backward()`. Loss `dapo` (TRL's default: token mean over the batch, like clawrl), ε = 0.2,
  ε_high = 0.28, β = 0, one iteration (so π_old is the step's own detached log-probs, as in
  clawrl), gradient checkpointing off (TRL turns it on by default; clawrl does not checkpoint).

The two sides alternate step by step (which goes first alternates too), so drift hits both
equally; each reports the median over `--repeats` steps after one warm-up step. Tokens/s counts
response tokens, the ones trained on. Before timing, one step's gradients are computed both ways
on identical weights and compared: the two objectives are the same at ρ = 1 with on-policy
samples, so they must agree to float precision (the `max grad diff` column).

    python benchmarks/trainer_throughput.py --shapes tiny,small --repeats 7

Prints a markdown table and writes the figures as JSON (`--out`). Needs the `bench` extra (TRL).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from clawrl.config import LossConfig
from clawrl.sim.tiny import build_tiny_model
from clawrl.types import Sample, TrainingExample, Turn, TurnSampling
from clawrl.train.update import micro_batches, update_step
from machine import PeakMemory, machine  # benchmarks/machine.py, beside this script

# Shapes on top of the tiny model's tokenizer. `tiny` is the model the tests use; `small` is
# wider and deeper with a vocabulary 64 times the hidden size, the ratio of real chat models, so
# the LM head weighs as it does there.
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 768,
        "vocab_size": 16384,
    },
    # a real chat model's vocabulary (Qwen's 151,936) on a small body: the output layer's logits
    # ([micro-batch, response, vocab] floats) are then most of a step's memory
    "vocab152k": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 768,
        "vocab_size": 151936,
    },
}
LEARNING_RATE = 1e-4
GRAD_CLIP = 1.0


@dataclass
class ShapeResult:
    shape: str
    parameters: int
    trainable_parameters: int
    samples: int
    response_tokens: int  # per step
    prompt_tokens: int  # per step
    clawrl_step_s: float  # median
    trl_step_s: float  # median
    clawrl_tokens_per_s: float
    trl_tokens_per_s: float
    ratio: float  # clawrl tokens/s over TRL tokens/s (ratio of the medians)
    paired_ratio: float  # median over repetitions of TRL time / clawrl time, adjacent steps paired
    max_grad_diff: float  # max |clawrl grad − TRL grad| over all trainable weights, relative to max |grad|
    clawrl_peak_mib: float  # the most memory one step added (see `PeakMemory`), over the timed steps
    trl_peak_mib: float


def build_model_dir(shape: str, root: Path) -> Path:
    """The tiny model, or the tiny model's tokenizer with a bigger random model of `shape`."""
    tiny = root / "tiny"
    if not tiny.is_dir():
        build_tiny_model(tiny, seed=0)
    if not SHAPES[shape]:
        return tiny
    tiny_config = AutoConfig.from_pretrained(tiny)
    # Fields derived from the shape (per-layer attention types, head size) are left to be derived again.
    fields = {key: value for key, value in tiny_config.to_dict().items() if key not in ("layer_types", "head_dim")}
    config = type(tiny_config)(**{**fields, **SHAPES[shape]})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    out = root / shape
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


def load_policy(model_dir: Path, full: bool, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if full:
        return model
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))


def make_samples(model: torch.nn.Module, args: argparse.Namespace) -> list[TrainingExample]:
    """Random prompts and responses; behaviour log-probs are the model's own (on-policy)."""
    generator = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    samples = []
    for index in range(args.batch_size):
        prompt_length = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=generator))
        response_length = int(torch.randint(args.response_min, args.response_max + 1, (1,), generator=generator))
        ids = torch.randint(3, vocab, (prompt_length + response_length,), generator=generator)
        with torch.no_grad():
            logits = model(input_ids=ids.unsqueeze(0).to(device)).logits[0, prompt_length - 1 : -1].float()
        behaviour = torch.log_softmax(logits, -1).gather(-1, ids[prompt_length:].unsqueeze(-1).to(device)).squeeze(-1)
        turn = Turn(
            id=f"bench-{index}", session_id="bench", kind="main", model="bench", policy_version=0,
            messages=[], tools=None, sampling=TurnSampling(), prompt_token_ids=ids[:prompt_length].tolist(),
            response_token_ids=ids[prompt_length:].tolist(), response_logprobs=behaviour.cpu().tolist(),
            response_text="", tool_calls=None, finish_reason="stop",
        )  # fmt: skip
        reward = 1.0 if index % 2 == 0 else -1.0
        samples.append(TrainingExample(turn, Sample(turn.id, "ready", "rl", reward, behaviour_version=0)))
    return samples


def trl_trainer(model: torch.nn.Module, model_dir: Path, scratch: Path) -> GRPOTrainer:
    """A GRPOTrainer around `model` that is never trained: only its loss is used.

    Its batch settings only have to pass GRPOConfig's checks: the micro-batches are made here.
    """
    config = GRPOConfig(
        output_dir=str(scratch / "trl"),
        per_device_train_batch_size=2,
        num_generations=2,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        num_iterations=1,
        gradient_checkpointing=False,
        report_to="none",
        use_cpu=next(model.parameters()).device.type == "cpu",
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["unused"] * 4}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    # The `dapo` normaliser is num_items_in_batch · accumulation steps / steps_per_generation;
    # with these equal it is num_items_in_batch, the response tokens of the whole step.
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation
    return trainer


def trl_inputs(chunk: list[TrainingExample], total_tokens: int, pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """What GRPOTrainer's generation step hands to its loss: left-padded prompts, right-padded completions."""
    prompt_width = max(len(example.turn.prompt_token_ids) for example in chunk)
    response_width = max(len(example.turn.response_token_ids) for example in chunk)
    prompt_ids, prompt_mask, completion_ids, completion_mask = [], [], [], []
    for example in chunk:
        left = prompt_width - len(example.turn.prompt_token_ids)
        right = response_width - len(example.turn.response_token_ids)
        prompt_ids.append([pad_id] * left + example.turn.prompt_token_ids)
        prompt_mask.append([0] * left + [1] * len(example.turn.prompt_token_ids))
        completion_ids.append(example.turn.response_token_ids + [pad_id] * right)
        completion_mask.append([1] * len(example.turn.response_token_ids) + [0] * right)
    tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    return {
        "prompt_ids": tensor(prompt_ids),
        "prompt_mask": tensor(prompt_mask),
        "completion_ids": tensor(completion_ids),
        "completion_mask": tensor(completion_mask),
        "advantages": torch.tensor([example.sample.reward for example in chunk], device=device),
        "num_items_in_batch": torch.tensor(float(total_tokens), device=device),
    }


def trl_accumulate(trainer: GRPOTrainer, samples: list[TrainingExample], micro_batch_size: int) -> None:
    """TRL's loss, forward and backward over the same micro-batches as clawrl's."""
    model = trainer.model
    device = next(model.parameters()).device
    total = sum(len(example.turn.response_token_ids) for example in samples)
    pad_id = trainer.processing_class.pad_token_id
    model.train()
    for chunk in micro_batches(samples, micro_batch_size):
        trainer.compute_loss(model, trl_inputs(chunk, total, pad_id, device)).backward()


def trl_step(trainer: GRPOTrainer, optimizer: torch.optim.Optimizer, samples: list[TrainingExample], micro_batch_size: int):
    optimizer.zero_grad(set_to_none=True)
    trl_accumulate(trainer, samples, micro_batch_size)
    torch.nn.utils.clip_grad_norm_([p for p in trainer.model.parameters() if p.requires_grad], GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def grad_difference(ours: torch.nn.Module, trainer: GRPOTrainer, samples: list[TrainingExample], micro_batch_size: int) -> float:
    """One step's gradient both ways on identical weights: max abs difference over max abs gradient."""
    weights = trainable(ours)
    before = {name: parameter.detach().clone() for name, parameter in weights.items()}
    update_step(ours, torch.optim.SGD(weights.values(), lr=1.0), samples, LossConfig(method="rl"),
                micro_batch_size=micro_batch_size, grad_clip=float("inf"))
    clawrl_grads = {name: before[name] - weights[name].detach() for name in weights}  # SGD, lr 1: −Δw
    for name, parameter in weights.items():
        parameter.data.copy_(before[name])
    trainer.model.zero_grad(set_to_none=True)
    trl_accumulate(trainer, samples, micro_batch_size)
    # PEFT and the fused head leave parameter names alone, so the two models' names match.
    trl_grads = {name: parameter.grad for name, parameter in trainable(trainer.model).items()}
    trainer.model.zero_grad(set_to_none=True)
    scale = max(grad.abs().max().item() for grad in clawrl_grads.values())
    return max((clawrl_grads[name] - trl_grads[name]).abs().max().item() for name in clawrl_grads) / scale


def measure(shape: str, args: argparse.Namespace, scratch: Path) -> ShapeResult:
    model_dir = build_model_dir(shape, scratch)
    ours = load_policy(model_dir, args.full, args.device)
    samples = make_samples(ours, args)
    theirs = copy.deepcopy(ours)  # identical weights, adapter included, before TRL patches its copy
    trainer = trl_trainer(theirs, model_dir, scratch)
    grad_diff = grad_difference(ours, trainer, samples, args.micro_batch_size)

    config = LossConfig(method="rl")
    our_optimizer = torch.optim.AdamW(trainable(ours).values(), lr=LEARNING_RATE)
    trl_optimizer = torch.optim.AdamW(trainable(trainer.model).values(), lr=LEARNING_RATE)

    peaks: dict[str, list[float]] = {"ours": [], "trl": []}

    def time_ours() -> float:
        started = time.perf_counter()
        with PeakMemory(args.device) as memory:
            update_step(ours, our_optimizer, samples, config, micro_batch_size=args.micro_batch_size, grad_clip=GRAD_CLIP)
        peaks["ours"].append(memory.peak_mib)
        return time.perf_counter() - started

    def time_trl() -> float:
        started = time.perf_counter()
        with PeakMemory(args.device) as memory:
            trl_step(trainer, trl_optimizer, samples, args.micro_batch_size)
        peaks["trl"].append(memory.peak_mib)
        return time.perf_counter() - started

    ours_s, trl_s = [], []
    for repetition in range(args.repeats + 1):  # the first is a warm-up
        if repetition % 2 == 0:
            our_time = time_ours()
            trl_time = time_trl()
        else:
            trl_time = time_trl()
            our_time = time_ours()
        if repetition:
            ours_s.append(our_time)
            trl_s.append(trl_time)
    response_tokens = sum(len(example.turn.response_token_ids) for example in samples)
    ours_median, trl_median = statistics.median(ours_s), statistics.median(trl_s)
    return ShapeResult(
        shape=shape,
        parameters=sum(parameter.numel() for parameter in ours.parameters()),
        trainable_parameters=sum(parameter.numel() for parameter in trainable(ours).values()),
        samples=len(samples),
        response_tokens=response_tokens,
        prompt_tokens=sum(len(example.turn.prompt_token_ids) for example in samples),
        clawrl_step_s=ours_median,
        trl_step_s=trl_median,
        clawrl_tokens_per_s=response_tokens / ours_median,
        trl_tokens_per_s=response_tokens / trl_median,
        ratio=trl_median / ours_median,
        paired_ratio=statistics.median(t / o for o, t in zip(ours_s, trl_s)),
        max_grad_diff=grad_diff,
        clawrl_peak_mib=max(peaks["ours"][1:]),  # the warm-up step allocates the optimizer state
        trl_peak_mib=max(peaks["trl"][1:]),
    )


def markdown(results: list[ShapeResult], args: argparse.Namespace) -> str:
    kind = "full fine-tuning" if args.full else "LoRA r16"
    lines = [
        f"{args.batch_size} samples per step, micro-batches of {args.micro_batch_size}, {kind}, "
        f"median of {args.repeats} steps:",
        "",
        "| shape | params | response tokens/step | clawrl tokens/s | TRL GRPO tokens/s | ratio (clawrl/TRL) "
        "| paired ratio | max grad diff | clawrl peak (MiB) | TRL peak (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        lines.append(
            f"| {result.shape} | {result.parameters / 1e6:.2f}M | {result.response_tokens} | "
            f"{result.clawrl_tokens_per_s:.0f} | {result.trl_tokens_per_s:.0f} | **{result.ratio:.2f}×** | "
            f"{result.paired_ratio:.2f}× | {result.max_grad_diff:.1e} | {result.clawrl_peak_mib:.0f} | "
            f"{result.trl_peak_mib:.0f} |"
        )
    return "\n".join(lines)


def machine_with_trl() -> dict[str, Any]:
    import trl

    return machine(trl=trl.__version__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="tiny,small", help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="samples per forward/backward")
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--prompt-max", type=int, default=384)
    parser.add_argument("--response-min", type=int, default=32)
    parser.add_argument("--response-max", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=7, help="timed steps per side (after one warm-up)")
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of a LoRA adapter")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--cpu-threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batch")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/trainer_throughput.json"), help="JSON results"
    )
    args = parser.parse_args(argv)
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}")
    if not 1 <= args.prompt_min <= args.prompt_max or not 1 <= args.response_min <= args.response_max:
        parser.error("need 1 <= min <= max for prompt and response lengths")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.cpu_threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as scratch:
        results = [measure(shape, args, Path(scratch)) for shape in args.shapes.split(",")]
    print(markdown(results, args))
    payload = {
        "benchmark": "trainer_throughput",
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "machine": machine_with_trl(),
        "elapsed_s": time.perf_counter() - started,
        "results": [asdict(result) for result in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
