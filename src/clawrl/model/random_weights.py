"""Random-weight models of the architectures users run: what they cost without downloading them.

Cost and memory do not depend on the weights' values: a randomly initialised model of the exact
architecture reads the same bytes, does the same matrix products and holds the same keys and values
as the real one. `build_random_model` writes such a model (config, safetensors weights, a tokenizer
as wide as the vocabulary, the chat template), loadable by every engine and the trainer, so that
serving, training and swapping can be measured at the sizes people use. **Its answers are noise**:
it is for cost and memory only.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from clawrl.model.shapes import Architecture

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


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
