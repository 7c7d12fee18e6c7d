"""A frozen base model in 4 bits (QLoRA's NormalFloat4), in plain torch, so a 4B model fits a small GPU.

Serving and LoRA training never change the base weights: only the adapter learns. The base can
therefore be stored in a lossy, compact form as long as every forward sees a faithful 16-bit
approximation of it. This module stores each linear layer's weight as 4-bit codes plus one scale
per block of `NF4_BLOCK` consecutive weights, and dequantizes it on the fly, one layer at a time,
for each matrix product. Qwen3-4B's linear layers then take 1.9 GB instead of 7.3 GB.

Why NormalFloat4 rather than evenly spaced levels: the weights of a trained layer are close to
normally distributed, so after dividing a block by its absolute maximum, levels placed at the
quantiles of a standard normal are each used about equally often and waste none of the 16 codes on
rare values (Dettmers et al., "QLoRA", 2023). One level is exactly zero, so zero weights stay zero.

Why small blocks with their own scale: one outlier only coarsens the 63 weights that share its
block, not the whole row. The scale is stored in bfloat16 for a 16-bit model (half the overhead of
float32, and bfloat16 has float32's range, so an fp16 block's absmax always fits) and in float32
for a float32 model, whose user asked for full precision everywhere else.

Why not bitsandbytes: it is a compiled CUDA dependency that many machines (CPU-only, ROCm, Apple,
the test machines) lack; the dequantize-then-matmul done here is a few torch operations that run
anywhere, and the layers stay ordinary `nn.Linear` subclasses that PEFT knows how to wrap.

Memory during training is the point, so the matrix product goes through `NF4Matmul`, an autograd
function that saves only the packed codes and scales for backward and dequantizes again there:
with a plain `F.linear` on the dequantized weight, autograd would keep a full 16-bit copy of every
layer alive until backward, which is the memory the 4 bits were meant to save.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NF4_BLOCK = 64

# Quantizing works through a layer this many weights at a time, so that its float32 temporaries
# stay a few MB however large the layer: quantizing a model then costs at most about one layer's
# memory on top of the model.
_CHUNK_WEIGHTS = 1 << 20

# QLoRA's outermost quantile. icdf(1) is infinite, so the extreme levels sit at the quantile halfway
# between the conventions for 15 and for 16 evenly spaced probabilities: 1 - 1/(2*15) and 1 - 1/(2*16).
_OUTER_PROBABILITY = ((1 - 1 / 30) + (1 - 1 / 32)) / 2


def nf4_levels() -> Tensor:
    """The 16 NormalFloat4 levels, ascending, float32, in [-1, 1]: index 7 is exactly 0, 0 and 15 are ±1.

    Sixteen codes cannot be symmetric around an exact zero, so the positive side gets 8 levels and
    the negative side 7: the quantiles of N(0, 1) at evenly spaced probabilities from 1/2 out to
    `_OUTER_PROBABILITY`, each side divided by its outermost quantile so the extremes are exactly ±1.
    """
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    positive = normal.icdf(torch.linspace(0.5, _OUTER_PROBABILITY, 9, dtype=torch.float64)[1:])
    negative = -normal.icdf(torch.linspace(0.5, _OUTER_PROBABILITY, 8, dtype=torch.float64)[1:])
    # Dividing each side by its own last value makes the extremes exactly ±1, so a block's absmax
    # weight is reproduced exactly by its scale.
    levels = torch.cat([negative / negative[-1].abs(), torch.zeros(1, dtype=torch.float64), positive / positive[-1]])
    return levels.sort().values.to(torch.float32)


@functools.cache
def _midpoints(device: torch.device) -> Tensor:
    """The 15 boundaries between neighbouring levels: nearest-level rounding is a bucketize on them.
    Cached per device so that no forward pays a host-to-device copy."""
    levels = nf4_levels()
    return ((levels[1:] + levels[:-1]) / 2).to(device)


@functools.cache
def _byte_table(device: torch.device) -> Tensor:
    """[256, 2] float32: the two levels a packed byte stands for (high nibble first).

    Looking bytes up directly, rather than unpacking nibbles and looking each up, halves the index
    tensor that dequantizing allocates for every layer on every forward.
    """
    levels = nf4_levels()
    codes = torch.arange(256)
    return torch.stack([levels[codes >> 4], levels[codes & 15]], dim=1).to(device)


def _scale_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if weight_dtype in (torch.bfloat16, torch.float16) else torch.float32


def _check_quantizable(weight: Tensor, block: int) -> None:
    if not weight.is_floating_point():
        raise ValueError(f"only floating-point weights can be quantized, not {weight.dtype}")
    if block <= 0 or block % 2:
        raise ValueError(f"the block must be a positive even number of weights, not {block}")
    if weight.numel() % block:
        raise ValueError(
            f"a weight of shape {tuple(weight.shape)} ({weight.numel()} values) cannot be quantized in "
            f"blocks of {block}: its number of values must be a multiple of {block}"
        )


def quantize_nf4(weight: Tensor, block: int = NF4_BLOCK, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Quantize `weight` to NormalFloat4: returns `(packed, scales)`.

    The weight is read flat, in row-major order, and cut into blocks of `block` consecutive values.
    `scales` (shape `[numel // block]`) holds each block's absolute maximum, in bfloat16 for a 16-bit
    weight and float32 otherwise (see the module docstring); an all-zero block has scale 0.
    `packed` (uint8, shape `[numel // 2]`: flat, so that nothing mistakes it for a matrix) holds the
    index of the level nearest to value / scale, two per byte, the even position in the high nibble.
    Rounding divides by the stored scale, so the level chosen is the nearest for the value that
    `dequantize_nf4` will give back.

    With `device`, the codes and scales are made there, the weight moved over a chunk at a time (a
    model in host memory is quantized onto a GPU without the GPU ever holding a 16-bit layer, whose
    freed blocks would be split by the next layer's codes and fragment the allocator).

    On a `meta` tensor, returns meta tensors of the right shapes and dtypes. Raises ValueError when
    the number of values is not a multiple of `block` (an even number), or the weight is not finite.
    """
    _check_quantizable(weight, block)
    numel, device = weight.numel(), torch.device(device) if device is not None else weight.device
    packed = torch.empty(numel // 2, dtype=torch.uint8, device=device)
    scales = torch.empty(numel // block, dtype=_scale_dtype(weight.dtype), device=device)
    if device.type == "meta" or weight.device.type == "meta":
        return packed, scales
    flat = weight.detach().reshape(-1)
    midpoints = _midpoints(device)
    step = max(1, _CHUNK_WEIGHTS // block) * block
    for start in range(0, numel, step):
        blocks = flat[start : start + step].to(device).float().view(-1, block)
        scale = blocks.abs().amax(dim=1).to(scales.dtype)
        scales[start // block : start // block + scale.numel()] = scale
        divisor = scale.float()
        # An all-zero block: any divisor leaves its values at 0, which maps to the zero level.
        divisor = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
        codes = torch.bucketize(blocks / divisor.unsqueeze(1), midpoints, out_int32=True).view(-1, 2)
        packed[start // 2 : start // 2 + codes.shape[0]] = ((codes[:, 0] << 4) | codes[:, 1]).to(torch.uint8)
    # absmax propagates NaN and inf, so checking the small scales checks the whole weight.
    if not torch.isfinite(scales).all():
        raise ValueError(f"cannot quantize a weight of shape {tuple(weight.shape)} that holds NaN or infinite values")
    return packed, scales


def dequantize_nf4(packed: Tensor, scales: Tensor, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
    """The weight of `shape` and `dtype` that `quantize_nf4` packed: each value is level × scale,
    multiplied in float32 and rounded once to `dtype`. The block size is implied by the number of scales."""
    shape = torch.Size(shape)
    numel = shape.numel()
    if packed.numel() * 2 != numel or scales.numel() == 0 or numel % scales.numel():
        raise ValueError(
            f"{packed.numel()} packed bytes and {scales.numel()} scales do not describe a weight of shape {tuple(shape)}"
        )
    block = numel // scales.numel()
    values = torch.index_select(_byte_table(packed.device), 0, packed.reshape(-1).int())
    values = values.view(-1, block).mul_(scales.float().unsqueeze(1))
    return values.to(dtype).view(shape)


class NF4Matmul(torch.autograd.Function):
    """`F.linear(x, W)` for a frozen NF4 weight W, keeping only the 4-bit form for backward.

    Called as `NF4Matmul.apply(x, packed, scales, shape, dtype)`, with `x` already in `dtype`.
    The weight never gets a gradient; backward dequantizes W again for the gradient of `x`, which
    costs one more dequantization per layer but no 16-bit copy of any layer between forward and
    backward.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, packed: Tensor, scales: Tensor, shape: torch.Size, dtype: torch.dtype
    ) -> Tensor:
        ctx.save_for_backward(packed, scales)
        ctx.shape, ctx.dtype = shape, dtype
        return F.linear(x, dequantize_nf4(packed, scales, shape, dtype))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, None, None, None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        packed, scales = ctx.saved_tensors
        weight = dequantize_nf4(packed, scales, ctx.shape, ctx.dtype)
        return grad_output.to(ctx.dtype) @ weight, None, None, None, None


class Linear4bit(nn.Linear):
    """A frozen linear layer whose weight is stored in NF4 (see `quantize_nf4`).

    It subclasses `nn.Linear` so that PEFT wraps it with LoRA like any linear layer (including the
    `all-linear` target selection), but never builds a full-precision weight: `weight` is a frozen
    `nn.Parameter` holding the packed uint8 codes (shape `[in * out // 2]`), `scales` a buffer, and
    `bias` (if any) a frozen parameter in `compute_dtype`. PEFT reads `weight` for the adapter's
    device and `compute_dtype` for its dtype, as it does for bitsandbytes' layers. Both `weight` and
    `scales` are in the state_dict, so a quantized model saves and loads as usual.

    `compute_dtype` is the dtype of the original weight: the weight is dequantized to it, the
    input is cast to it for the product, and the output is cast back to the input's dtype.

    The constructor builds an empty skeleton (uninitialised codes and scales, to be filled by
    `load_state_dict`); `from_linear` quantizes an existing layer.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        compute_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        block: int = NF4_BLOCK,
    ) -> None:
        # nn.Linear.__init__ would allocate (and initialise) the full-precision weight that this
        # layer exists to avoid; only nn.Module's bookkeeping is wanted.
        nn.Module.__init__(self)
        numel = in_features * out_features
        if block <= 0 or block % 2 or numel % block:
            raise ValueError(
                f"a {out_features}x{in_features} weight cannot be quantized in blocks of {block}: "
                f"its number of values must be a multiple of {block} (an even number)"
            )
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype, self.block = compute_dtype, block
        self.weight = nn.Parameter(torch.empty(numel // 2, dtype=torch.uint8, device=device), requires_grad=False)
        self.register_buffer("scales", torch.empty(numel // block, dtype=_scale_dtype(compute_dtype), device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=compute_dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, block: int = NF4_BLOCK, device: torch.device | None = None) -> Linear4bit:
        """`linear` quantized, on `device` (default: its own, meta included); the bias is shared with it
        when it stays on its device, not copied."""
        weight = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, weight.dtype, "meta", block)
        packed, scales = quantize_nf4(weight, block, device)
        layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.scales = scales
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach().to(packed.device), requires_grad=False)
        return layer

    def dequantized_weight(self) -> Tensor:
        """The `[out_features, in_features]` weight in `compute_dtype` (a fresh tensor)."""
        return dequantize_nf4(self.weight, self.scales, (self.out_features, self.in_features), self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        shape = torch.Size((self.out_features, self.in_features))
        out = NF4Matmul.apply(x.to(self.compute_dtype), self.weight, self.scales, shape, self.compute_dtype)
        if self.bias is not None:
            out = out + self.bias.to(self.compute_dtype)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        dtype = str(self.compute_dtype).removeprefix("torch.")
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"nf4 blocks of {self.block}, compute_dtype={dtype}"
        )


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",), device: torch.device | None = None) -> int:
    """Replace, in place, every `nn.Linear` of `model` whose qualified name does not end with one of
    `skip` (and that is not already a `Linear4bit`) with its `Linear4bit`; returns how many. With
    `device`, each layer's codes are made there (a model loaded in host memory is quantized onto a
    GPU: the GPU never holds a 16-bit layer, see `quantize_nf4`).

    The output layer is skipped by default: in Qwen3-0.6B/4B it is tied to the embedding, which
    stays in 16 bits (a lookup table gains nothing from being dequantized whole at every step).
    Layers are replaced one at a time and the original is dropped before the next is quantized, so
    memory grows by at most about one layer (unless the caller holds other references to them). A
    model on the meta device gets the quantized structure without allocating anything.
    """
    names = [
        name
        for name, module in model.named_modules()
        if name and isinstance(module, nn.Linear) and not isinstance(module, Linear4bit) and not name.endswith(skip)
    ]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, Linear4bit.from_linear(getattr(parent, child), device=device))
    return len(names)


def quantized_bytes_per_weight(scale_bytes: int) -> float:
    """Bytes per weight of a quantized linear layer: half a byte of code plus its share of a block's scale
    (`scale_bytes` = 2 for a 16-bit model's bfloat16 scales, 4 for a float32 model's)."""
    return 0.5 + scale_bytes / NF4_BLOCK
