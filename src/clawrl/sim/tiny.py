"""Build a tiny Qwen2 chat model locally, with no download.

Tests and ``make demo`` need a real Hugging Face model directory (config, safetensors weights,
tokenizer, chat template, generation config) that loads with the ``Auto*`` classes like any hub
checkpoint, so that the serving, recording and training code paths are the same ones a real model
takes. This module makes one in a couple of seconds on a CPU:

* a byte-level BPE tokenizer (about 2K tokens) trained with ``tokenizers`` on the synthetic
  corpus of ``clawrl.sim.corpus``, with Qwen2's pre-processing (NFC, then Qwen2's split regex):
  byte-level means any string can be encoded and every NFC-normalised string (what keyboards and
  models produce) decodes back exactly; decomposed forms come back composed, as with real Qwen
  models;
* ChatML special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and the tool markup
  tokens (``<tool_call>``, ``</tool_call>``, ``<tools>``, ``</tools>``) as single tokens; the tool
  tokens are *not* special, so they survive ``decode(..., skip_special_tokens=True)`` and the
  server's tool-call parser can see them;
* a ChatML chat template with OpenAI-style tools and tool calls (``CHAT_TEMPLATE``);
* a randomly initialised ``Qwen2ForCausalLM`` with ~250K parameters but a 32K-token context,
  because real agents send system prompts of ~10K tokens.

The tokenizer is trained on a corpus with a fixed seed (``CORPUS_SEED``), so every tiny model
shares one tokenizer and only the weights depend on ``seed``. Building is deterministic: the
same seed gives a byte-identical ``model.safetensors``.

``tiny_model_path`` caches built models under ``tiny-v2-seed{seed}``; bump ``TINY_VERSION``
whenever anything here changes what is built, so stale caches are not reused.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from clawrl.model.folders import build_once
from clawrl.sim.corpus import build_corpus

TINY_VERSION = "tiny-v2"  # v2: heads of 32 dimensions (vLLM)
CORPUS_SEED = 0
VOCAB_SIZE = 2048  # total, including the special and tool tokens
CONTEXT_LENGTH = 32768

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tools>", "</tools>")
# Qwen2's pre-tokenization split (see train_tokenizer): contractions, words, single digits,
# punctuation runs, newlines, and spaces.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML. Rules, and why:
# * developer messages are rendered as system messages (OpenAI's newer name for the same thing);
# * with tools, the first block is a system block holding the system prompt (if the first message
#   is system/developer) and then the tool list, one JSON object per line inside <tools></tools>;
# * an assistant turn is exactly "<|im_start|>assistant\n" + content + one
#   "<tool_call>\n{...}\n</tool_call>" block per call + "<|im_end|>", with nothing between the
#   content and the first call, so what the model generates (up to and including <|im_end|>) is
#   byte-for-byte what this template renders when the turn is replayed in a later prompt;
# * tool-call arguments that are already a JSON string are emitted verbatim (re-encoding could
#   change them), dicts are encoded with tojson;
# * content may be None (assistant turns that only call tools) or, tolerantly, a list of OpenAI
#   content parts, whose text parts are concatenated;
# * the {% generation %} markers let `return_assistant_tokens_mask=True` find assistant tokens.
CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable -%}
        {%- for part in content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0].role in ['system', 'developer'] -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if first_is_system -%}
        {{- render_content(messages[0].content) + '\\n\\n' -}}
    {%- endif -%}
    {{- '# Tools\\n\\nYou can call the functions described inside <tools></tools>, one JSON object per line:\\n<tools>\\n' -}}
    {%- for tool in tools -%}
        {{- tool | tojson + '\\n' -}}
    {%- endfor -%}
    {{- '</tools>\\n\\nTo call a function, reply with its name and arguments as a JSON object inside '
        '<tool_call></tool_call>:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
        '<arguments-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if tools and loop.first and first_is_system -%}
        {#- Already rendered in the tools block above. -#}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- generation -%}
            {{- render_content(message.content) -}}
            {%- for call in message.tool_calls or [] -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '<tool_call>\\n{"name": ' + fn.name | tojson + ', "arguments": ' -}}
                {{- fn.arguments if fn.arguments is string else fn.arguments | tojson -}}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
            {{- '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\\n' -}}
    {%- else -%}
        {%- set role = 'system' if message.role == 'developer' else message.role -%}
        {{- '<|im_start|>' + role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

# Qwen2 shape scaled down: small enough to build and run in seconds on a CPU, real enough that
# attention, grouped-query KV heads, RoPE and tied embeddings all take the normal code paths.
# Heads of 32 dimensions, the smallest that vLLM's CPU attention takes, so both engines serve it.
MODEL_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 192,
}


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on ``corpus`` and wrap it for ``transformers``."""
    backend = Tokenizer(models.BPE())
    # The pipeline is Qwen2's, because transformers 5 ignores the pipeline saved in
    # tokenizer.json for qwen2 models: AutoTokenizer builds a Qwen2Tokenizer, which keeps only the
    # vocabulary and merges and rebuilds NFC + this split regex + byte-level. Training with the
    # same pipeline makes the saved tokenizer and the loaded one behave identically.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),  # ids 0, 1, 2
        # All 256 byte symbols, even those the corpus never uses, so any input can be encoded.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    # Added after training so they get fresh ids at the end instead of colliding with the
    # trainer's vocabulary.
    backend.add_tokens(list(TOOL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        model_max_length=CONTEXT_LENGTH,
        # transformers' clean-up rewrites " ." to "." etc., which would break round-trips.
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast, shape: dict[str, int] | None = None) -> Qwen2Config:
    """The model config, with token ids taken from ``tokenizer``; ``shape`` overrides ``MODEL_SHAPE``."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=CONTEXT_LENGTH,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        **(shape or MODEL_SHAPE),
    )


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a randomly initialised tiny chat model to ``out_dir`` and return ``out_dir``.

    The directory loads offline with ``AutoModelForCausalLM`` and ``AutoTokenizer``. The weights
    depend only on ``seed``; the same seed gives a byte-identical ``model.safetensors``.
    """
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(build_corpus(CORPUS_SEED))
    config = tiny_config(tokenizer)
    # Seed a private generator state, so building does not disturb the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    # Generation stops at <|im_end|> (end of turn) or <|endoftext|> (end of document).
    model.generation_config = GenerationConfig(eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tiny_model_path(cache_dir: Path, seed: int = 0) -> Path:
    """Return ``cache_dir / "tiny-v2-seed{seed}"``, building the model there first if missing
    (`build_once`: never seen half-written, one winner when processes build at once)."""
    return build_once(Path(cache_dir) / f"{TINY_VERSION}-seed{seed}", lambda staging: build_tiny_model(staging, seed))
