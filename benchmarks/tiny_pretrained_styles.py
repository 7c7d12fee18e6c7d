"""Does the pre-trained tiny model do what the learning benchmark needs of it? And how long is the build?

For each simulated user (student, teacher) and each way of asking, the share of sampled answers
to held-out word problems that satisfy the user's preference, sampled as `clawrl bench learn`
samples (temperature 1, top_p 0.95) and, for comparison, from the full distribution (top_p 1):

* `none`: the question as the user asks it in the benchmark: should be low (at most 0.3), but not
  zero, so that binary RL has successes to reinforce;
* `instruction`: the user's style request in the message; `hint`: a rule-judge hint appended in
  the OPD teacher's format (`[Hint] ...`); `memory`: hints listed in the system prompt (the memory
  arm): each should be high (at least 0.8), so the distillation teacher is worth distilling;
* `unseen_instruction`, `unseen_hint`, `unseen_memory`: the same, worded as the simulated users
  word them (the evaluation pool, never in the pre-training corpus): how far following carries
  over to requests the model has not memorised, before any training.

    python benchmarks/tiny_pretrained_styles.py --samples 128 [--rebuild]

`--rebuild` pre-trains from scratch into a temporary cache and reports the build time. Prints a
markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from clawrl.config import BenchConfig, EngineConfig
from clawrl.sim.pretrain import CONDITIONS, PretrainConfig, pretrained_model_path, style_rates

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=128, help="sampled answers per user and condition")
    parser.add_argument("--seed", type=int, default=0, help="pre-training seed")
    parser.add_argument("--rebuild", action="store_true", help="pre-train from scratch and time it")
    parser.add_argument("--out", default="benchmarks/results/tiny_pretrained_styles.json")
    args = parser.parse_args()

    torch.set_num_threads(1)
    build_seconds = None
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) if args.rebuild else EngineConfig().cache_dir
        started = time.perf_counter()
        model_dir = pretrained_model_path(cache, seed=args.seed)
        if args.rebuild:
            build_seconds = time.perf_counter() - started
        rates = {f"{user} (top_p {top_p:g})": by_condition
                 for top_p in (BenchConfig().top_p, 1.0)
                 for user, by_condition in style_rates(model_dir, samples=args.samples, top_p=top_p).items()}
        built = json.loads((model_dir / "pretrain.json").read_text())

    print(f"| user | {' | '.join(CONDITIONS)} |")
    print(f"|---|{'---|' * len(CONDITIONS)}")
    for user, by_condition in rates.items():
        print(f"| {user} | {' | '.join(f'{by_condition[c]:.2f}' for c in CONDITIONS)} |")
    if build_seconds is not None:
        print(f"\npre-training took {build_seconds:.0f} s ({PretrainConfig().steps} steps, {PretrainConfig().threads} threads)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "rates": rates, "samples": args.samples, "seed": args.seed, "build_seconds": build_seconds,
        "pretrain": built, "machine": machine(),
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
