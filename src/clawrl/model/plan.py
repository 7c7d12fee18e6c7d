"""Will it fit? The memory of serving and training one model on one device, part by part.

`plan` predicts the peak bytes of each part of `clawrl serve --method ...` (the server and the
trainer process beside it) from the model's shape and the traffic, says whether their sum fits a
device of a given size, and what to change when it does not. It is arithmetic over the
architecture, written from how the engine and the trainer hold their tensors:

* weights: every parameter at the serving dtype, once in the server and once in the trainer (two
  processes, two copies), or once for both when the trainer maps the server's copy (`shared_base`:
  the page cache on a CPU, `clawrl.model.weights`; CUDA IPC on a GPU, `clawrl.model.cuda_share`);
  with a 4-bit base (`quantize="nf4"`) the layers' projections take half a byte a weight and a
  16-bit scale per 64 (`clawrl.model.quantize`);
* the server's keys and values: every concurrent session's prompt and answer, plus the prefix cache's
  budget (`--prefix-cache-gib`);
* the adapter (LoRA) or every weight (full): fp32 adapter weights, their gradients and AdamW's two
  moments (16 bytes a parameter); full fine-tuning keeps gradients and moments in the weights' dtype,
  and a frozen copy for the OPD teacher or the KL reference;
* activations: the tensors autograd keeps per token and layer (`ACTIVATION_ELEMENTS`), times the
  tokens one micro-batch runs: the rows' whole padded prompts and answers, or with prefix sharing the
  shared prefix once and each row's own part (the rows read the prefix's one copy of keys and values);
  with activation checkpointing each layer's input only, plus one layer's worth;
* logits: one chunk of `logit_chunk_tokens` positions over the vocabulary, in fp32, with its
  log-softmax and gradient;
* on a GPU, each process's CUDA runtime (`CUDA_RUNTIME_GIB`).

`calibration` in the result names the one measured constant (`ACTIVATION_OVERHEAD`) and what it was
measured on; `docs/benchmarks.md` compares the predictions with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clawrl.model.shapes import Architecture

NF4_BLOCK = 64  # weights per scale of a 4-bit base (clawrl.model.quantize, kept free of torch here)

GIB = 2**30
# Fraction of a device the allocator can hand out as tensors: the caching allocator's fragmentation
# takes the rest.
USABLE_FRACTION = 0.92
# What each process holds on a GPU besides its tensors: its CUDA context, cuBLAS's workspaces and the
# caching allocator's slack. Measured per process (nvidia-smi, minus the process's weights and adapter
# state) on an H200 with torch 2.11: 1.0-1.3 GiB for the server, 0.9-1.9 GiB for the trainer (the GPU
# check of 2026-11-27, docs/benchmarks.md); added after that check, so the next one tests it.
CUDA_RUNTIME_GIB = 1.2
# Measured ratio of what autograd keeps to the count of `activation_elements`: the per-token slope of
# a LoRA step's peak on Qwen3-0.6B in fp32 on the CPU (650 and 1,050 positions: 2.89 MB a position,
# counted 3.10 MB). Measured once, before any GPU figure existed; docs/benchmarks.md compares.
ACTIVATION_OVERHEAD = 0.93
# fp32 [chunk, vocabulary] tensors alive at once in the chunked loss (logits, log-softmax, their
# gradients, the recomputed chunk): six, from the qwen3-tiny dry run, where the logits dominate.
LOGIT_COPIES = 6


def activation_elements(shape: Architecture) -> int:
    """Values autograd keeps per token and decoder layer when an adapter trains: the residual stream
    and both norms' inputs and outputs, the queries, keys and values before and after their norms and
    rotation, the attention's output, the MLP's gate, up, activation and product."""
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    return 3 * shape.hidden_size + 4 * q + 4 * kv + 4 * shape.intermediate_size


def activation_bytes(shape: Architecture, dtype_bytes: int, lora: bool = True) -> float:
    """Bytes autograd keeps per token and layer. With 16-bit weights two things keep fp32 copies,
    counted apart: the RMSNorms compute in fp32 (both layer norms, the query and key norms), and
    PEFT casts each adapted projection's input to the adapter's fp32 before its A matrix (q, k, v,
    gate and up each their own copy of the hidden state; o the attention's output; down the MLP's)."""
    kept = activation_elements(shape) * dtype_bytes * ACTIVATION_OVERHEAD
    if dtype_bytes < 4:
        q = shape.num_attention_heads * shape.head_dim
        kv = shape.num_key_value_heads * shape.head_dim
        kept += (4 * shape.hidden_size + 2 * (q + kv)) * 4
        if lora:
            kept += (5 * shape.hidden_size + q + shape.intermediate_size) * 4
    return kept


@dataclass
class Workload:
    """What runs on the device: the traffic the server holds and the update the trainer takes."""

    prompt_tokens: int = 20000  # one request's prompt (system prompt, tools, conversation)
    response_tokens: int = 300  # one answer
    sessions: int = 8  # sessions served at once, each holding its prompt's and answer's keys and values
    prefix_cache_gib: float = 0.0  # the hf engine's prefix cache budget
    dtype_bytes: int = 2  # weights and activations: 2 for bfloat16, 4 for float32
    train: bool = True  # a trainer process beside the server
    shared_base: bool = False  # the trainer maps the server's copy of the base (`--share-weights`: CPU, or GPU with hf)
    quantize: str = "none"  # "nf4": the base's projections in 4 bits (`--quantize nf4`)
    full: bool = False  # every weight instead of a LoRA adapter
    lora_rank: int = 16
    reference_copy: bool = True  # full fine-tuning: a frozen copy for the teacher / KL reference
    micro_batch_size: int = 4  # rows per micro-batch (a session's turns)
    turn_tokens: int = 150  # what each turn adds to the last turn's prompt besides the last answer
    share_prefix: bool = True
    activation_checkpointing: bool = False
    logit_chunk_tokens: int = 1024
    runtime_gib: float = CUDA_RUNTIME_GIB  # per process, besides its tensors (0 on a CPU)


@dataclass
class Part:
    name: str
    process: str  # "server" or "trainer"
    bytes: int
    note: str


@dataclass
class Plan:
    parts: list[Part]
    device_bytes: int | None
    advice: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(part.bytes for part in self.parts)

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.total_bytes <= self.device_bytes * USABLE_FRACTION

    def to_dict(self) -> dict:
        return {
            "parts": [part.__dict__ for part in self.parts],
            "total_bytes": self.total_bytes,
            "device_bytes": self.device_bytes,
            "usable_bytes": None if self.device_bytes is None else int(self.device_bytes * USABLE_FRACTION),
            "fits": self.fits,
            "advice": self.advice,
            "calibration": {"activation_overhead": ACTIVATION_OVERHEAD, "logit_copies": LOGIT_COPIES},
        }


def micro_batch_tokens(load: Workload, shared: bool) -> int:
    """Token positions one micro-batch runs: B left-padded rows, or the prefix once plus each row's own part."""
    step = load.turn_tokens + load.response_tokens
    longest_prompt = load.prompt_tokens + (load.micro_batch_size - 1) * step
    if not shared:
        return load.micro_batch_size * (longest_prompt + load.response_tokens)
    return load.prompt_tokens + load.micro_batch_size * step


def training_activations(shape: Architecture, load: Workload) -> tuple[int, str]:
    shared = load.share_prefix and not load.activation_checkpointing and load.micro_batch_size > 1
    tokens = micro_batch_tokens(load, shared)
    per_layer = activation_bytes(shape, load.dtype_bytes, lora=not load.full)
    if load.activation_checkpointing:
        # each layer's input kept, one layer recomputed at a time
        kept = tokens * shape.hidden_size * load.dtype_bytes * shape.num_hidden_layers + tokens * per_layer
        return int(kept), f"{tokens} positions, checkpointed layers"
    kept = tokens * per_layer * shape.num_hidden_layers
    # the rows below a shared prefix read its one copy of keys and values (model/prefix_attention.py)
    return int(kept), f"{tokens} positions" + (" (the prefix once)" if shared else "")


def weight_bytes(shape: Architecture, load: Workload) -> int:
    """One copy of the base: every parameter at the dtype, or with a 4-bit base its projections at half
    a byte and a scale (in the weights' dtype) per `NF4_BLOCK`."""
    if load.quantize == "none":
        return shape.parameters * load.dtype_bytes
    quantized = shape.linear_parameters * (0.5 + load.dtype_bytes / NF4_BLOCK)
    return int(quantized + (shape.parameters - shape.linear_parameters) * load.dtype_bytes)


def plan(shape: Architecture, load: Workload, device_gib: float | None = None) -> Plan:
    weights = weight_bytes(shape, load)
    kv_per_token = shape.kv_bytes_per_token * load.dtype_bytes // 2
    session_kv = load.sessions * (load.prompt_tokens + load.response_tokens) * kv_per_token
    parts = [
        Part("serving weights", "server", weights, f"{shape.parameters / 1e9:.2f}B parameters"
             + (", projections in 4 bits" if load.quantize != "none" else "")),
        Part("serving keys and values", "server", session_kv, f"{load.sessions} sessions x "
             f"{load.prompt_tokens + load.response_tokens} tokens x {kv_per_token / 1024:.0f} KiB"),  # fmt: skip
    ]
    if load.prefix_cache_gib:
        parts.append(Part("prefix cache", "server", int(load.prefix_cache_gib * GIB), "its budget"))
    runtime = Part("CUDA runtime", "server", int(load.runtime_gib * GIB), "context, workspaces, allocator slack")
    parts += [runtime] if load.runtime_gib else []
    if load.train:
        parts += trainer_parts(shape, load, weights)
        parts += [Part(runtime.name, "trainer", runtime.bytes, runtime.note)] if load.runtime_gib else []
    result = Plan(parts, None if device_gib is None else int(device_gib * GIB))
    if result.fits is False:
        result.advice = advice(shape, load, result)
    return result


def trainer_parts(shape: Architecture, load: Workload, weights: int) -> list[Part]:
    if load.shared_base and not load.full:
        parts = [Part("trainer weights", "trainer", 0, "maps the server's copy (a LoRA trainer never writes it)")]
    else:
        parts = [Part("trainer weights", "trainer", weights, "the trainer process loads its own copy")]
    if load.full:
        state = shape.parameters * load.dtype_bytes * 3  # gradients and AdamW's two moments, in the weights' dtype
        parts.append(Part("gradients and optimizer state", "trainer", state, "every weight, AdamW"))
        if load.reference_copy:
            parts.append(Part("frozen reference", "trainer", weights, "the OPD teacher / KL reference"))
    else:
        adapter = shape.lora_parameters(load.lora_rank)
        parts.append(Part("adapter, gradients and optimizer state", "trainer", adapter * 16,
                          f"rank {load.lora_rank}: {adapter / 1e6:.1f}M fp32 parameters"))  # fmt: skip
    activations, note = training_activations(shape, load)
    parts.append(Part("activations", "trainer", activations, note))
    positions = min(load.logit_chunk_tokens, load.micro_batch_size * load.response_tokens)
    logits = positions * shape.vocab_size * 4 * LOGIT_COPIES
    parts.append(Part("logits", "trainer", logits, f"{positions} positions x {shape.vocab_size}, fp32"))
    return parts


def advice(shape: Architecture, load: Workload, result: Plan) -> list[str]:
    """What would bring the total under the device's usable memory, largest saving first."""
    over = result.total_bytes - int(result.device_bytes * USABLE_FRACTION)
    options = []
    by_name = {part.name: part.bytes for part in result.parts}
    if not load.activation_checkpointing and by_name.get("activations", 0) > 0:
        saved = by_name["activations"] - training_activations(shape, _with(load, activation_checkpointing=True))[0]
        options.append((saved, "--activation-checkpointing (a third more compute)"))
    if load.micro_batch_size > 1 and by_name.get("activations", 0) > 0:
        saved = by_name["activations"] - training_activations(shape, _with(load, micro_batch_size=1))[0]
        options.append((saved, "--micro-batch-size 1"))
    if load.full:
        options.append((by_name.get("gradients and optimizer state", 0), "train a LoRA adapter instead of --full"))
    if not load.full and load.quantize == "none":
        copies = 1 if load.shared_base or not load.train else 2
        saved = (by_name["serving weights"] - weight_bytes(shape, _with(load, quantize="nf4"))) * copies
        options.append((saved, "--quantize nf4 (the base in 4 bits; slower per token)"))
    if not load.full and load.train and not load.shared_base:
        options.append((by_name.get("trainer weights", 0), "--share-weights (the trainer maps the server's base; hf engine)"))
    if load.sessions > 1:
        saved = by_name["serving keys and values"] // load.sessions * (load.sessions - 1)
        options.append((saved, "serve fewer sessions at once (--max-batch-size) or shorter prompts"))
    options.sort(reverse=True)
    lines = [f"{text}: saves {saved / GIB:.1f} GiB" for saved, text in options if saved > 0]
    lines.append(f"a device with at least {result.total_bytes / USABLE_FRACTION / GIB:.0f} GiB, or the trainer on a second one")
    return [f"{over / GIB:.1f} GiB over the usable memory", *lines]


def _with(load: Workload, **changes: object) -> Workload:
    return Workload(**{**load.__dict__, **changes})


def table(result: Plan) -> str:
    """The plan as a markdown table, then the verdict and the advice."""
    lines = ["| process | part | GiB | how |", "|---|---|---:|---|"]
    lines += [f"| {part.process} | {part.name} | {part.bytes / GIB:.2f} | {part.note} |" for part in result.parts]
    lines.append(f"| | **total** | **{result.total_bytes / GIB:.2f}** | |")
    if result.device_bytes is not None:
        usable = result.device_bytes * USABLE_FRACTION / GIB
        verdict = "fits" if result.fits else "does NOT fit"
        lines.append(f"\n{verdict} in {result.device_bytes / GIB:.0f} GiB ({usable:.1f} GiB usable)")
    lines += [f"- {line}" for line in result.advice]
    return "\n".join(lines)
