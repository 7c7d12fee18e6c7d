"""What `--judge engine` costs the serving engine: calls and tokens per judged turn, and its share of the engine's time.

The served model judges its own turns (DESIGN §5): per judged turn m PRM samples and m hint
samples (`judge_by_sampling`), then, when there is more than one hint candidate, the overlap-guided
selection scores the response once under the student prompt and once per candidate under the
teacher prompt (`OverlapSelector`). This script plays `--turns` turns of the learning benchmark's
student on the engine (word problems, answered with the benchmark's sampling), each followed by a
correction, then judges every turn with the engine judge exactly as the judge worker does, and
counts what the judging asked of the engine: generation calls, score calls, prompt and generated
tokens, and the engine time spent, beside the time the answers took. Client turns and judging
run one after the other, so each time is the engine's alone.

    .venv/bin/python benchmarks/engine_judge_cost.py                       # tiny-pretrained, 8 turns
    .venv/bin/python benchmarks/engine_judge_cost.py --model DIR --device cuda --turns 16

On the tiny model the judge's outputs mean nothing (it never learnt to write a verdict, so it
writes until --judge-max-tokens); what is measured is the cost, which depends on lengths, not on
what the words say.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clawrl.config import BenchConfig, EngineConfig, JudgeConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, TokenStep
from clawrl.judge.engine_backend import EngineJudge
from clawrl.judge.selection import OverlapSelector
from clawrl.judge.worker import hint_candidates
from clawrl.model.chat import render_prompt
from clawrl.sim.models import resolve_model
from clawrl.sim.personas import STUDENT
from clawrl.sim.users import problems
from clawrl.types import NextState, Turn, TurnContext, TurnSampling

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

CORRECTION = STUDENT.evaluation.corrections[0]


@dataclass
class EngineUse:
    """What one side (answering or judging) asked of the engine."""

    generate_calls: int = 0
    score_calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    per_turn: list[float] = field(default_factory=list)


class CountedStream:
    """A generation stream whose tokens are counted into `use` as the consumer reads them."""

    def __init__(self, stream: GenerationStream, use: EngineUse) -> None:
        self.stream, self.use = stream, use

    def cancel(self) -> None:
        self.stream.cancel()

    async def __aiter__(self) -> AsyncIterator[TokenStep]:
        async for step in self.stream:
            self.use.generated_tokens += 1
            yield step


class CountingEngine:
    """Wraps an engine and counts the calls and tokens that pass through it into `use`."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.use = engine, EngineUse()
        self.tokenizer, self.model_name = engine.tokenizer, engine.model_name

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams) -> CountedStream:
        self.use.generate_calls += 1
        self.use.prompt_tokens += len(prompt_token_ids)
        return CountedStream(self.engine.generate(prompt_token_ids, sampling), self.use)

    async def score(self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0,
                    version: int | None = None):  # noqa: ANN201 - ScoredResponse
        self.use.score_calls += 1
        self.use.prompt_tokens += len(prompt_token_ids) + len(response_token_ids)
        return await self.engine.score(prompt_token_ids, response_token_ids, top_k=top_k, version=version)


async def answer(engine: CountingEngine, messages: list[dict], sampling: SamplingParams) -> tuple[list[int], list[int]]:
    prompt_ids = render_prompt(engine.tokenizer, messages, tools=None)
    response_ids = [step.token_id async for step in engine.generate(prompt_ids, sampling)]
    return prompt_ids, response_ids


async def run(args: argparse.Namespace) -> dict:
    config = EngineConfig(model=args.model, device=args.device, cpu_threads=args.threads)
    base = build_engine(config, resolve_model(config))
    await base.start()
    bench = BenchConfig()
    sampling = SamplingParams(temperature=bench.temperature, top_p=bench.top_p, max_tokens=bench.max_tokens, seed=0)
    judge_config = JudgeConfig(judge="engine", judge_max_tokens=args.judge_max_tokens)
    answering, judging = CountingEngine(base), CountingEngine(base)
    judge = EngineJudge(judging, votes=judge_config.prm_m, temperature=judge_config.judge_temperature,
                        max_tokens=judge_config.judge_max_tokens)
    selector = OverlapSelector(judging, judge_config.hint_top_k)
    cases = []
    for index, problem in enumerate(problems(random.Random(args.seed), args.turns)):
        messages = [{"role": "user", "content": problem.question}]
        started = time.perf_counter()
        prompt_ids, response_ids = await answer(answering, messages, sampling)
        answering.use.per_turn.append(time.perf_counter() - started)
        cases.append(_case(f"t{index}", messages, prompt_ids, response_ids, base.tokenizer.decode(response_ids)))
    for case in cases:
        started = time.perf_counter()
        verdict = await judge.judge(case)
        candidates = hint_candidates(case, verdict)
        if len(candidates) > 1:
            await selector.overlaps(case, candidates)
        judging.use.per_turn.append(time.perf_counter() - started)
    await base.close()
    for use in (answering, judging):
        use.use.seconds = sum(use.use.per_turn)
    return _report(args, answering.use, judging.use, judge_config.prm_m)


def _case(turn_id: str, messages: list[dict], prompt_ids: list[int], response_ids: list[int], text: str) -> TurnContext:
    turn = Turn(id=turn_id, session_id=turn_id, kind="main", model="bench", policy_version=0, messages=messages,
                tools=None, sampling=TurnSampling(), prompt_token_ids=prompt_ids, response_token_ids=response_ids,
                response_logprobs=[0.0] * len(response_ids), response_text=text, tool_calls=None, finish_reason="stop")
    return TurnContext(turn, NextState(turn_id, [{"role": "user", "content": CORRECTION}], turn_id), feedback=[])


def _report(args: argparse.Namespace, answering: EngineUse, judging: EngineUse, votes: int) -> dict:
    turns = args.turns
    per_turn = {name: {"generate_calls": use.generate_calls / turns, "score_calls": use.score_calls / turns,
                       "prompt_tokens": use.prompt_tokens / turns, "generated_tokens": use.generated_tokens / turns,
                       "seconds": use.seconds / turns}
                for name, use in (("answer", answering), ("judge", judging))}
    return {
        "model": args.model, "device": args.device, "turns": turns, "votes": votes,
        "judge_max_tokens": args.judge_max_tokens, "per_turn": per_turn,
        "judge_share_of_engine_time": judging.seconds / (judging.seconds + answering.seconds),
        "judge_to_answer_generated_tokens": judging.generated_tokens / max(1, answering.generated_tokens),
        "raw": {"answer": asdict(answering), "judge": asdict(judging)}, "machine": machine(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-pretrained")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--judge-max-tokens", type=int, default=JudgeConfig().judge_max_tokens)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/results/engine-judge-cost.json"))
    args = parser.parse_args()
    report = asyncio.run(run(args))
    for side, figures in report["per_turn"].items():
        print(f"{side:>6} per turn: " + ", ".join(f"{name} {value:.1f}" for name, value in figures.items()))
    print(f"judge share of the engine's time: {report['judge_share_of_engine_time']:.2f}; judge tokens generated "
          f"per answer token: {report['judge_to_answer_generated_tokens']:.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
