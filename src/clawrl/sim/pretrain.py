"""The pre-trained tiny model: about a million parameters that answer word problems in styles.

`clawrl bench learn` needs a model that can be taught something in a few dozen sessions on a
CPU. A randomly initialised model cannot: it has no behaviour to reinforce. This one is trained
from scratch, in about three minutes on two cores, on the conversations of ``clawrl.sim.chats``,
so that it answers a word problem with a worked solution, AI-like by default and sometimes the
way the student or the teacher wants, and follows an instruction, a ``[Hint]`` (the OPD teacher's
prompt), a complaint or a memory note asking for a style.

The conversations are rendered with the tiny chat template (``clawrl.sim.tiny``) and trained on
their assistant tokens only, with the tiny model's tokenizer. Building is deterministic from the
seed (same thread count, same bytes) and cached under a hash of everything that determines the
result (``pretrained_model_path``). `style_rates` measures what it learned, and how far it
carries over to requests worded as the simulated users word them, which it never saw.

The shape (hidden 128, 4 layers, 1.05M parameters) is what fits the time budget: a 2M-parameter
model (hidden 192) trained for the same three minutes follows hints less reliably (0.69 against
0.91), because it sees half the conversations.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen2ForCausalLM

from clawrl.messages import teacher_messages
from clawrl.sim.chats import DEFAULT_STYLES, HINTS, Chat, ask, chat
from clawrl.sim.corpus import Problem, build_corpus
from clawrl.sim.memory import DEFAULT_SYSTEM_PROMPT, system_prompt_with_notes
from clawrl.sim.personas import PERSONAS, Persona, evaluation_hints
from clawrl.sim.tiny import CORPUS_SEED, END_OF_TEXT, IM_END, TINY_VERSION, tiny_config, train_tokenizer
from clawrl.sim.users import problems

log = logging.getLogger(__name__)

# Bump when the training procedure changes in a way the config and the corpus sample do not show.
PRETRAIN_VERSION = "pretrain-v1"

# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines the pre-trained weights, besides the code and the seed."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    max_tokens: int = 384  # longer conversations are cut (rare: a corrected chat of three problems)
    threads: int = 2  # CPU results depend on the thread count; fixed, so the same seed gives the same bytes
    # The unprompted style mix (`chats.DEFAULT_STYLES` when None, today's model): ((style, weight), ...),
    # e.g. `tuple(chats.style_mix("balanced").items())`
    styles: tuple[tuple[str, float], ...] | None = None

    def style_weights(self) -> dict[str, float]:
        """The unprompted style mix the conversations are drawn with."""
        return DEFAULT_STYLES if self.styles is None else dict(self.styles)  # type: ignore[return-value]

    def identity(self) -> dict[str, object]:
        """The settings as the cache key and pretrain.json record them: the default mix (None, or the
        default's weights) is left out, so today's model keeps its key and its record, bit for bit."""
        settings = asdict(self)
        if self.styles is None or self.styles == tuple(DEFAULT_STYLES.items()):
            del settings["styles"]
        else:
            settings["styles"] = dict(self.styles)
        return settings

    def shape(self) -> dict[str, int]:
        return {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
        }


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer every tiny model shares (trained on the fixed-seed corpus)."""
    return train_tokenizer(build_corpus(CORPUS_SEED))


def encode_chat(tokenizer: PreTrainedTokenizerFast, messages: Chat, max_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation, and labels that keep only the assistant tokens."""
    encoded = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    ids = encoded["input_ids"][:max_tokens]
    labels = [token if keep else -100 for token, keep in zip(ids, encoded["assistant_masks"][:max_tokens], strict=True)]
    return ids, labels


def pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (row_ids, row_labels) in enumerate(rows):
        ids[row, : len(row_ids)] = torch.tensor(row_ids)
        labels[row, : len(row_labels)] = torch.tensor(row_labels)
        mask[row, : len(row_ids)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


BUCKET_BATCHES = 8


def _length_bucketed_batches(tokenizer: PreTrainedTokenizerFast, rng: random.Random,
                             config: PretrainConfig) -> list[list[tuple[list[int], list[int]]]]:
    """`BUCKET_BATCHES` batches of conversations of similar length, in random order.

    Conversations range from 60 to 400 tokens; batching neighbours in length instead of random
    ones halves the padding, and with it the time per step.
    """
    styles = config.style_weights()
    rows = [encode_chat(tokenizer, chat(rng, styles), config.max_tokens)  # type: ignore[arg-type]
            for _ in range(config.batch_size * BUCKET_BATCHES)]
    rows.sort(key=lambda row: len(row[0]))
    batches = [rows[start : start + config.batch_size] for start in range(0, len(rows), config.batch_size)]
    rng.shuffle(batches)
    return batches


def learning_rate(config: PretrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@dataclass
class PretrainLog:
    """Loss per step, for the command's progress line and for tests."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def pretrain(out_dir: Path, seed: int = 0, config: PretrainConfig = PretrainConfig(),
             progress: Callable[[int, float], None] | None = None) -> PretrainLog:
    """Train the tiny model from scratch on generated conversations; write it to `out_dir`."""
    started = time.perf_counter()
    tokenizer = tiny_tokenizer()
    model_config = tiny_config(tokenizer, config.shape())
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    log = PretrainLog()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(model_config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95),
                                          weight_decay=config.weight_decay)
            model.train()
            batches: list[list[tuple[list[int], list[int]]]] = []
            for step in range(config.steps):
                if not batches:
                    batches = _length_bucketed_batches(tokenizer, rng, config)
                rows = batches.pop()
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(config, step)
                loss = model(**pad_batch(rows, model_config.pad_token_id)).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                log.losses.append(loss.item())
                if progress is not None:
                    progress(step, log.losses[-1])
    finally:
        torch.set_num_threads(threads)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    model.generation_config = GenerationConfig(eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    log.seconds = time.perf_counter() - started
    (Path(out_dir) / "pretrain.json").write_text(json.dumps(
        {"seed": seed, "config": config.identity(), "final_loss": sum(log.losses[-20:]) / max(1, len(log.losses[-20:])),
         "seconds": round(log.seconds, 1), "build": build_environment(), "weights_sha256": weights_digest(out_dir)},
        indent=2))
    return log


def build_environment() -> dict[str, str]:
    """What the pre-trained weights depend on besides the seed, the corpus and the settings.

    The same seed gives the same weights only with the same float arithmetic: the CPU's vector unit
    as PyTorch dispatches to it (AVX2, AVX512, ...), the BLAS library and the torch version pick the
    kernels, and the thread count the order of the sums (fixed by `PretrainConfig.threads`). Two
    machines that differ in any of these pre-train different models (issue 28: a held-out score of
    0.64 against 0.74 for the same seeds), so reports record the build they used.
    """
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
        "mkl": str(torch.backends.mkl.is_available()),
    }


def weights_digest(model_dir: Path) -> str:
    """sha256 of the saved weights: equal digests mean two builds are the same model, bit for bit."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# --------------------------------------------------------------------------- checking what it learned

UNSEEN = "unseen_"
CONDITIONS = ("none", "instruction", "hint", "memory", f"{UNSEEN}instruction", f"{UNSEEN}hint", f"{UNSEEN}memory")


def check_prompt(persona: Persona, condition: str, rng: random.Random) -> tuple[Chat, Problem]:
    """A held-out prompt for `persona` under `condition`, and its problem.

    `none` is how the persona asks in the benchmark; `instruction` adds one of its style requests,
    `hint` appends a rule-judge hint drawn from its complaints, `memory` puts hints in the system
    prompt. These draw from the pre-training pool, whose wordings the model was trained on; the
    `unseen_` conditions draw from the evaluation pool, worded as the simulated user words them
    and never seen in pre-training.
    """
    problem = problems(rng, 1)[0]
    question = ask(persona, problem.question, rng)
    unseen = condition.startswith(UNSEEN)
    requests = persona.evaluation if unseen else persona.pretraining
    hints = sorted(evaluation_hints(persona)) if unseen else HINTS[persona.name]
    condition = condition.removeprefix(UNSEEN)
    if condition == "instruction":
        question = f"{question} {rng.choice(requests.instructions)}"
    system = system_prompt_with_notes(rng.sample(hints, k=2)) if condition == "memory" else DEFAULT_SYSTEM_PROMPT
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    if condition == "hint":
        messages = teacher_messages(messages, rng.choice(hints))
    return messages, problem


@torch.no_grad()
def sample_answers(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, prompts: list[Chat],
                   max_new_tokens: int = 256, seed: int = 0, top_p: float = 1.0) -> list[str]:
    """One answer per prompt, sampled at temperature 1 with nucleus `top_p`."""
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def style_rates(model_dir: Path, samples: int = 64, seed: int = 12345, top_p: float = 1.0) -> dict[str, dict[str, float]]:
    """{persona: {condition: share of sampled answers that satisfy the persona}} on held-out problems."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rates: dict[str, dict[str, float]] = {}
    for persona in PERSONAS.values():
        rates[persona.name] = {}
        for condition in CONDITIONS:
            rng = random.Random(f"{seed}-{persona.name}-{condition}")
            cases = [check_prompt(persona, condition, rng) for _ in range(samples)]
            answers = []
            for start in range(0, samples, 32):
                chunk = cases[start : start + 32]
                answers += sample_answers(model, tokenizer, [messages for messages, _ in chunk], seed=seed + start, top_p=top_p)
            hits = sum(persona.satisfied(answer, problem) for answer, (_, problem) in zip(answers, cases, strict=True))
            rates[persona.name][condition] = hits / samples
    return rates


# --------------------------------------------------------------------------- the cache

PRETRAINED_NAME = "tiny-pretrained"
DIGEST_CHATS = 64


def content_key(seed: int, config: PretrainConfig) -> str:
    """A hash of everything that determines the weights: versions, seed, config, and the corpus itself.

    The corpus enters as a digest of conversations it generates, so a change to any phrasing,
    style or hint (here, in the users, or in the rule judge's hint extraction) is a new key.
    """
    rng = random.Random(f"digest-{seed}")
    styles = config.style_weights()
    sample = [chat(rng, styles) for _ in range(DIGEST_CHATS)]  # type: ignore[arg-type]
    identity = {"version": PRETRAIN_VERSION, "tiny": TINY_VERSION, "seed": seed, "config": config.identity(),
                "corpus": sample}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def pretrained_model_path(cache_dir: Path, seed: int = 0, config: PretrainConfig = PretrainConfig()) -> Path:
    """The cached pre-trained model for (`seed`, `config`), built first when missing.

    Building takes minutes, and `clawrl serve` and its trainer may ask at the same moment, so
    builders take a lock: the second waits for the first and reuses its result. The model is
    written to a staging directory and renamed into place, so a reader never sees half of it.
    """
    target = Path(cache_dir) / f"{PRETRAINED_NAME}-seed{seed}-{content_key(seed, config)}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            pretrain(staging, seed, config, progress=_log_progress(config))
            staging.chmod(0o755)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _log_progress(config: PretrainConfig) -> Callable[[int, float], None]:
    log.info("pre-training the tiny model (%d steps; a few minutes on a CPU, once)", config.steps)

    def report(step: int, loss: float) -> None:
        if (step + 1) % 100 == 0 or step + 1 == config.steps:
            log.info("pre-training step %d/%d, loss %.3f", step + 1, config.steps, loss)

    return report
