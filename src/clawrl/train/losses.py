"""The training objectives of DESIGN §6 as pure tensor functions.

Every function works on token-level ``[batch, time]`` tensors (``[batch, time, vocab]`` for full
distributions) with a ``mask`` that is true (or 1) on the response tokens that count and false on
padding. Masked positions never influence a result or a gradient, whatever they hold (padding,
``-inf``, NaN): they are replaced before any arithmetic, so an all-masked batch gives a zero loss
and zero gradients instead of 0/0.

Every reduction over tokens is one weighted sum, `aggregate`: Σ_{b,t} mask · a_{b,t} · value_{b,t},
where ``agg_weights`` a give each response token its weight in the batch loss. `sequence_weights`
writes them out for the three aggregations of ``LossConfig.loss_agg`` (token mean, per-sequence
mean, constant normaliser); left out, a is 1/(unmasked tokens), the token mean of the tensors
given. The update step computes a once for the *whole* batch and hands each micro-batch its rows,
so the micro-batch losses (and statistics) add up to the batch's and gradient accumulation equals
one big batch, whichever the aggregation.

Notation: ``logp`` = log π_θ(a_t) (with gradient), ``old`` = log π_old(a_t) (the proximal policy,
recomputed by the trainer), ``behaviour`` = log π_behaviour(a_t) (what the engine reported when it
sampled), ``ref`` = log π_ref(a_t), ``teacher`` = log π_T(a_t), all of the same response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from clawrl.config import LossAggregation

# exp(20) ≈ 4.9e8. A log-ratio above it only reaches the loss through the unclipped branch with a
# negative advantage, where it would give gradients whose squared norm overflows float32 (from
# exp(44) on) and turn the whole step into NaN during gradient clipping. Capping keeps the step
# finite; a capped token contributes a constant and no gradient.
MAX_LOG_RATIO = 20.0
# Smallest probability given to a top-K tail bin: when the teacher's top K hold (numerically) all
# of its mass, log(0) would make the reverse KL infinite for any student mass outside them.
TAIL_FLOOR = 1e-6


@dataclass
class PolicyLossStats:
    """Detached statistics of the policy loss, reduced like the loss (so micro-batches add up)."""

    clip_fraction: Tensor  # share of tokens whose gradient the clip removed
    approx_kl: Tensor  # k3 estimate of KL(π_old ‖ π_θ): mean of (ρ - 1) - log ρ
    mean_advantage: Tensor


def _mask(mask: Tensor) -> Tensor:
    return mask.to(torch.bool)


def sequence_weights(lengths: Tensor, mode: LossAggregation, constant_tokens: float | None = None) -> Tensor:
    """The weight a_i of every token of sequence i in the batch loss Σ_i Σ_t a_i ℓ_{i,t}: ``[B] -> [B]``, float64.

        token-mean: a_i = 1 / Σ_j len_j    every token of the batch weighs the same, so a long
                                            response counts more than a short one
        seq-mean:   a_i = 1 / (B · len_i)  every response weighs the same: the mean over its tokens,
                                            then over the responses (upstream slime's default)
        constant:   a_i = 1 / (B · C)      every token weighs the same in every batch, whatever the
                                            lengths and the batch's token count (Dr. GRPO); C is
                                            ``constant_tokens`` (required), e.g. the response limit

    ``lengths`` are the response token counts of the *whole* batch. B counts the sequences with at
    least one token; a sequence of length 0 has no token to weigh and gets 0, and a batch with no
    token at all gets zeros. Token-mean and seq-mean weights sum to 1 over the batch's tokens.
    """
    lengths = lengths.to(torch.float64)
    present = lengths > 0
    sequences = present.sum().to(torch.float64).clamp(min=1)
    if mode == "token-mean":
        weights = (1.0 / lengths.sum().clamp(min=1)).expand_as(lengths)
    elif mode == "seq-mean":
        weights = 1.0 / (sequences * lengths.clamp(min=1))
    elif mode == "constant":
        if constant_tokens is None or constant_tokens <= 0:
            raise ValueError(f"the constant loss aggregation needs a positive normaliser, not {constant_tokens!r}")
        weights = (1.0 / (sequences * float(constant_tokens))).expand_as(lengths)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    return torch.where(present, weights, torch.zeros_like(weights))


def aggregation_weights(mask: Tensor, mode: LossAggregation, constant_tokens: float | None = None) -> Tensor:
    """``[B, T]`` per-token weights of a batch held in one tensor: `sequence_weights` of its rows'
    unmasked token counts on the unmasked tokens, 0 elsewhere (float64)."""
    mask = _mask(mask)
    weights = sequence_weights(mask.sum(dim=-1), mode, constant_tokens).unsqueeze(-1)
    return torch.where(mask, weights, torch.zeros_like(weights))


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """Σ_t mask_t · values_t, with masked entries replaced by 0 first (so NaN/inf there is harmless)."""
    return torch.where(_mask(mask), values, torch.zeros_like(values)).sum()


def aggregate(values: Tensor, mask: Tensor, agg_weights: Tensor | None = None) -> Tensor:
    """Σ_t mask_t · a_t · values_t, the reduction of every loss term and statistic.

    a = ``agg_weights`` (constants, broadcast to ``values``; see `sequence_weights`), or, left out,
    1/N with N the number of unmasked tokens (at least 1): the token mean of ``values``. Masked
    weights are replaced by 0 like masked values, so neither can carry NaN into the result.
    """
    mask = _mask(mask)
    if agg_weights is None:
        return masked_sum(values, mask) / mask.sum().to(values.dtype).clamp(min=1)
    zeros = torch.zeros_like(values)
    weights = torch.where(mask, agg_weights.detach().to(values.dtype), zeros)
    return masked_sum(torch.where(mask, values, zeros) * weights, mask)


def ppo_clipped_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    token_weights: Tensor | None = None,
    agg_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO's clipped surrogate with an asymmetric clip, as a loss to minimise.

        ρ_t = exp(min(logp_t − old_t, MAX_LOG_RATIO))
        L   = −Σ_t mask_t · a_t · w_t · min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t)

    w_t are the ``token_weights`` (the truncated importance weights of decoupled PPO; 1 when
    None) and a_t the ``agg_weights`` (`aggregate`); they, ``old_logprobs`` and ``advantages`` are
    constants (no gradient). The wider upper clip (ε_high > ε_low) lets tokens with a positive
    advantage gain more probability per step than tokens with a negative one can lose, which keeps
    exploration alive. A token is *clipped*
    when the clipped branch is the minimum and strictly smaller, i.e. A_t > 0 and ρ_t > 1 + ε_high,
    or A_t < 0 and ρ_t < 1 − ε_low: its gradient is 0.
    """
    mask = _mask(mask)
    zeros = torch.zeros_like(logprobs)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zeros).clamp(max=MAX_LOG_RATIO)
    advantages = torch.where(mask, advantages.detach().to(logprobs.dtype), zeros)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * torch.where(mask, token_weights.detach().to(logprobs.dtype), zeros)
    loss = aggregate(per_token, mask, agg_weights)
    with torch.no_grad():
        was_clipped = ((advantages > 0) & (ratio > 1.0 + eps_high)) | ((advantages < 0) & (ratio < 1.0 - eps_low))
        stats = PolicyLossStats(
            clip_fraction=aggregate(was_clipped.to(logprobs.dtype), mask, agg_weights),
            approx_kl=aggregate((ratio - 1.0) - log_ratio, mask, agg_weights),
            mean_advantage=aggregate(advantages, mask, agg_weights),
        )
    return loss, stats


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, agg_weights: Tensor | None = None) -> Tensor:
    """k3 estimate of KL(π_θ ‖ π_ref) on tokens sampled from the policy, aggregated by `aggregate`.

        δ_t = clamp(ref_t − logp_t, ±MAX_LOG_RATIO)
        KL  = Σ_t mask_t · a_t · (exp(δ_t) − δ_t − 1)

    Each term is ≥ 0 and unbiased for the KL (Schulman's k3), with far less variance than
    −δ_t. Gradients flow through ``logprobs`` only; the reference is a constant.
    """
    mask = _mask(mask)
    delta = torch.where(mask, ref_logprobs.detach() - logprobs, torch.zeros_like(logprobs))
    delta = delta.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return aggregate(torch.exp(delta) - delta - 1.0, mask, agg_weights)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of softmax(logits) over the last dimension, in nats: ``[..., V] -> [...]``.

        H = −Σ_v p_v log p_v = logsumexp(z) − Σ_v p_v z_v,   p = softmax(z)

    The second form never evaluates log p, so it is finite even where p_v underflows to 0.
    Computed in float32 at least.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def opd_advantage(teacher_logprobs: Tensor, old_logprobs: Tensor, clip: float = 1.0) -> Tensor:
    """On-policy distillation advantage per token: A_t = clip(teacher_t − old_t, −C, C).

    Positive where the hinted teacher finds the sampled token likelier than the policy did. The
    clip (C = 1 by default) bounds how hard a single token can be pushed, which keeps distillation
    stable when the teacher is confidently different. Both inputs are constants (no gradient).
    """
    return (teacher_logprobs.detach() - old_logprobs.detach()).clamp(-clip, clip)


def combined_advantage(reward: Tensor, teacher_term: Tensor, w_rl: float = 1.0, w_opd: float = 1.0) -> Tensor:
    """A_t = w_rl · r + w_opd · teacher_t, with ``reward`` per sample ``[B]`` broadcast over time.

    ``reward`` may also be given per token ``[B, T]``; ``teacher_term`` is ``[B, T]``.
    """
    if reward.dim() == teacher_term.dim() - 1:
        reward = reward.unsqueeze(-1)
    return w_rl * reward + w_opd * teacher_term


def truncated_importance_weights(old_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float = 2.0) -> Tensor:
    """Decoupled PPO's token weights: w_t = min(exp(old_t − behaviour_t), cap), no gradient.

    They correct for the turn having been sampled by an older policy version than the proximal
    policy π_old; the cap bounds the variance a very stale or very unlikely token can add.
    """
    return torch.exp(old_logprobs.detach() - behaviour_logprobs.detach()).clamp(max=cap)


def _log_tail(topk_logprobs: Tensor) -> Tensor:
    """log of the mass outside the top K: log(max(1 − Σ_k exp(l_k), TAIL_FLOOR))."""
    return torch.log((1.0 - torch.exp(topk_logprobs).sum(dim=-1)).clamp(min=TAIL_FLOOR))


def topk_reverse_kl(
    student_logprobs_full: Tensor,
    teacher_topk_ids: Tensor,
    teacher_topk_logprobs: Tensor,
    mask: Tensor,
    agg_weights: Tensor | None = None,
) -> Tensor:
    """Reverse KL(π_θ ‖ π_T) on the teacher's top K plus one tail bin, aggregated by `aggregate`.

    At each position the vocabulary is collapsed into K + 1 bins: the teacher's K most likely
    tokens, and everything else. The student's bins are its own log-probabilities at the
    teacher's ids (``student_logprobs_full`` is normalised over the vocabulary, ``[B, T, V]``),
    not renormalised, and its tail bin holds the rest of its mass; the same for the teacher:

        s_k = logp_full[t, id_k],  s_tail = log(max(1 − Σ_k exp(s_k), TAIL_FLOOR))
        u_k = teacher_k,           u_tail = log(max(1 − Σ_k exp(u_k), TAIL_FLOOR))
        KL_t = Σ_{b ∈ K+1 bins} exp(s_b) (s_b − u_b)
        L  = Σ_t mask_t · a_t · KL_t

    Reverse (mode-seeking) KL pushes the student's mass into the teacher's likely tokens and
    penalises mass the teacher does not give. Gradients flow through the student only.
    """
    bins_mask = _mask(mask).unsqueeze(-1)
    ids = torch.where(bins_mask, teacher_topk_ids, torch.zeros_like(teacher_topk_ids))
    return topk_reverse_kl_at(student_logprobs_full.gather(-1, ids), teacher_topk_logprobs, mask, agg_weights)


def topk_reverse_kl_at(
    student_topk_logprobs: Tensor, teacher_topk_logprobs: Tensor, mask: Tensor, agg_weights: Tensor | None = None
) -> Tensor:
    """`topk_reverse_kl` from the student's log-probs already read at the teacher's ids ``[B, T, K]``
    (what a scorer that never holds the full vocabulary, `engines.scoring.response_scores`, gives)."""
    mask = _mask(mask)
    bins_mask = mask.unsqueeze(-1)
    # Masked positions: both sides get the same stand-in (log-probs 0), a finite zero KL, so
    # nothing non-finite reaches the backward pass whatever the padding held.
    student = torch.where(bins_mask, student_topk_logprobs, torch.zeros_like(student_topk_logprobs))
    teacher = torch.where(bins_mask, teacher_topk_logprobs.detach().to(student.dtype), torch.zeros_like(student))
    student_bins = torch.cat([student, _log_tail(student).unsqueeze(-1)], dim=-1)
    teacher_bins = torch.cat([teacher, _log_tail(teacher).unsqueeze(-1)], dim=-1)
    per_token = (torch.exp(student_bins) * (student_bins - teacher_bins)).sum(dim=-1)
    return aggregate(per_token, mask, agg_weights)
