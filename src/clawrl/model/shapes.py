"""The architectures users run: the shapes their cost and memory depend on.

The shapes are written here from the published `config.json` of each model (Qwen3, April 2025).
Plain data, no torch: `clawrl plan` answers at once. `model/random_weights.py` builds a model of
any of them with random weights.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    def linear_parameters(self) -> int:
        """The weights of every layer's projections (q, k, v, o, gate, up, down): what `--quantize nf4`
        stores in 4 bits (the embeddings, the norms and the output layer stay in 16 bits)."""
        hidden, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return self.num_hidden_layers * (hidden * q * 2 + hidden * kv * 2 + 3 * hidden * self.intermediate_size)

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
