"""The commands about models: `clawrl model build-tiny`, `clawrl model build-random` and
`clawrl plan` (the memory of serving and training one)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clawrl.cli.common import _print_json
from clawrl.config import EngineConfig
from clawrl.preflight import check_device, check_model, check_writable_dir


def cmd_build_tiny(args: argparse.Namespace) -> int:
    check_writable_dir(Path(args.out), "--out")
    if args.pretrain:
        import shutil

        from clawrl.sim.pretrain import pretrained_model_path

        # built once into the cache (minutes), then copied: `--model tiny-pretrained` reuses the same build
        cached = pretrained_model_path(EngineConfig().cache_dir, seed=args.seed)
        shutil.copytree(cached, args.out, dirs_exist_ok=True)
        print(args.out)
        return 0
    from clawrl.sim.tiny import build_tiny_model

    path = build_tiny_model(Path(args.out), seed=args.seed)
    print(path)
    return 0


def cmd_build_random(args: argparse.Namespace) -> int:
    check_writable_dir(Path(args.out), "--out")
    check_device(args.device)
    from clawrl.model.random_weights import build_random_model
    from clawrl.model.shapes import architecture_of
    from clawrl.sim.corpus import build_corpus
    from clawrl.sim.tiny import CORPUS_SEED, train_tokenizer

    # the tiny model's tokenizer, widened to the architecture's vocabulary by made-up merges
    tokenizer = train_tokenizer(build_corpus(CORPUS_SEED))
    path = build_random_model(Path(args.out), architecture_of(args.like), tokenizer, dtype=args.dtype, seed=args.seed,
                              device=args.device)  # fmt: skip
    print(path)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from clawrl.model.plan import Workload, plan, table
    from clawrl.model.shapes import architecture_of, architecture_of_config

    if args.model:
        config_file = Path(check_model(args.model, needs_weights=False)) / "config.json"
        shape = architecture_of_config(json.loads(config_file.read_text()))
    else:
        shape = architecture_of(args.like)
    fields = {name: getattr(args, name) for name in Workload.__dataclass_fields__ if hasattr(args, name)}
    result = plan(shape, Workload(**fields, dtype_bytes=2 if args.dtype == "bfloat16" else 4), args.gpu_memory)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(table(result))
    return 0 if result.fits is not False else 2
