"""Data-parallel steps (DESIGN §10): a batch's micro-batches shared out over ranks, gradients summed.

`update.update_step` weighs every response token from the *whole* batch before any micro-batch
runs, so the batch gradient is a plain sum of micro-batch gradients. That makes data parallelism
exact rather than approximate: each rank runs a share of the micro-batches (`shard`), the ranks'
gradients are summed (`all_reduce_sum`: a SUM, never a mean, since each share is already weighted
as a part of the whole), and every rank clips and steps the same summed gradient, so identical
parameters stay identical. The running statistics are sums too and are reduced the same way, so
every rank reports the batch's figures. Tensors are flattened into buckets of one dtype and device
before they are reduced: a few collective calls a step, not one per parameter.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

BUCKET_BYTES = 32 * 2**20  # per collective call: large enough to amortise its latency, small enough to copy cheaply


def shard(costs: Sequence[int], ranks: int) -> list[int]:
    """The rank that runs each micro-batch, balancing the ranks' summed `costs` (packed tokens).

    Largest first, each to the rank with the least so far (the lower rank on a tie): deterministic,
    so every rank computes the same assignment from the same batch without talking, and every
    micro-batch goes to exactly one rank.
    """
    owners = [0] * len(costs)
    loads = [(0, rank) for rank in range(ranks)]
    for index in sorted(range(len(costs)), key=lambda index: (-costs[index], index)):
        load, rank = heapq.heappop(loads)
        owners[index] = rank
        heapq.heappush(loads, (load + costs[index], rank))
    return owners


def _buckets(tensors: Sequence[Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of `tensors` grouped by dtype and device, each group cut to about `bucket_bytes`."""
    groups: dict[tuple[torch.dtype, torch.device], list[list[int]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for index, tensor in enumerate(tensors):
        key = (tensor.dtype, tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        if key not in groups or sizes[key] + nbytes > bucket_bytes:
            groups.setdefault(key, []).append([])
            sizes[key] = 0
        groups[key][-1].append(index)
        sizes[key] += nbytes
    return [bucket for buckets in groups.values() for bucket in buckets]


def all_reduce_sum(tensors: Sequence[Tensor], group: dist.ProcessGroup, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Replace each tensor, in place, by its sum over the group's ranks, a flattened bucket per call."""
    for bucket in _buckets(tensors, bucket_bytes):
        flat = torch.cat([tensors[index].reshape(-1) for index in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for index in bucket:
            tensor = tensors[index]
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


def all_reduce_gradients(parameters: Sequence[Tensor], group: dist.ProcessGroup) -> None:
    """Sum the parameters' gradients over the ranks; a rank that ran no micro-batch adds zeros.

    A parameter no rank computed a gradient for keeps `grad` None, as one process would leave it
    (so the optimizer skips it there too: AdamW would otherwise decay it).
    """
    device = parameters[0].device if parameters else torch.device("cpu")
    present = torch.tensor([parameter.grad is not None for parameter in parameters], dtype=torch.int32, device=device)
    dist.all_reduce(present, op=dist.ReduceOp.SUM, group=group)
    reduced = [parameter for parameter, count in zip(parameters, present.tolist()) if count > 0]
    for parameter in reduced:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    all_reduce_sum([parameter.grad for parameter in reduced], group)  # type: ignore[misc]


def all_gather_scores(
    local: dict[int, tuple[Tensor, Tensor | None]], device: torch.device, group: dist.ProcessGroup
) -> dict[int, tuple[Tensor, Tensor | None]]:
    """Every rank's per-example scores (keyed by the example's index in the batch), on every rank's `device`.

    Used for π_old (and π_ref) computed before a batch's first of several steps: each rank scores
    its share of the batch, but a later step's micro-batch may hold examples another rank scored.
    """
    on_cpu = {index: (old.cpu(), ref.cpu() if ref is not None else None) for index, (old, ref) in local.items()}
    gathered: list[dict[int, tuple[Tensor, Tensor | None]] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, on_cpu, group=group)
    merged = {index: scores for part in gathered for index, scores in (part or {}).items()}
    return {index: (old.to(device), ref.to(device) if ref is not None else None) for index, (old, ref) in merged.items()}
