"""The training losses against plain float64 references written out loop by loop.

Inputs are fresh random tensors from seeded generators. Besides the values, the tests check the
cases that break careless implementations: every token masked (0/0), responses of length zero,
log-ratios of ±50, garbage (NaN, inf) in padded positions, and where gradients may and may not flow.
Every loss is checked under each of the three aggregations (`LossConfig.loss_agg`), whose
reference is written as what it means (a mean of token values, a mean of per-response means, a
mean of per-response sums over C) rather than as per-token weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clawrl.train.losses import (
    MAX_LOG_RATIO,
    TAIL_FLOOR,
    combined_advantage,
    entropy_from_logits,
    aggregate,
    aggregation_weights,
    kl_k3,
    opd_advantage,
    ppo_clipped_loss,
    sequence_weights,
    topk_reverse_kl,
    truncated_importance_weights,
)

EPS_LOW, EPS_HIGH = 0.2, 0.28
B, T, V, K = 3, 7, 11, 4
C = 5  # the constant normaliser of the tests: shorter than the longest response, longer than others
# None: no aggregation weights given, which is the token mean of the tensors given
MODES = [None, "token-mean", "seq-mean", "constant"]


def reference_aggregate(rows: list[list[float]], mode: str | None) -> float:
    """The batch reduction of per-token values, ``rows[b]`` = the values of response b's tokens.

    token-mean: the mean of every token value of the batch. seq-mean: the mean, over the responses
    that have a token, of each response's mean. constant: the mean, over those responses, of each
    response's sum divided by C.
    """
    responses = [row for row in rows if row]
    if mode in (None, "token-mean"):
        count = sum(len(row) for row in responses)
        return sum(value for row in responses for value in row) / max(count, 1)
    if mode == "seq-mean":
        return sum(sum(row) / len(row) for row in responses) / max(len(responses), 1)
    assert mode == "constant"
    return sum(sum(row) / C for row in responses) / max(len(responses), 1)


def reference_gradient(local: list[list[float]], mode: str | None) -> np.ndarray:
    """d(batch loss)/d(token input) when token (b, t)'s value has derivative local[b][t]: the reduction
    is linear, so it is the reduction of a batch whose only non-zero value is that derivative."""
    grad = np.zeros((B, T))
    for b, row in enumerate(local):
        for t, derivative in enumerate(row):
            one_hot = [[0.0] * len(other) for other in local]
            one_hot[b][t] = derivative
            grad[b, t] = reference_aggregate(one_hot, mode)
    return grad


def weights_for(mask: torch.Tensor, mode: str | None) -> torch.Tensor | None:
    return None if mode is None else aggregation_weights(mask, mode, C)


def random_batch(seed: int) -> dict[str, torch.Tensor]:
    """Log-probs, a nearby π_old, mixed-sign advantages, weights in (0, 2], a ragged mask."""
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 4
    old = logp + torch.randn(B, T, generator=generator, dtype=torch.float64) * 0.4  # many clipped
    advantages = torch.randn(B, T, generator=generator, dtype=torch.float64)
    weights = torch.rand(B, T, generator=generator, dtype=torch.float64) * 2
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return {"logp": logp, "old": old, "advantages": advantages, "weights": weights, "mask": mask}


def reference_ppo(logp, old, advantages, weights, mask, mode=None):
    """Loss, d loss / d logp, clip fraction, k3 KL and mean advantage, token by token in Python
    floats, reduced by `reference_aggregate`."""
    loss, grad, clipped, kl, advantage = [], [], [], [], []
    for b in range(logp.shape[0]):
        for rows in (loss, grad, clipped, kl, advantage):
            rows.append([])
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            log_ratio = min(float(logp[b, t] - old[b, t]), MAX_LOG_RATIO)
            ratio = math.exp(log_ratio)
            a, w = float(advantages[b, t]), float(weights[b, t])
            bounded = min(max(ratio, 1 - EPS_LOW), 1 + EPS_HIGH)
            loss[b].append(-w * min(ratio * a, bounded * a))
            was_clipped = (a > 0 and ratio > 1 + EPS_HIGH) or (a < 0 and ratio < 1 - EPS_LOW)
            clipped[b].append(1.0 if was_clipped else 0.0)
            grad[b].append(0.0 if was_clipped or log_ratio >= MAX_LOG_RATIO else -w * ratio * a)
            kl[b].append(ratio - 1 - log_ratio)
            advantage[b].append(a)
    return (
        reference_aggregate(loss, mode),
        reference_gradient(grad, mode),
        reference_aggregate(clipped, mode),
        reference_aggregate(kl, mode),
        reference_aggregate(advantage, mode),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_ppo_clipped_loss_matches_reference(seed: int, weighted: bool, mode: str | None) -> None:
    batch = random_batch(seed)
    assert len(set(batch["mask"].sum(1).tolist())) > 1  # responses of uneven lengths
    logp = batch["logp"].clone().requires_grad_()
    weights = batch["weights"] if weighted else torch.ones(B, T, dtype=torch.float64)
    loss, stats = ppo_clipped_loss(
        logp, batch["old"], batch["advantages"], batch["mask"], EPS_LOW, EPS_HIGH, weights if weighted else None,
        weights_for(batch["mask"], mode),
    )
    loss.backward()
    expected_loss, expected_grad, expected_clip, expected_kl, expected_advantage = reference_ppo(
        batch["logp"], batch["old"], batch["advantages"], weights, batch["mask"], mode
    )
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-10, atol=1e-12)
    assert stats.clip_fraction.item() == pytest.approx(expected_clip, rel=1e-12)
    assert 0 < expected_clip < 1  # the inputs really exercise both branches
    assert stats.approx_kl.item() == pytest.approx(expected_kl, rel=1e-10)
    assert stats.mean_advantage.item() == pytest.approx(expected_advantage, rel=1e-10)


def test_the_aggregations_differ_on_uneven_lengths() -> None:
    """What tells the three apart: on responses of uneven lengths no two give the same loss."""
    batch = random_batch(0)
    losses = {
        mode: ppo_clipped_loss(batch["logp"], batch["old"], batch["advantages"], batch["mask"],
                               agg_weights=weights_for(batch["mask"], mode))[0].item()
        for mode in MODES
    }
    assert losses[None] == pytest.approx(losses["token-mean"], rel=1e-12)
    assert len({round(losses[mode], 9) for mode in ("token-mean", "seq-mean", "constant")}) == 3


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_reference(mode: str | None) -> None:
    """The reduction every statistic and the entropy term go through, on values with garbage padding."""
    generator = torch.Generator().manual_seed(10)
    values = torch.randn(B, T, generator=generator, dtype=torch.float64)
    mask = random_batch(1)["mask"].clone()
    mask[1] = False  # an empty response: no sequence of the mean
    rows = [[float(values[b, t]) for t in range(T) if mask[b, t]] for b in range(B)]
    padded = garbage_padded(values, mask).requires_grad_()
    result = aggregate(padded, mask, weights_for(mask, mode))
    result.backward()
    assert result.item() == pytest.approx(reference_aggregate(rows, mode), rel=1e-12)
    np.testing.assert_allclose(padded.grad.numpy(), reference_gradient([[1.0] * len(row) for row in rows], mode), rtol=1e-12)


def test_sequence_weights_written_out() -> None:
    lengths = torch.tensor([2, 0, 5, 1])  # one empty response: no sequence of the mean
    expected = {
        "token-mean": [1 / 8, 0, 1 / 8, 1 / 8],
        "seq-mean": [1 / (3 * 2), 0, 1 / (3 * 5), 1 / (3 * 1)],
        "constant": [1 / (3 * C), 0, 1 / (3 * C), 1 / (3 * C)],
    }
    for mode, weights in expected.items():
        assert sequence_weights(lengths, mode, C).tolist() == pytest.approx(weights, rel=1e-15), mode
        assert sequence_weights(torch.zeros(3, dtype=torch.long), mode, C).tolist() == [0.0, 0.0, 0.0]
    mask = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    per_token = aggregation_weights(mask, "seq-mean", C)
    assert per_token[2].tolist() == pytest.approx([1 / 15] * 5 + [0.0], rel=1e-15)
    assert (per_token[~mask] == 0).all()
    with pytest.raises(ValueError, match="loss aggregation"):
        sequence_weights(lengths, "sum", C)
    with pytest.raises(ValueError, match="positive normaliser"):
        sequence_weights(lengths, "constant")


@pytest.mark.parametrize("mode", MODES[1:])
def test_micro_batches_add_up_to_the_batch_loss(mode: str) -> None:
    """Weights computed for the whole batch, handed out by rows: the parts' losses, statistics and
    gradients add up to the whole batch's, for every term and every aggregation."""
    batch = random_batch(3)
    student_logits, ids, teacher_logprobs, _ = random_topk(3)
    mask = batch["mask"]
    weights = aggregation_weights(mask, mode, C)

    def terms(rows: slice, agg_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, stats = ppo_clipped_loss(logp[rows], batch["old"][rows], batch["advantages"][rows], mask[rows],
                                       token_weights=batch["weights"][rows], agg_weights=agg_weights)
        loss = loss + kl_k3(logp[rows], batch["old"][rows] - 0.3, mask[rows], agg_weights)
        loss = loss + topk_reverse_kl(torch.log_softmax(logits[rows], -1), ids[rows], teacher_logprobs[rows], mask[rows],
                                      agg_weights)
        loss = loss - aggregate(entropy_from_logits(logits[rows]), mask[rows], agg_weights)
        return loss, stats.clip_fraction, stats.approx_kl

    logp, logits = batch["logp"].clone().requires_grad_(), student_logits.clone().requires_grad_()
    whole = terms(slice(0, B), weights)
    whole[0].backward()
    whole_grads = logp.grad.clone(), logits.grad.clone()
    logp.grad, logits.grad = None, None
    summed = [0.0, 0.0, 0.0]
    for rows in (slice(0, 1), slice(1, B)):
        part = terms(rows, weights[rows])
        part[0].backward()
        summed = [total + value.item() for total, value in zip(summed, part)]
    for total, value in zip(summed, whole):
        assert total == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(logp.grad, whole_grads[0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(logits.grad, whole_grads[1], rtol=1e-12, atol=1e-15)
    # ...whereas each part aggregated on its own (the weights of a part, not of the batch) does not
    alone = sum(terms(rows, aggregation_weights(mask[rows], mode, C))[0].item() for rows in (slice(0, 1), slice(1, B)))
    assert alone != pytest.approx(whole[0].item(), rel=1e-6)


def test_ppo_extreme_ratios_are_clipped_and_finite() -> None:
    # One token per case: (log-ratio, advantage).
    cases = [(50.0, 1.0), (-50.0, -1.0), (-50.0, 1.0), (50.0, -1.0), (0.0, 1.0)]
    log_ratio = torch.tensor([[case[0] for case in cases]], dtype=torch.float32)
    advantages = torch.tensor([[case[1] for case in cases]], dtype=torch.float32)
    old = torch.full_like(log_ratio, -3.0)
    logp = (old + log_ratio).requires_grad_()
    mask = torch.ones_like(logp, dtype=torch.bool)
    loss, stats = ppo_clipped_loss(logp, old, advantages, mask, EPS_LOW, EPS_HIGH)
    loss.backward()
    n = len(cases)
    # ρ→∞, A>0: capped at 1+ε_high. ρ→0, A<0: floored at 1-ε_low. ρ→0, A>0: ~0. ρ capped at e^20,
    # A<0: the unclipped (pessimistic) branch. ρ=1: -A.
    expected = (-(1 + EPS_HIGH) + (1 - EPS_LOW) + 0.0 + math.exp(MAX_LOG_RATIO) - 1.0) / n
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == 0  # clipped: no gradient
    assert logp.grad[0, 3] == 0  # beyond the log-ratio cap: constant
    assert logp.grad[0, 4].item() == pytest.approx(-1.0 / n)  # ρ=1: -A/N
    assert stats.clip_fraction.item() == pytest.approx(2 / n)
    assert math.isfinite(stats.approx_kl.item())


def test_ppo_gradient_reaches_only_the_policy_log_probs() -> None:
    batch = random_batch(4)
    logp = batch["logp"].clone().requires_grad_()
    old = batch["old"].clone().requires_grad_()
    advantages = batch["advantages"].clone().requires_grad_()
    weights = batch["weights"].clone().requires_grad_()
    loss, _ = ppo_clipped_loss(logp, old, advantages, batch["mask"], token_weights=weights)
    loss.backward()
    assert old.grad is None and advantages.grad is None and weights.grad is None
    assert (logp.grad[~batch["mask"]] == 0).all()
    assert (logp.grad[batch["mask"]] != 0).any()


@pytest.mark.parametrize("mode", MODES)
def test_the_clip_changes_the_gradient_once_the_ratio_has_moved(mode: str | None) -> None:
    """What a later step of several on one batch sees (`update_step` with ppo_epochs > 1): π_θ has
    moved from π_old. A token whose ratio left [1 − ε_low, 1 + ε_high] the way its advantage pushes
    loses its gradient, as the float64 reference says, where the unclipped surrogate's gradient
    would keep pushing; a token outside the other way, or inside, keeps its gradient; and a clip
    wide enough to hold every ratio gives the unclipped gradient."""
    batch = random_batch(5)
    mask = batch["mask"]
    # (log ρ, A) in turn over the tokens: clipped above, clipped below, outside against the
    # advantage (both ways), inside (both signs)
    cases = [(0.5, 1.0), (-0.5, -1.0), (0.5, -1.0), (-0.5, 1.0), (0.1, 1.0), (-0.1, -1.0)]
    log_ratio = torch.tensor([cases[i % len(cases)][0] for i in range(B * T)], dtype=torch.float64).view(B, T)
    advantages = torch.tensor([cases[i % len(cases)][1] for i in range(B * T)], dtype=torch.float64).view(B, T)
    old = batch["logp"] - log_ratio
    clipped = (advantages > 0) & (log_ratio > math.log(1 + EPS_HIGH))
    clipped |= (advantages < 0) & (log_ratio < math.log(1 - EPS_LOW))
    assert (clipped & mask).any() and (~clipped & mask).any()

    def gradient(eps_low: float, eps_high: float) -> tuple[torch.Tensor, float]:
        logp = batch["logp"].clone().requires_grad_()
        loss, stats = ppo_clipped_loss(logp, old, advantages, mask, eps_low, eps_high, batch["weights"],
                                       weights_for(mask, mode))
        loss.backward()
        return logp.grad, stats.clip_fraction.item()

    clipped_grad, clip_fraction = gradient(EPS_LOW, EPS_HIGH)
    _, expected_grad, expected_clip, _, _ = reference_ppo(batch["logp"], old, advantages, batch["weights"], mask, mode)
    np.testing.assert_allclose(clipped_grad.numpy(), expected_grad, rtol=1e-10, atol=1e-12)
    assert clip_fraction == pytest.approx(expected_clip, rel=1e-12) and expected_clip > 0
    # the unclipped surrogate −a·w·ρ·A: its derivative in log π_θ is −w·ρ·A at every token
    ratio, weights = torch.exp(log_ratio), batch["weights"]
    local = [[float(-weights[b, t] * ratio[b, t] * advantages[b, t]) for t in range(T) if mask[b, t]] for b in range(B)]
    unclipped = reference_gradient(local, mode)
    wide_grad, wide_clip = gradient(0.99, 100.0)  # no ratio here reaches this clip
    np.testing.assert_allclose(wide_grad.numpy(), unclipped, rtol=1e-10, atol=1e-12)
    assert wide_clip == 0.0
    on_clipped = (clipped & mask).numpy()
    assert (clipped_grad.numpy()[on_clipped] == 0).all() and (np.abs(unclipped[on_clipped]) > 1e-6).all()
    np.testing.assert_allclose(clipped_grad.numpy()[~on_clipped], unclipped[~on_clipped], rtol=1e-10, atol=1e-12)


def garbage_padded(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` with NaN and ±inf written into the masked positions, as sloppy padding might."""
    junk = torch.tensor([math.nan, math.inf, -math.inf], dtype=values.dtype).repeat(values.numel())[: values.numel()]
    return torch.where(mask, values, junk.view_as(values))


@pytest.mark.parametrize("mode", [*MODES, "garbage"])
def test_all_masked_gives_zero_loss_and_zero_gradients(mode: str | None) -> None:
    batch = random_batch(5)
    mask = torch.zeros(B, T, dtype=torch.bool)
    logp = garbage_padded(batch["logp"], mask).requires_grad_()
    student_full = garbage_padded(torch.randn(B, T, V, dtype=torch.float64), mask.unsqueeze(-1)).requires_grad_()
    ids = torch.randint(0, V, (B, T, K))
    garbage = garbage_padded(batch["old"], mask)
    # "garbage": NaN and inf as the aggregation weights of the masked positions
    weights = garbage if mode == "garbage" else weights_for(mask, mode)
    losses = [
        ppo_clipped_loss(logp, garbage, garbage, mask, token_weights=garbage, agg_weights=weights)[0],
        kl_k3(logp, garbage, mask, weights),
        aggregate(logp, mask, weights),
        topk_reverse_kl(student_full, ids, garbage.unsqueeze(-1).expand(B, T, K), mask, weights),
    ]
    for loss in losses:
        assert loss.item() == 0.0
    sum(losses).backward()
    assert (logp.grad == 0).all() and (student_full.grad == 0).all()
    _, stats = ppo_clipped_loss(logp, garbage, garbage, mask, agg_weights=weights)
    assert stats.clip_fraction.item() == 0 and stats.approx_kl.item() == 0 and stats.mean_advantage.item() == 0


def test_empty_responses_give_zero_loss() -> None:
    logp = torch.zeros(B, 0, requires_grad=True)
    mask = torch.zeros(B, 0, dtype=torch.bool)
    logits = torch.zeros(B, 0, V, requires_grad=True)
    loss, stats = ppo_clipped_loss(logp, logp.detach(), torch.zeros(B, 0), mask, token_weights=torch.ones(B, 0))
    total = loss + kl_k3(logp, logp.detach(), mask)
    no_ids, no_logprobs = torch.zeros(B, 0, K, dtype=torch.long), torch.zeros(B, 0, K)
    total = total + topk_reverse_kl(torch.log_softmax(logits, -1), no_ids, no_logprobs, mask)
    total.backward()
    assert total.item() == 0.0 and stats.clip_fraction.item() == 0.0
    assert logp.grad.shape == (B, 0) and logits.grad.shape == (B, 0, V)
    assert entropy_from_logits(logits).shape == (B, 0)
    assert opd_advantage(torch.zeros(B, 0), torch.zeros(B, 0)).shape == (B, 0)
    assert truncated_importance_weights(torch.zeros(B, 0), torch.zeros(B, 0)).shape == (B, 0)
    assert combined_advantage(torch.ones(B), torch.zeros(B, 0)).shape == (B, 0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", MODES)
def test_kl_k3_matches_reference(seed: int, mode: str | None) -> None:
    batch = random_batch(seed)
    ref = batch["old"]
    logp = batch["logp"].clone().requires_grad_()
    kl = kl_k3(logp, ref, batch["mask"], weights_for(batch["mask"], mode))
    kl.backward()
    values, local = [], []
    for b in range(B):
        values.append([]), local.append([])
        for t in range(T):
            if batch["mask"][b, t]:
                delta = float(ref[b, t] - batch["logp"][b, t])
                values[b].append(math.exp(delta) - delta - 1)
                local[b].append(1 - math.exp(delta))
    assert kl.item() == pytest.approx(reference_aggregate(values, mode), rel=1e-12)
    np.testing.assert_allclose(logp.grad.numpy(), reference_gradient(local, mode), rtol=1e-10, atol=1e-14)
    assert kl.item() > 0
    assert kl_k3(batch["logp"], batch["logp"], batch["mask"]).item() == 0.0


def test_kl_k3_is_finite_for_extreme_differences() -> None:
    logp = torch.tensor([[-60.0, -0.1]], requires_grad=True)
    ref = torch.tensor([[-0.1, -60.0]])
    kl = kl_k3(logp, ref, torch.ones(1, 2, dtype=torch.bool))
    kl.backward()
    assert math.isfinite(kl.item()) and torch.isfinite(logp.grad).all()


def test_entropy_matches_reference() -> None:
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 3
    values = logits.numpy()
    expected = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            p = np.exp(values[b, t] - values[b, t].max())
            p /= p.sum()
            expected[b, t] = -sum(pv * math.log(pv) for pv in p)
    np.testing.assert_allclose(entropy_from_logits(logits).numpy(), expected, rtol=1e-12)
    # Float32 and a vanishing probability (p ≈ e^-200): still finite and right.
    peaked = torch.tensor([[[0.0, -200.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(math.log(2), rel=1e-6)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32


def test_opd_advantage_and_combined_advantage() -> None:
    generator = torch.Generator().manual_seed(8)
    teacher = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 5
    old = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 5
    reward = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    advantage = opd_advantage(teacher, old, clip=1.0)
    combined = combined_advantage(reward, advantage, w_rl=0.5, w_opd=2.0)
    for b in range(B):
        for t in range(T):
            difference = float(teacher[b, t] - old[b, t])
            expected = max(-1.0, min(1.0, difference))
            assert advantage[b, t].item() == pytest.approx(expected, rel=1e-12)
            assert combined[b, t].item() == pytest.approx(0.5 * float(reward[b]) + 2.0 * expected, rel=1e-12)
    assert (advantage == 1).any() and (advantage == -1).any()  # the clip is exercised
    assert opd_advantage(torch.tensor([-math.inf]), torch.tensor([-1.0])).item() == -1.0


def test_truncated_importance_weights_match_reference() -> None:
    generator = torch.Generator().manual_seed(9)
    old = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 3
    behaviour = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 3
    weights = truncated_importance_weights(old, behaviour, cap=2.0)
    for b in range(B):
        for t in range(T):
            assert weights[b, t].item() == pytest.approx(min(math.exp(float(old[b, t] - behaviour[b, t])), 2.0))
    assert (weights == 2.0).any() and (weights < 1).any()
    extreme = truncated_importance_weights(torch.tensor([0.0, -100.0]), torch.tensor([-100.0, 0.0]))
    assert extreme[0].item() == 2.0 and 0 <= extreme[1].item() < 1e-40


def random_topk(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student logits, the teacher's top-K ids and log-probs from its own distribution, a mask."""
    generator = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(B, T, V, generator=generator, dtype=torch.float64)
    teacher_logprobs_full = torch.log_softmax(torch.randn(B, T, V, generator=generator, dtype=torch.float64) * 2, -1)
    teacher_logprobs, ids = teacher_logprobs_full.topk(K, dim=-1)
    mask = torch.rand(B, T, generator=generator) > 0.3
    return student_logits, ids, teacher_logprobs, mask


def reference_topk_kl(student_logits: np.ndarray, ids, teacher_logprobs, mask, mode=None) -> float:
    rows: list[list[float]] = []
    for b in range(B):
        rows.append([])
        for t in range(T):
            if not mask[b, t]:
                continue
            z = student_logits[b, t]
            log_norm = z.max() + math.log(sum(math.exp(v - z.max()) for v in z))
            student = [z[int(i)] - log_norm for i in ids[b, t]]
            teacher = [float(v) for v in teacher_logprobs[b, t]]
            student.append(math.log(max(1 - sum(math.exp(s) for s in student), TAIL_FLOOR)))
            teacher.append(math.log(max(1 - sum(math.exp(u) for u in teacher), TAIL_FLOOR)))
            rows[b].append(sum(math.exp(s) * (s - u) for s, u in zip(student, teacher)))
    return reference_aggregate(rows, mode)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", MODES)
def test_topk_reverse_kl_matches_reference_values_and_gradients(seed: int, mode: str | None) -> None:
    student_logits, ids, teacher_logprobs, mask = random_topk(seed)
    logits = student_logits.clone().requires_grad_()
    kl = topk_reverse_kl(torch.log_softmax(logits, -1), ids, teacher_logprobs, mask, weights_for(mask, mode))
    kl.backward()
    expected = reference_topk_kl(student_logits.numpy(), ids, teacher_logprobs, mask, mode)
    assert kl.item() == pytest.approx(expected, rel=1e-12)
    assert kl.item() > 0
    # Gradient against central finite differences of the float64 reference.
    values, step = student_logits.numpy().copy(), 1e-6
    for b, t, v in [(b, t, v) for b in range(B) for t in range(T) for v in (0, 5, V - 1)]:
        values[b, t, v] += step
        above = reference_topk_kl(values, ids, teacher_logprobs, mask, mode)
        values[b, t, v] -= 2 * step
        below = reference_topk_kl(values, ids, teacher_logprobs, mask, mode)
        values[b, t, v] += step
        assert logits.grad[b, t, v].item() == pytest.approx((above - below) / (2 * step), rel=1e-5, abs=1e-9)
    assert (logits.grad[~mask] == 0).all()


def test_topk_reverse_kl_is_zero_when_the_student_is_the_teacher() -> None:
    student_logits, _, _, mask = random_topk(3)
    student_full = torch.log_softmax(student_logits, -1)
    teacher_logprobs, ids = student_full.topk(K, dim=-1)
    assert topk_reverse_kl(student_full, ids, teacher_logprobs, mask).item() == pytest.approx(0.0, abs=1e-14)


def test_topk_reverse_kl_survives_a_teacher_with_no_tail_mass() -> None:
    # The teacher puts all its mass on its top 2; the student has mass elsewhere: large but finite.
    student = torch.log_softmax(torch.zeros(1, 1, 4, requires_grad=True), -1)
    ids = torch.tensor([[[0, 1]]])
    teacher = torch.log(torch.tensor([[[0.5, 0.5]]]))
    kl = topk_reverse_kl(student, ids, teacher, torch.ones(1, 1, dtype=torch.bool))
    expected = 2 * 0.25 * math.log(0.25 / 0.5) + 0.5 * math.log(0.5 / TAIL_FLOOR)
    assert kl.item() == pytest.approx(expected, rel=1e-5)
