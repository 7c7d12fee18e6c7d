"""What a tiny terminal agent does first, offline: the share of sampled first commands that are the reference solution.

Before a learning run, this says whether the agent can solve the micro split at all. Each task's
opening (system prompt, tools, instruction) is rendered as the server would, the agent samples
`--samples` first answers at temperature 1, and each is sorted: `exact` (the reference solution's
commands, as the solve habit runs them), `wrong` (another shell command: usually the right command
about the wrong names), `typo` and `ls` (the failing habits), `finish`, `other` (no tool call).

    .venv/bin/python benchmarks/agent_first_commands.py [--model DIR] [--samples 12] [--json]

Without `--model` it measures the cached tiny terminal agent (built first when missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.envs.terminal.env import TerminalEnv
from clawrl.envs.terminal.tasks import generated_tasks_dir
from clawrl.sim.agent_cache import agent_model_path
from clawrl.sim.agents import TERMINAL_MICRO, micro_env_config, solution_command

KINDS = ("exact", "wrong", "typo", "ls", "finish", "other")
_COMMAND = re.compile(r'"command":\s*"((?:[^"\\]|\\.)*)"')


async def openings(tasks: list[str]) -> dict[str, tuple[list[dict[str, Any]], list[Any]]]:
    """Each task's first messages and tools, from a real reset of the environment."""
    micro = micro_env_config("terminal")
    opened = {}
    for task in tasks:
        env = TerminalEnv(micro)
        observation = await env.reset(0, task)
        opened[task] = ([message.to_openai() for message in observation.messages], observation.tools)
        await env.close()
    return opened


def kind_of(answer: str, reference: str) -> str:
    match = _COMMAND.search(answer)
    if match is None:
        return "finish" if '"finish"' in answer else "other"
    command = json.loads(f'"{match.group(1)}"', strict=False).strip()
    if command == reference.strip():
        return "exact"
    return "ls" if command == "ls" else "typo" if command.startswith("x") else "wrong"


def measure(model_dir: Path, samples: int, seed: int) -> dict[str, Any]:
    micro = micro_env_config("terminal")
    tasks_dir = generated_tasks_dir(micro.cache_dir, micro.terminal_seed)
    tasks = sorted(path.name for path in tasks_dir.iterdir() if path.name.startswith(TERMINAL_MICRO))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    per_task: dict[str, dict[str, int]] = {}
    for task, (messages, tools) in asyncio.run(openings(tasks)).items():
        reference = solution_command((tasks_dir / task / "solution" / "solve.sh").read_text())
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)["input_ids"]  # fmt: skip
        with torch.no_grad():
            rows = model.generate(prompt, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=96,
                                  num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        answers = [tokenizer.decode(row[prompt.shape[1] :]) for row in rows]
        per_task[task] = dict(Counter(kind_of(answer, reference) for answer in answers))
    totals = Counter()
    for counts in per_task.values():
        totals.update(counts)
    return {"model": str(model_dir), "samples": samples, "totals": {kind: totals[kind] for kind in KINDS},
            "exact_share": totals["exact"] / (samples * len(tasks)), "tasks": per_task}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="an agent directory (default: the cached tiny terminal agent)")
    parser.add_argument("--samples", type=int, default=12, help="first answers sampled per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or agent_model_path(micro_env_config("terminal").cache_dir, "terminal")
    result = measure(model_dir, args.samples, args.seed)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
        return
    print("task                               " + " ".join(f"{kind:>6}" for kind in KINDS))
    for task, counts in result["tasks"].items():
        print(f"{task:<35}" + " ".join(f"{counts.get(kind, 0):>6}" for kind in KINDS))
    print(f"{'total':<35}" + " ".join(f"{result['totals'][kind]:>6}" for kind in KINDS))
    print(f"exact share: {result['exact_share']:.3f}")


if __name__ == "__main__":
    main()
