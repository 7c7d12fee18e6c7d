"""What one optimizer step reports (the step consumes `clawrl.types.TrainingExample`s).

Every field of `StepMetrics` is a plain number, so `dataclasses.asdict` gives a JSON-serialisable
record for the version row in the store, `/metrics` and TensorBoard.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepMetrics:
    """What one update on a batch did. Means are over response tokens unless the name says samples, each
    token weighted as in the loss (`LossConfig.loss_agg`: equally, except under `seq-mean`, where
    every response weighs the same). With several optimizer steps per batch (`ppo_epochs`,
    `mini_batches`), the loss, the token means and `grad_norm` are the means over the steps of each
    step's figure (under its mini-batch's weights)."""

    loss: float = 0.0  # the optimised objective (its tokens aggregated as `loss_agg` says)
    clip_fraction: float = 0.0  # share of tokens whose ratio was clipped (gradient stopped)
    approx_kl: float = 0.0  # k3 estimate of KL(pi_old || pi_theta): mean of (rho - 1) - log rho
    entropy: float = 0.0  # mean entropy of the policy over response positions (nats)
    kl_to_reference: float = 0.0  # k3 estimate of KL(pi_theta || pi_ref); 0 when kl_beta is 0 (not computed)
    topk_reverse_kl: float = 0.0  # mean top-K reverse KL to the teacher; 0 unless opd_topk is set
    mean_advantage: float = 0.0  # mean per-token advantage
    mean_reward: float = 0.0  # mean reward over samples
    opd_fraction: float = 0.0  # share of samples that carried teacher log-probs
    logprob_drift: float = 0.0  # mean |log pi_old - log pi_behaviour| over response tokens
    mean_is_weight: float = 0.0  # mean truncated importance weight min(pi_old / pi_behaviour, cap)
    mean_staleness: float = 0.0  # trainer version minus behaviour version, mean over samples (set by the trainer)
    num_samples: int = 0
    num_tokens: int = 0  # response tokens trained on
    grad_norm: float = 0.0  # global gradient norm before clipping
    skipped_step: int = 0  # 1 when every gradient was non-finite and the weights were left unchanged
    optimizer_steps: int = 0  # optimizer steps taken on the batch: ppo_epochs x mini_batches, less non-finite ones
    step_seconds: float = 0.0  # wall time of the whole update step
    tokens_per_s: float = 0.0  # num_tokens / step_seconds
