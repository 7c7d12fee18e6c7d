"""The update on a batch of examples: DESIGN §6.

`update_step` packs the examples into micro-batches, runs the policy over each, builds the
per-token advantage of the chosen method, accumulates the gradients of the PPO loss (plus the
optional KL, entropy and top-K terms) and takes an optimizer step: one per batch by default;
with `ppo_epochs` passes over the batch in `mini_batches` parts, one per part and pass. Each
response token's weight in a step's loss (`LossConfig.loss_agg`: 1/N for the token mean,
1/(B·len) for the per-sequence mean, 1/(B·C) for the constant normaliser) is computed from the
*whole* batch (or mini-batch, each normalised as a batch of its own) before the micro-batches
run, so the accumulated gradient is exactly that of the one batch loss, and peak memory is set
by `micro_batch_size` alone.

π_old, the proximal policy of decoupled PPO, is the log-probs of the weights the batch starts
from. With one step per batch (the default) the weights do not change while the micro-batches
run, so each micro-batch's own forward pass already computes π_old: its detached log-probs *are*
the no-grad forward a separate pass would give, and skipping that pass saves a third of the
compute. There ρ = π_θ/π_old = 1 at every token: the PPO clip never acts (`eps_low`/`eps_high`
change nothing) and clip fraction and approximate KL read 0; the truncated importance weights
min(π_old/π_behaviour, cap) carry the off-policy correction. With more than one step per batch
(`ppo_epochs` > 1 or `mini_batches` > 1), `proximal_scores` computes π_old once, in a no-grad
pass over the batch before the first step (same micro-batches, same scoring code), and every
step keeps it: a later step's ρ measures how far the earlier steps moved the policy, the clip
stops the gradient of a token whose ρ left [1 − eps_low, 1 + eps_high] the way its advantage
pushes, and `clip_fraction` and `approx_kl` report the real figures (means over the steps). The
advantages and importance weights, functions of π_old, stay fixed over the epochs. The price is
that extra forward pass plus a forward and backward pass per step (docs/notes.md, "An honest
objective").

Each micro-batch's token ids are packed and scored by `clawrl.model.scoring` (prompts
left-padded so that every response starts in one column, only the last R columns scored), the
very code the engine and the OPD teacher score with, so π_old, π_ref and the teacher's log-probs
are computed alike. The vocabulary-sized logits are never whole: `response_scores` computes the
log-probs, entropies and top-K log-probs `logit_chunk_tokens` positions at a time and recomputes
each chunk in the backward pass, so they cost [chunk, V] however long the responses and batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from peft import PeftModel
from torch import Tensor

from clawrl.config import LossConfig
from clawrl.model.scoring import (
    PackedRows,
    can_share_prefix,
    flat_tree,
    pack_rows,
    packed_positions,
    prefix_tree,
    response_scores,
)
from clawrl.train.data_parallel import all_gather_scores, all_reduce_gradients, all_reduce_sum, shard
from clawrl.train.losses import (
    aggregate,
    combined_advantage,
    kl_k3,
    opd_advantage,
    ppo_clipped_loss,
    sequence_weights,
    topk_reverse_kl_at,
    truncated_importance_weights,
)
from clawrl.types import StepMetrics
from clawrl.types import TrainingExample


@dataclass
class MicroBatch:
    """Samples packed into tensors: their token rows, plus what the loss needs per response token."""

    rows: PackedRows  # token ids, masks and positions; R = the longest response
    behaviour_logprobs: Tensor  # [B, R]
    rewards: Tensor  # [B]
    teacher_logprobs: Tensor  # [B, R], 0 where has_teacher is false
    has_teacher: Tensor  # [B] bool: the token-level OPD term applies
    topk_ids: Tensor | None  # [B, R, K] when any sample uses the top-K term
    topk_logprobs: Tensor | None  # [B, R, K]
    has_topk: Tensor  # [B] bool: the top-K term applies
    agg_weights: Tensor  # [B, R] each response token's weight in the batch loss, 0 on padding
    # [B, R] log π_old and log π_ref from the pass before a batch's first step (`proximal_scores`);
    # None: π_old is the micro-batch's own forward pass detached, π_ref computed with it
    old_logprobs: Tensor | None = None
    reference_logprobs: Tensor | None = None
    # [B, R, W] int32 grammar masks (`model.constraints`); None when no response was decoded under one
    allowed_bits: Tensor | None = None

    @property
    def response_ids(self) -> Tensor:
        """[B, R] the response tokens, right-padded: the targets of the loss."""
        return self.rows.response_ids

    @property
    def mask(self) -> Tensor:
        """[B, R] bool: a real response token, the tokens every sum of the loss runs over."""
        return self.rows.mask


def _uses_topk(example: TrainingExample, config: LossConfig) -> bool:
    return config.method != "rl" and config.opd_topk > 0 and example.sample.teacher_topk_ids is not None


def _uses_teacher_logprobs(example: TrainingExample, config: LossConfig) -> bool:
    return config.method != "rl" and example.sample.teacher_logprobs is not None and not _uses_topk(example, config)


def _check(example: TrainingExample, config: LossConfig) -> None:
    length = len(example.turn.response_token_ids)
    if len(example.turn.response_logprobs) != length:
        count = len(example.turn.response_logprobs)
        raise ValueError(f"sample {example.turn.id}: {count} behaviour log-probs for {length} response tokens")
    if example.sample.teacher_logprobs is not None and len(example.sample.teacher_logprobs) != length:
        raise ValueError(f"sample {example.turn.id}: {len(example.sample.teacher_logprobs)} teacher log-probs, {length} tokens")
    if _uses_topk(example, config):
        ids, logprobs = example.sample.teacher_topk_ids or [], example.sample.teacher_topk_logprobs or []
        if len(ids) != length or len(logprobs) != length:
            raise ValueError(f"sample {example.turn.id}: teacher top-K lists do not cover its {length} tokens")
        if any(len(row) < config.opd_topk for row in ids) or any(len(row) < config.opd_topk for row in logprobs):
            raise ValueError(f"sample {example.turn.id}: fewer than opd_topk={config.opd_topk} teacher entries")


def batch_weights(examples: Sequence[TrainingExample], config: LossConfig) -> list[float]:
    """Each example's per-token weight in the loss of the batch `examples` (`losses.sequence_weights`)."""
    lengths = torch.tensor([len(example.turn.response_token_ids) for example in examples], dtype=torch.float64)
    return sequence_weights(lengths, config.loss_agg, config.loss_agg_tokens).tolist()


def pack_examples(
    examples: list[TrainingExample],
    config: LossConfig,
    device: torch.device,
    weights: Sequence[float] | None = None,
    share_prefix: bool = False,
) -> MicroBatch:
    """The tensors of one micro-batch (token rows laid out by `pack_rows`, per-token values right-padded).

    `weights` are the examples' per-token weights in the whole batch's loss (`batch_weights` of
    the batch); left out, `examples` are taken to be the whole batch. `share_prefix`: the prompts'
    common prefix is computed once (`pack_rows`).
    """
    for example in examples:
        _check(example, config)
    if weights is None:
        weights = batch_weights(examples, config)
    rows = pack_rows(
        [example.prompt_token_ids for example in examples],
        [example.turn.response_token_ids for example in examples],
        device,
        share_prefix=share_prefix,
    )
    response_width = rows.response_ids.shape[1]
    behaviour, teacher = [], []
    for example in examples:
        right = response_width - len(example.turn.response_token_ids)
        behaviour.append(example.turn.response_logprobs + [0.0] * right)
        teacher_row = example.sample.teacher_logprobs if _uses_teacher_logprobs(example, config) else None
        teacher.append((teacher_row or [0.0] * len(example.turn.response_token_ids)) + [0.0] * right)
    has_topk = [_uses_topk(example, config) for example in examples]
    topk_ids, topk_logprobs = _pack_topk(examples, has_topk, config.opd_topk, response_width, device)
    return MicroBatch(
        rows=rows,
        behaviour_logprobs=torch.tensor(behaviour, dtype=torch.float32, device=device),
        rewards=torch.tensor([float(example.sample.reward) for example in examples], dtype=torch.float32, device=device),
        teacher_logprobs=torch.tensor(teacher, dtype=torch.float32, device=device),
        has_teacher=torch.tensor([_uses_teacher_logprobs(example, config) for example in examples], device=device),
        topk_ids=topk_ids,
        topk_logprobs=topk_logprobs,
        has_topk=torch.tensor(has_topk, dtype=torch.bool, device=device),
        agg_weights=torch.where(
            rows.mask, torch.tensor(list(weights), dtype=torch.float32, device=device).unsqueeze(1), 0.0
        ),
        allowed_bits=_pack_allowed(examples, response_width, device),
    )


def _pack_allowed(examples: list[TrainingExample], width: int, device: torch.device) -> Tensor | None:
    """[B, R, W] the examples' grammar masks, every token allowed where a row has none (or is padding)."""
    masks = [example.allowed_bits for example in examples]
    if all(mask is None for mask in masks):
        return None
    words = next(mask for mask in masks if mask is not None).shape[-1]
    packed = torch.full((len(examples), width, words), -1, dtype=torch.int32)
    for row, mask in enumerate(masks):
        if mask is not None:
            packed[row, : mask.shape[0]] = mask
    return packed.to(device)


def _pack_topk(
    examples: list[TrainingExample], has_topk: list[bool], k: int, width: int, device: torch.device
) -> tuple[Tensor | None, Tensor | None]:
    """[B, R, K] teacher ids and log-probs (each position's first K entries); None if no sample uses them."""
    if not any(has_topk):
        return None, None
    ids = torch.zeros(len(examples), width, k, dtype=torch.long)
    logprobs = torch.zeros(len(examples), width, k, dtype=torch.float32)
    for row, (example, used) in enumerate(zip(examples, has_topk)):
        if used and example.turn.response_token_ids:
            length = len(example.turn.response_token_ids)
            ids[row, :length] = torch.tensor([position[:k] for position in example.sample.teacher_topk_ids or []])
            logprobs[row, :length] = torch.tensor([position[:k] for position in example.sample.teacher_topk_logprobs or []])
    return ids.to(device), logprobs.to(device)


def _reference_logprobs(
    model: torch.nn.Module, reference_model: torch.nn.Module | None, batch: MicroBatch, chunk_tokens: int
) -> Tensor:
    """log π_ref of the response tokens: the adapter-free base of a PEFT model, else `reference_model`."""
    if isinstance(model, PeftModel):
        reference, context = model, model.disable_adapter()
    elif reference_model is not None:
        reference, context = reference_model, nullcontext()
    else:
        raise ValueError("kl_beta > 0 needs a reference: a PEFT model, or reference_model for full fine-tuning")
    with torch.no_grad(), context:
        return response_scores(reference, batch.rows, chunk_tokens=chunk_tokens, allowed_bits=batch.allowed_bits).logprobs


def advantages(batch: MicroBatch, old_logprobs: Tensor, config: LossConfig) -> Tensor:
    """Per-token advantage [B, R] of the configured method (see `LossConfig.method`).

    rl: w_rl·r. opd: w_opd·clip(teacher − old, ±C) for examples with teacher log-probs, 0 for
    examples distilled through the top-K term, w_rl·r for the others (no teacher signal: RL term
    only). combine: w_rl·r, plus w_opd·clip(teacher − old, ±C) where teacher log-probs exist.
    """
    rl_term = combined_advantage(batch.rewards, torch.zeros_like(old_logprobs), config.w_rl, 0.0)
    if config.method == "rl":
        return rl_term
    has_teacher = batch.has_teacher.unsqueeze(1)
    teacher_term = torch.where(
        has_teacher, opd_advantage(batch.teacher_logprobs, old_logprobs, config.opd_clip), torch.zeros_like(rl_term)
    )
    if config.method == "combine":
        return combined_advantage(batch.rewards, teacher_term, config.w_rl, config.w_opd)
    without_teacher = torch.where(batch.has_topk.unsqueeze(1), torch.zeros_like(rl_term), rl_term)
    return torch.where(has_teacher, config.w_opd * teacher_term, without_teacher)


def micro_batches(
    examples: list[TrainingExample], size: int, max_tokens: int | None = None, share_prefix: bool = False
) -> Iterator[list[TrainingExample]]:
    """Chunks of at most `size` examples, ordered so that each chunk pads (and, sharing, repeats) little.

    Examples are sorted by length, so that a chunk pads as little as possible; with `share_prefix`,
    by their prompts' tokens first (lexicographically), which puts a session's turns, a group's
    rollouts and everything sent with one system prompt next to each other, longest shared part
    first, so that a chunk's prompts form a prefix tree with as much in common as the batch has.
    The order changes which examples share a forward pass, never what the step trains on. With
    `max_tokens`, a chunk also ends before its packed size (`packed_tokens`: what `pack_rows` lays
    out, padding included) would pass it: a count alone lets four 24K-token agent prompts into one
    forward pass as readily as four chat turns. An example over the budget on its own still gets
    a chunk of its own (it was admitted by the context limit).
    """

    def order(example: TrainingExample) -> tuple[Any, ...]:
        lengths = (len(example.prompt_token_ids), len(example.turn.response_token_ids))
        return (example.prompt_token_ids, *lengths) if share_prefix else lengths

    chunk: list[TrainingExample] = []
    for example in sorted(examples, key=order):
        over_budget = max_tokens is not None and packed_tokens([*chunk, example], share_prefix) > max_tokens
        if chunk and (len(chunk) == size or over_budget):
            yield chunk
            chunk = []
        chunk.append(example)
    if chunk:
        yield chunk


def _own_chunks(
    chunks: list[list[TrainingExample]], share_prefix: bool, group: dist.ProcessGroup | None
) -> list[list[TrainingExample]]:
    """The micro-batches this process runs: all of them alone, else its share by packed tokens (`data_parallel.shard`)."""
    if group is None:
        return chunks
    owners = shard([packed_tokens(chunk, share_prefix) for chunk in chunks], dist.get_world_size(group))
    rank = dist.get_rank(group)
    return [chunk for chunk, owner in zip(chunks, owners) if owner == rank]


def packed_tokens(examples: Sequence[TrainingExample], share_prefix: bool) -> int:
    """Token positions `pack_rows` lays out for `examples`: each shared prefix once, then every row's padded rest."""
    prompts = [example.prompt_token_ids for example in examples]
    responses = [example.turn.response_token_ids for example in examples]
    tree = prefix_tree(prompts) if share_prefix else flat_tree(len(examples))
    return packed_positions(prompts, responses, tree)


@dataclass
class _Totals:
    """Running sums over micro-batches, kept on the device (one synchronisation at the end)."""

    loss: Tensor
    clip_fraction: Tensor
    approx_kl: Tensor
    entropy: Tensor
    kl_to_reference: Tensor
    topk_reverse_kl: Tensor
    mean_advantage: Tensor
    logprob_drift: Tensor
    mean_is_weight: Tensor

    @classmethod
    def zeros(cls, device: torch.device) -> _Totals:
        return cls(*(torch.zeros((), device=device) for _ in range(9)))

    def add(self, other: _Totals, scale: float) -> None:
        """Add `scale` times each of `other`'s sums (one step's share of a mean over steps)."""
        for name, total in vars(other).items():
            getattr(self, name).add_(total, alpha=scale)


def split_batch(examples: list[TrainingExample], parts: int) -> list[list[TrainingExample]]:
    """`examples` cut into `parts` mini-batches, in their order, sizes differing by at most one.

    Fewer when there are fewer examples than `parts` (never an empty mini-batch). The order is the
    batch's own (the trainer's: oldest sample first), so a session's turns mostly stay together and
    keep sharing their prefix within a mini-batch; the split is the same in every epoch.
    """
    count = max(1, min(parts, len(examples)))
    size, extra = divmod(len(examples), count)
    result, start = [], 0
    for index in range(count):
        stop = start + size + (1 if index < extra else 0)
        result.append(examples[start:stop])
        start = stop
    return result


def proximal_scores(
    model: torch.nn.Module,
    reference_model: torch.nn.Module | None,
    examples: list[TrainingExample],
    config: LossConfig,
    micro_batch_size: int,
    micro_batch_tokens: int | None,
    share_prefix: bool,
    chunk_tokens: int,
    group: dist.ProcessGroup | None = None,
) -> dict[int, tuple[Tensor, Tensor | None]]:
    """log π_old (and log π_ref when `kl_beta` > 0) of each example's response tokens, by `id(example)`.

    One no-grad pass over the batch with the weights as they are, in the update's micro-batches and
    through the same scoring code as the steps (`response_scores`), so that before the first step
    the ratio is 1 up to rounding; the steps after it see π_θ move away from these. With a `group`,
    each rank scores its share of the micro-batches and every rank gets all the scores, the very
    numbers one process computes.
    """
    device = next(model.parameters()).device
    scores: dict[int, tuple[Tensor, Tensor | None]] = {}
    chunks = list(micro_batches(examples, micro_batch_size, micro_batch_tokens, share_prefix))
    with torch.no_grad():
        for chunk in _own_chunks(chunks, share_prefix, group):
            batch = pack_examples(chunk, config, device, [0.0] * len(chunk), share_prefix)
            if batch.response_ids.shape[1] == 0:
                continue
            reference = _reference_logprobs(model, reference_model, batch, chunk_tokens) if config.kl_beta > 0 else None
            old = response_scores(model, batch.rows, chunk_tokens=chunk_tokens, allowed_bits=batch.allowed_bits).logprobs
            for row, example in enumerate(chunk):
                length = len(example.turn.response_token_ids)
                scores[id(example)] = (old[row, :length], reference[row, :length] if reference is not None else None)
    if group is None:
        return scores
    index_of = {id(example): index for index, example in enumerate(examples)}  # ids do not cross processes
    gathered = all_gather_scores({index_of[key]: value for key, value in scores.items()}, device, group)
    return {id(examples[index]): value for index, value in gathered.items()}


def _rows_of(
    chunk: list[TrainingExample],
    scores: dict[int, tuple[Tensor, Tensor | None]],
    width: int,
    which: int,
    device: torch.device,
) -> Tensor | None:
    """[B, width] the `which`-th of `proximal_scores`' tensors of `chunk`'s examples, right-padded with 0."""
    parts = [part for part in (scores[id(example)][which] for example in chunk) if part is not None]
    if len(parts) < len(chunk):
        return None
    rows = torch.zeros(len(chunk), width, dtype=parts[0].dtype, device=device)
    for row, part in enumerate(parts):
        rows[row, : part.shape[0]] = part
    return rows


def update_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: list[TrainingExample],
    config: LossConfig,
    *,
    micro_batch_size: int,
    grad_clip: float = 1.0,
    reference_model: torch.nn.Module | None = None,
    logit_chunk_tokens: int = 1024,
    micro_batch_tokens: int | None = None,
    share_prefix: bool = False,
    ppo_epochs: int = 1,
    mini_batches: int = 1,
    group: dist.ProcessGroup | None = None,
) -> StepMetrics:
    """The update on `examples`: `ppo_epochs` passes over it in `mini_batches` parts, one optimizer
    step per part (the defaults: one step on the whole batch); returns what it did
    (`mean_staleness` is left to the caller).

    Each step's loss is the aggregation (`config.loss_agg`) over every response token of its part of

        PPO(ρ, A, w) + kl_beta · k3(π_θ, π_ref) − entropy_coef · H(π_θ) + w_opd · topK-RKL

    (the last term only for examples distilled through the top-K term), the part weighted as a
    batch of its own (`batch_weights` of its examples: under `token-mean` each of its tokens weighs
    1/its token count), so a step on a mini-batch is the step that batch alone would take; with one
    mini-batch, the whole batch. The parts are `split_batch`'s, the same in every epoch. With one
    step, π_old in ρ = π_θ/π_old is each micro-batch's own forward pass detached, so ρ = 1; with
    more, `proximal_scores` computes π_old (and π_ref) once, before the first step, and holds it
    (the advantages and importance weights with it) for every step, so the later steps' ratios
    move and the clip at 1 − eps_low, 1 + eps_high acts. The reported statistics are means under
    the loss's weights, Σ a·x / Σ a (token means under `constant`, whose weights sum to N/(B·C)
    rather than 1), and `loss` is the optimised value itself; with several steps each is the mean
    over the steps of every step's own, `grad_norm` too. Gradients are clipped to a global norm of
    `grad_clip` at each step (math.inf: no clipping). A step whose gradient is not finite is
    skipped (no optimizer step); when every step was (`skipped_step` is 1), or there is no
    response token at all, the weights are left unchanged. `optimizer_steps` counts the steps
    taken. Deterministic given the model, the examples and torch's RNG (dropout, if any).
    Vocabulary-sized logits exist for `logit_chunk_tokens` response positions at a time
    (`model.scoring.response_scores`), forward and backward; a micro-batch holds at most
    `micro_batch_size` examples and, when given, `micro_batch_tokens` packed tokens (`micro_batches`);
    with `share_prefix`, every prompt prefix that examples of a micro-batch share is computed once
    (a prefix tree, `model.scoring.pack_rows`), which changes the numbers by rounding only; a
    model that cannot (`model.scoring.can_share_prefix`) trains its examples unshared.

    With a torch.distributed `group` (data parallel, `data_parallel`), every rank is given the same
    `examples` and a model with the same weights; each runs its share of every step's micro-batches,
    the gradients are summed over the ranks before the clip, and the statistics after the last step:
    every rank takes the step one process takes (up to the order of the sums) and returns its
    figures. None: this process alone.
    """
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be at least 1")
    if ppo_epochs < 1 or mini_batches < 1:
        raise ValueError("ppo_epochs and mini_batches must be at least 1")
    started = time.perf_counter()
    device = next(model.parameters()).device
    share_prefix = share_prefix and can_share_prefix(model)
    num_tokens = sum(len(example.turn.response_token_ids) for example in examples)
    metrics = StepMetrics(
        num_samples=len(examples),
        num_tokens=num_tokens,
        mean_reward=sum(example.sample.reward for example in examples) / max(len(examples), 1),
        opd_fraction=sum(
            example.sample.teacher_logprobs is not None or example.sample.teacher_topk_ids is not None for example in examples
        ) / max(len(examples), 1),
    )
    if num_tokens == 0:
        return metrics
    parts = [part for part in split_batch(examples, mini_batches) if any(e.turn.response_token_ids for e in part)]
    steps = ppo_epochs * len(parts)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    totals = _Totals.zeros(device)
    grad_norms: list[float] = []
    was_training = model.training
    model.train()
    optimizer.zero_grad(set_to_none=True)
    try:
        proximal = None
        if steps > 1:  # π_old before any step moves the weights; a single step takes it from its own pass
            proximal = proximal_scores(
                model, reference_model, examples, config, micro_batch_size, micro_batch_tokens, share_prefix,
                logit_chunk_tokens, group,
            )  # fmt: skip
        prepared = [
            _prepare(part, config, device, proximal, micro_batch_size, micro_batch_tokens, share_prefix, group)
            for part in parts
        ]
        for _ in range(ppo_epochs):
            for batches, total_weight, topk_weight in prepared:
                step_totals = totals if steps == 1 else _Totals.zeros(device)
                for batch in batches:
                    _accumulate(
                        model, reference_model, batch, config, total_weight, topk_weight, step_totals, logit_chunk_tokens
                    )
                if group is not None:
                    all_reduce_gradients(trainable, group)
                grad_norm = torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
                if torch.isfinite(grad_norm):
                    optimizer.step()
                    metrics.optimizer_steps += 1
                optimizer.zero_grad(set_to_none=True)
                grad_norms.append(grad_norm.item())
                if steps > 1:
                    totals.add(step_totals, 1.0 / steps)
    finally:
        model.train(was_training)
    if group is not None:
        all_reduce_sum(list(vars(totals).values()), group)
    for name, total in vars(totals).items():
        setattr(metrics, name, total.item())
    metrics.grad_norm = sum(grad_norms) / len(grad_norms)
    metrics.skipped_step = int(metrics.optimizer_steps == 0)
    metrics.step_seconds = time.perf_counter() - started
    metrics.tokens_per_s = num_tokens / metrics.step_seconds
    return metrics


def _prepare(
    part: list[TrainingExample],
    config: LossConfig,
    device: torch.device,
    proximal: dict[int, tuple[Tensor, Tensor | None]] | None,
    micro_batch_size: int,
    micro_batch_tokens: int | None,
    share_prefix: bool,
    group: dist.ProcessGroup | None,
) -> tuple[list[MicroBatch], float, float]:
    """`part`'s micro-batches (this rank's share of them with a `group`), its tokens weighted as a
    batch of its own (with π_old and π_ref from `proximal` when given), the total weight Σ a of its
    tokens and that of the top-K term's (1 if none): both of the whole part, on every rank."""
    weights = batch_weights(part, config)
    weight_of = {id(example): weight for example, weight in zip(part, weights)}  # micro_batches reorders them
    # Σ a over the part's tokens (1, or N/(B·C) for `constant`), and over those of the top-K term
    total_weight = sum(weight * len(example.turn.response_token_ids) for example, weight in zip(part, weights))
    topk_weight = sum(
        weight * len(example.turn.response_token_ids)
        for example, weight in zip(part, weights)
        if _uses_topk(example, config)
    )
    batches = []
    chunks = list(micro_batches(part, micro_batch_size, micro_batch_tokens, share_prefix))
    for chunk in _own_chunks(chunks, share_prefix, group):
        batch = pack_examples(chunk, config, device, [weight_of[id(example)] for example in chunk], share_prefix)
        width = batch.response_ids.shape[1]
        if width == 0:
            continue
        if proximal is not None:
            batch.old_logprobs = _rows_of(chunk, proximal, width, 0, device)
            batch.reference_logprobs = _rows_of(chunk, proximal, width, 1, device)
        batches.append(batch)
    return batches, total_weight, topk_weight or 1.0


def _accumulate(
    model: torch.nn.Module,
    reference_model: torch.nn.Module | None,
    batch: MicroBatch,
    config: LossConfig,
    total_weight: float,
    topk_weight: float,
    totals: _Totals,
    chunk_tokens: int,
) -> None:
    """Forward and backward one micro-batch's share of the batch loss (its rows' `agg_weights`).

    Statistics are added as shares of weighted means: divided by the batch's total weight, the
    top-K reverse KL by the total weight of the tokens it applies to.
    """
    reference = batch.reference_logprobs
    if reference is None and config.kl_beta > 0:
        reference = _reference_logprobs(model, reference_model, batch, chunk_tokens)
    scores = response_scores(model, batch.rows, batch.topk_ids, chunk_tokens, batch.allowed_bits)
    logprobs = scores.logprobs
    # π_old: held from before the batch's first step, or, with one step, the current weights (module docstring)
    old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    weights = truncated_importance_weights(old, batch.behaviour_logprobs, config.is_cap)
    token_advantages = advantages(batch, old, config)
    agg_weights = batch.agg_weights
    loss, stats = ppo_clipped_loss(
        logprobs, old, token_advantages, batch.mask, config.eps_low, config.eps_high, weights, agg_weights
    )
    entropy = aggregate(scores.entropy if config.entropy_coef > 0 else scores.entropy.detach(), batch.mask, agg_weights)
    if config.entropy_coef > 0:
        loss = loss - config.entropy_coef * entropy
    if reference is not None:
        kl = kl_k3(logprobs, reference, batch.mask, agg_weights)
        loss = loss + config.kl_beta * kl
        totals.kl_to_reference += kl.detach() / total_weight
    if scores.at_ids is not None and batch.topk_logprobs is not None:
        topk_mask = batch.mask & batch.has_topk.unsqueeze(1)
        reverse_kl = topk_reverse_kl_at(scores.at_ids, batch.topk_logprobs, topk_mask, agg_weights)
        loss = loss + config.w_opd * reverse_kl
        totals.topk_reverse_kl += reverse_kl.detach() / topk_weight
    loss.backward()
    totals.loss += loss.detach()
    totals.clip_fraction += stats.clip_fraction / total_weight
    totals.approx_kl += stats.approx_kl / total_weight
    totals.mean_advantage += stats.mean_advantage / total_weight
    totals.entropy += entropy.detach() / total_weight
    totals.logprob_drift += aggregate((old - batch.behaviour_logprobs).abs(), batch.mask, agg_weights) / total_weight
    totals.mean_is_weight += aggregate(weights, batch.mask, agg_weights) / total_weight
