"""How the `hf` engine picks each token: a private RNG per request, temperature and top-p over the
raw distribution, and the `TokenStep` it reports (log-probs always from the raw distribution, or,
for a response under a grammar, from the raw distribution masked to the grammar and renormalised:
the distribution actually sampled from).

Pure functions of tensors, so a batch of rows samples exactly as each row would alone.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

from clawrl.engines.base import SamplingParams, TokenStep
from clawrl.model.constraints import masked_logits


def new_generator(sampling: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private RNG per request, so its samples do not depend on what it is batched with.

    Greedy requests need none. Without a seed the request gets a fresh random one.
    """
    if sampling.temperature == 0:
        return None
    seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
    return torch.Generator(device=device).manual_seed(seed)


MIN_TEMPERATURE = 1e-5


def pick_token(logprobs: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Choose one token id (a 0-d tensor) from one row of raw log-probs.

    Temperature 0 is greedy (and so is one below `MIN_TEMPERATURE`, as in vLLM: dividing by it
    overflows float32, and a row of -inf has no distribution). Otherwise the raw distribution is
    sharpened/flattened by the temperature and cut to the smallest set of most likely tokens whose
    mass reaches `top_p`.
    """
    if generator is None or sampling.temperature < MIN_TEMPERATURE:
        return logprobs.argmax()
    probs = torch.softmax(logprobs / sampling.temperature, dim=-1)
    if sampling.top_p >= 1:
        return torch.multinomial(probs, 1, generator=generator)[0]
    sorted_probs, order = probs.sort(descending=True)
    # Keep a token while the mass of the tokens before it is below top_p: the first always stays
    # (set, not computed: a top_p below float32's smallest number, 5e-324, rounds to 0 < 0).
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < sampling.top_p
    keep_sorted[..., 0] = True
    # Draw in vocabulary order, not sorted order: two near-equal probabilities swap ranks under the
    # float noise of another batch shape, and a draw over the sorted list would then land on the
    # other token; in vocabulary order only a token at the nucleus boundary can change the draw.
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.multinomial(probs * keep, 1, generator=generator)[0]


def sample_steps(
    logits: torch.Tensor,
    requests: Sequence[tuple[SamplingParams, torch.Generator | None]],
    allowed: Sequence[torch.Tensor | None] | None = None,
) -> list[TokenStep]:
    """Sample one token per row of `logits` ([rows, vocab]) and describe it as a `TokenStep`.

    `allowed`: per row, the grammar's mask of the tokens that may come next ([W] int32 words,
    `model.constraints`), or None. Log-probs come from the raw distribution, masked where a row has
    a mask (see the module docstring). Everything is computed on the model's device and copied to
    the host once, with one synchronisation per step.
    """
    logits = logits.float()
    if allowed is not None and any(words is not None for words in allowed):
        width = next(words for words in allowed if words is not None).shape[-1]
        rows = [words if words is not None else torch.full((width,), -1, dtype=torch.int32) for words in allowed]
        logits = masked_logits(logits, torch.stack(rows).to(logits.device))
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = torch.stack([pick_token(logprobs[i], params, gen) for i, (params, gen) in enumerate(requests)])
    token_logprobs = logprobs.gather(1, tokens[:, None])[:, 0]
    k = min(max(params.top_logprobs for params, _ in requests), logprobs.shape[-1])
    if k:
        top_values, top_ids = logprobs.topk(k, dim=-1)  # sorted, best first
        tops = list(zip(top_ids.tolist(), top_values.tolist()))
    else:
        tops = [([], [])] * len(requests)
    steps = []
    for (params, _), token, logprob, (ids, values) in zip(requests, tokens.tolist(), token_logprobs.tolist(), tops):
        # a grammar may leave fewer tokens than asked for: the rest have probability 0 and are left out
        alternatives = [(i, v) for i, v in zip(ids[: params.top_logprobs], values[: params.top_logprobs]) if v > -math.inf]
        steps.append(TokenStep(token_id=token, logprob=logprob, top_logprobs=alternatives))
    return steps
