"""The architectures users run, as random-weight models: what they cost without downloading them.

Cost and memory do not depend on the weights' values: a randomly initialised model of the exact
architecture reads the same bytes, does the same matrix products and holds the same keys and values
as the real one. `build_random_model` writes such a model (config, safetensors weights, a tokenizer
as wide as the vocabulary, the chat template), loadable by every engine and the trainer, so that
serving, training and swapping can be measured at the sizes people use. **Its answers are noise**:
it is for cost and memory only.

The shapes are written here from the published `config.json` of each model (Qwen3, April 2025).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape: everything its cost and memory depend on."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6

    @property
    def parameters(self) -> int:
        """Every weight: embeddings, attention and MLP projections, norms, and the output layer unless tied."""
        hidden, heads, kv_heads, head_dim = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q and o, k and v
        mlp = 3 * hidden * self.intermediate_size  # gate, up, down
        norms = 2 * hidden + 2 * head_dim  # input and post-attention norms, q_norm and k_norm
        embeddings = self.vocab_size * hidden * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * (attention + mlp + norms) + embeddings + hidden

    def lora_parameters(self, rank: int) -> int:
        """A rank-`rank` adapter on every linear projection of every layer (`all-linear`: not the output layer)."""
        hidden, inner = self.hidden_size, self.intermediate_size
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        per_layer = (hidden + q) * 2 + (hidden + kv) * 2 + (hidden + inner) * 3  # q, o; k, v; gate, up, down
        return self.num_hidden_layers * rank * per_layer

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over all layers, in 16-bit floats."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2


# From each model's published config.json (Qwen/Qwen3-0.6B, Qwen/Qwen3-4B, Qwen/Qwen3-8B).
ARCHITECTURES: dict[str, Architecture] = {
    "qwen3-0.6b": Architecture(1024, 3072, 28, 16, 8, 128, 151936, tie_word_embeddings=True),
    "qwen3-4b": Architecture(2560, 9728, 36, 32, 8, 128, 151936, tie_word_embeddings=True),
    "qwen3-8b": Architecture(4096, 12288, 36, 32, 8, 128, 151936, tie_word_embeddings=False),
    # Qwen3's layers scaled down to the tiny model's, with the real vocabulary: the dry runs of the
    # GPU check (benchmarks/gpu_check.sh) and the tests
    "qwen3-tiny": Architecture(64, 192, 2, 2, 1, 32, 151936, tie_word_embeddings=True),
}

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def architecture_of(like: str) -> Architecture:
    if like not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {like!r}: one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[like]


def architecture_of_config(config: dict) -> Architecture:
    """The shape of a Hugging Face `config.json` (Qwen2/Qwen3/Llama-style decoders)."""
    text = config.get("text_config", config)
    heads = text["num_attention_heads"]
    return Architecture(
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=text["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=text.get("num_key_value_heads", heads),
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        vocab_size=text["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=text.get("max_position_embeddings", 40960),
    )


def widen_tokenizer(tokenizer: PreTrainedTokenizerFast, size: int, seed: int = 0) -> PreTrainedTokenizerFast:
    """`tokenizer` (a byte-level BPE) grown to exactly `size` tokens by made-up merges.

    Every id a `size`-wide output layer can sample then decodes to text, as with a real
    tokenizer. The new tokens join two existing ones and rank after every trained merge, so
    ordinary text still splits as before, a little coarser where two trained tokens happen to meet.
    """
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges: list = state["model"]["merges"]
    special = {token["content"] for token in state["added_tokens"]}
    missing = size - len(tokenizer)
    if missing < 0:
        raise ValueError(f"the tokenizer already has {len(tokenizer)} tokens, more than {size}")
    base = sorted(token for token in vocab if token not in special)
    rng = random.Random(seed)
    next_id = max([*vocab.values(), *(token["id"] for token in state["added_tokens"])]) + 1
    # The added tokens keep their ids; new regular tokens take the ids after them.
    while missing:
        left, right = rng.choice(base), rng.choice(base)
        if left + right in vocab:
            continue
        vocab[left + right] = next_id
        merges.append([left, right])
        next_id += 1
        missing -= 1
    wide = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)),
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        model_max_length=tokenizer.model_max_length,
        clean_up_tokenization_spaces=False,
        chat_template=tokenizer.chat_template,
    )
    assert len(wide) == size, (len(wide), size)
    return wide


def random_config(architecture: Architecture, tokenizer: PreTrainedTokenizerFast, dtype: str) -> Qwen3Config:
    shape = asdict(architecture)
    return Qwen3Config(
        **shape,
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
        pad_token_id=tokenizer.convert_tokens_to_ids(tokenizer.pad_token),
        dtype=dtype,
    )


def build_random_model(out_dir: Path, architecture: Architecture, tokenizer: PreTrainedTokenizerFast,
                       dtype: str = "bfloat16", seed: int = 0, device: str = "cpu") -> Path:  # fmt: skip
    """Write a random-weight Qwen3-architecture model of `architecture` to `out_dir`.

    `tokenizer` is widened to the vocabulary (`widen_tokenizer`); `device` is where the weights
    are initialised (a GPU initialises billions of weights in seconds), `dtype` how they are stored.
    """
    out_dir = Path(out_dir)
    wide = widen_tokenizer(tokenizer, architecture.vocab_size, seed=seed)
    config = random_config(architecture, wide, dtype)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(DTYPES[dtype])
    stop_ids = [config.eos_token_id, config.pad_token_id]
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=config.pad_token_id)
    model.save_pretrained(out_dir)
    wide.save_pretrained(out_dir)
    return out_dir
