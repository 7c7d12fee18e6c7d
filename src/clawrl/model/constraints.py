"""The response contract as a grammar: JSON outputs and forced tool calls, decoded under a mask.

A request may ask for more than text: `response_format` a JSON object or one that validates
against a schema, `tool_choice` a tool call (any, or a named one). A model asked politely complies
sometimes; decoding under a grammar complies always: before each token, every token that cannot
continue a valid answer gets probability 0, and the model's distribution is renormalised over the
rest. The grammar is a Lark grammar as llguidance reads it (a Rust library made for this, one small
wheel with no dependencies; JSON Schemas embedded with `%json`), built from the request here and
recorded with the turn as text: the hf engine compiles it itself, and vLLM (run with its guidance
backend) takes the same text, so both mask the same tokens.

Three parties use it, and must agree token for token:

* the engine, which samples from the masked distribution and records its log-probs (the
  distribution actually sampled from);
* the trainer, which scores the recorded response under the same masks (`allowed_bits` replays the
  grammar over the response's token ids), so the ratio π_θ/π_old and the KL compare distributions
  over the same support;
* the OPD teacher, which scores the response under the same masks for the same reason.

A tool call is written as the chat templates of Qwen-style models write one:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the markers as the tokenizer's own
tokens when it has them, then the end of the turn.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import llguidance
import llguidance.hf
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
# JSON is written in one style, the one `json.dumps` writes and Qwen-style models write their calls in:
# `{"a": 1, "b": [2, 3]}`, ", " between items and ": " after keys, no other whitespace. A free JSON
# grammar lets any run of whitespace through (a model fond of line breaks spent its budget on them);
# llguidance 1.9 bounds a whitespace pattern but 1.7 (vLLM's) repeats it, so a turn served by vLLM
# would have masks the trainer's replay does not reproduce; and no whitespace at all masks the
# space a trained model writes after every colon (a model fitted to calls with it then wrote ": "
# as its argument). Fixed separators are read alike by both versions.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Free text next to tool calls: any valid UTF-8 without the opening marker (`(?s:.*)` on both sides of
# the `&`: a bare `~` would take invalid byte runs too, as llguidance's syntax notes say)
FREE_TEXT = f"TEXT: /(?s:.*)/ & ~/(?s:.*){TOOL_CALL_OPEN}(?s:.*)/"


class GrammarError(ValueError):
    """The request's schema or tools do not make a grammar (the client's mistake: a 400)."""


def json_output_grammar(schema: dict[str, Any] | None) -> str:
    """Any JSON object (`schema` None: `response_format` `json_object`), or one valid under `schema`."""
    return _checked(f"start: {_json_answer(schema)}\n")


def _json_answer(schema: dict[str, Any] | None) -> str:
    """The Lark of `json_output_grammar`'s answer."""
    schema = {"type": "object"} if schema is None else schema
    if not isinstance(schema, dict):
        raise GrammarError("the JSON schema must be an object")
    guided = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **JSON_STYLE}}
    return f"%json {json.dumps(guided)}"


def tool_call_grammar(tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]], name: str | None = None) -> str:
    """Exactly one call of one of `tools` (OpenAI function tools), or of the one called `name`."""
    functions = [tool.get("function", tool) for tool in tools]
    if name is not None:
        functions = [function for function in functions if function.get("name") == name]
        if not functions:
            raise GrammarError(f"tool_choice names the function {name!r}, which is not among the tools")
    if not functions:
        raise GrammarError("a tool call is required, but the request has no tools")
    held = {function["name"] for function in functions}  # a forced call is held to its schema, strict or not
    opening, closing = _marker(tokenizer, TOOL_CALL_OPEN), _marker(tokenizer, TOOL_CALL_CLOSE)
    return _checked(f'start: {opening} "\\n" call "\\n" {closing}\ncall: %json {json.dumps(_call_schema(functions, held))}\n')


def text_or_calls_grammar(tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]], held: set[str]) -> str:
    """Free text, or free text and then one or more calls of `tools`, each written as `tool_call_grammar`
    writes one and the next after a line break, then the end of the turn: the answer to a request whose
    strict tools (those named in `held`) the model may call or not (`tool_choice` `auto`).

    The grammar is lazy: nothing is masked until the model writes the opening marker, and from there
    the call is held, its name to one of the tools, its arguments to the tool's schema when the tool
    is in `held` (any JSON object otherwise, as a call of a tool that is not strict may have). Free
    text cannot hold the opening marker, neither as the tokenizer's token nor spelled out in other
    tokens: the answer's calls are parsed from its text (`model.chat.parse_tool_calls`), and a call
    the grammar did not see would go out unchecked. It cannot hold the tokenizer's special tokens
    either (llguidance's text is text; a decoded answer skips them, so they could hide a spelled-out
    marker): the tokenizer's other added tokens (a thinking model's `<think>`) it can.
    """
    free_ids = _free_added_token_ids(tokenizer)
    rules = [FREE_TEXT, "text: TEXT (added TEXT)*", f"added: <[{_id_ranges(free_ids)}]>"] if free_ids else [FREE_TEXT, "text: TEXT"]
    opening = _marker(tokenizer, TOOL_CALL_OPEN)
    if opening.startswith("<["):  # the tokenizer's token: text (a run of bytes) ends where it comes
        return _calls_grammar(tokenizer, tools, held, "text", f"text {opening}", rules)
    # spelled out, the marker ends a lazy lexeme: free text stops at its first marker (a greedy one
    # would run on into the marker's first characters, and could then not end before it)
    rules.append(f"opening[lazy]: TEXT {opening}")
    return _calls_grammar(tokenizer, tools, held, "text", "(TEXT added)* opening" if free_ids else "opening", rules)


def json_or_calls_grammar(tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]], held: set[str],
                          schema: dict[str, Any] | None) -> str:  # fmt: skip
    """A JSON answer, as `json_output_grammar(schema)` holds one, or one or more calls of `tools` as
    `text_or_calls_grammar` writes them: the answer to a request for JSON whose tools the model may
    call first (`tool_choice` `auto`; an agent with a structured output and tools)."""
    rules = [f"answer: {_json_answer(schema)}"]
    return _calls_grammar(tokenizer, tools, held, "answer", _marker(tokenizer, TOOL_CALL_OPEN), rules)


def _calls_grammar(tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]], held: set[str], answer: str,
                   opened: str, rules: list[str]) -> str:  # fmt: skip
    """`answer`, or `opened` (what comes up to the first call's opening marker, that marker included)
    and then the calls of `tools` (`rules`: those `answer` and `opened` use)."""
    functions = [tool.get("function", tool) for tool in tools]
    if not functions:
        raise GrammarError("the request has no tools")
    opening, closing = _marker(tokenizer, TOOL_CALL_OPEN), _marker(tokenizer, TOOL_CALL_CLOSE)
    lines = [
        f'start: {answer} | {opened} "\\n" call_json "\\n" {closing} ("\\n" call)*',
        f'call: {opening} "\\n" call_json "\\n" {closing}',
        f"call_json: %json {json.dumps(_call_schema(functions, held))}",
        *rules,
    ]
    return _checked("\n".join(lines) + "\n")


def _free_added_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The added tokens free text may hold: not special (a decoded answer skips those, and the eos
    is one), not a marker, and no piece of the opening marker (next to free text it could complete it)."""
    special = set(tokenizer.all_special_ids)
    return sorted(token_id for token_id, token in tokenizer.added_tokens_decoder.items()
                  if not token.special and token_id not in special and token.content not in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
                  and not _may_complete(TOOL_CALL_OPEN, token.content))  # fmt: skip


def _may_complete(marker: str, piece: str) -> bool:
    """Whether `piece` between two runs of text (neither holding `marker`) could make `marker` appear:
    it holds the marker or lies inside it, begins with the marker's end or ends with its beginning."""
    if piece in marker or marker in piece:
        return True
    overlaps = range(1, min(len(marker), len(piece)) + 1)
    return any(piece.startswith(marker[-size:]) or piece.endswith(marker[:size]) for size in overlaps)


def _id_ranges(ids: list[int]) -> str:
    """Sorted token ids as llguidance's ranges: `3,7-9`."""
    ranges: list[list[int]] = []
    for token_id in ids:
        if ranges and token_id == ranges[-1][1] + 1:
            ranges[-1][1] = token_id
        else:
            ranges.append([token_id, token_id])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def _call_schema(functions: list[dict[str, Any]], held: set[str]) -> dict[str, Any]:
    """The JSON of one call of one of `functions`: its name, and its arguments, held to the function's
    (closed) parameters when it is in `held`, any JSON object otherwise."""
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": function["name"]},
                             "arguments": _closed(function.get("parameters")) if function["name"] in held else {"type": "object"}}}
             for function in functions]  # fmt: skip
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    return {**call, "x-guidance": JSON_STYLE}


def _closed(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A function's parameters as the call's arguments: the arguments it declares and no others, unless
    its schema says otherwise (JSON Schema allows any other property by default, and a model held only
    to that writes made-up ones; OpenAI's strict function calling closes them the same way)."""
    if not parameters:
        return {"type": "object"}
    if "properties" in parameters and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def _marker(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """`text` in the grammar: the tokenizer's own token for it (`<[id]>`) when it has one, else the text."""
    token_id = tokenizer.convert_tokens_to_ids(text)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and text in tokenizer.get_added_vocab():
        return f"<[{token_id}]>"
    return json.dumps(text)


def _checked(lark: str) -> str:
    """`lark` once llguidance has compiled it without error (the grammar text recorded with a turn)."""
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark))
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"the schema cannot be enforced: {error}")
    return lark


class GrammarVocabulary:
    """A tokenizer as llguidance sees it, for one model: its vocabulary size (the logits' width) and the
    token that ends an answer once the grammar is complete: the tokenizer's eos, as vLLM's guidance
    backend has it too (the engines stop on it; a turn's masks replay the same whoever served it).
    Built once per tokenizer and size."""

    _cache: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, dict[int, GrammarVocabulary]] = weakref.WeakKeyDictionary()

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.llg = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> GrammarVocabulary:
        built = cls._cache.setdefault(tokenizer, {})
        if vocab_size not in built:
            built[vocab_size] = cls(tokenizer, vocab_size)
        return built[vocab_size]


class Constraint:
    """One response's grammar while it is decoded: which tokens may come next, and the one that came."""

    def __init__(self, grammar: str, vocabulary: GrammarVocabulary) -> None:
        self.vocabulary = vocabulary
        self.matcher = llguidance.LLMatcher(vocabulary.llg, llguidance.LLMatcher.grammar_from_lark(grammar))
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())

    def allowed_words(self) -> Tensor:
        """[W] int32: bit t % 32 of word t // 32 is set when token t may come next."""
        return torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)[: self.vocabulary.words]

    def accept(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id) or self.matcher.is_error():
            raise GrammarError(f"token {token_id} does not continue the grammar: {self.matcher.get_error()}")


def allowed_bits(grammar: str, vocabulary: GrammarVocabulary, response_token_ids: list[int]) -> Tensor:
    """[R, W] int32: the masks the engine sampled `response_token_ids` under, replayed (the grammar is
    deterministic: the same tokens give the same masks)."""
    constraint = Constraint(grammar, vocabulary)
    rows = []
    for token_id in response_token_ids:
        rows.append(constraint.allowed_words())
        if constraint.matcher.is_stopped():
            break  # a token after the end (none should be): left unmasked below
        constraint.accept(token_id)
    masks = torch.full((len(response_token_ids), vocabulary.words), -1, dtype=torch.int32)
    if rows:
        masks[: len(rows)] = torch.stack(rows)
    return masks


def unpack_bits(words: Tensor, vocab_size: int) -> Tensor:
    """[..., W] int32 words → [..., vocab_size] bool: token t allowed when bit t % 32 of word t // 32 is set."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*words.shape[:-1], -1)[..., :vocab_size].bool()


def masked_logits(logits: Tensor, words: Tensor | None) -> Tensor:
    """`logits` [..., V] with the tokens that `words` ([..., W], None: no mask) disallow at -inf."""
    if words is None:
        return logits
    return logits.masked_fill(~unpack_bits(words, logits.shape[-1]), float("-inf"))
