"""Between OpenAI chat messages and token ids: rendering prompts, decoding answers, tool calls.

Shared by every engine that runs the chat template locally. The prompt is rendered once, here,
and the resulting ids are the ones the engine is fed and the store records.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_PATTERN = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def content_text(content: str | Sequence[Any] | None) -> str:
    """A message's content as one string: text parts joined by newlines, other parts dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [part.get("text", "") if isinstance(part, dict) else getattr(part, "text", "") for part in content]
    return "\n".join(part for part in parts if part)


def _canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value: clients re-serialise the string we sent them."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: string content, tool-call arguments as objects."""
    rendered = []
    for message in messages:
        item: dict[str, Any] = {"role": message["role"], "content": content_text(message.get("content"))}
        if message.get("tool_calls"):
            item["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _canonical_arguments(call["function"].get("arguments", "{}")),
                    },
                }
                for call in message["tool_calls"]
            ]
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None:
                item[key] = message[key]
        rendered.append(item)
    return rendered


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The exact token ids the engine will be fed for this conversation."""
    text = tokenizer.apply_chat_template(
        template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a generated answer into its text and OpenAI `tool_calls`.

    The model writes calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. If any
    block is not valid JSON with a name, the whole answer stays text: a half-parsed call would be
    worse than none.
    """
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for block in TOOL_CALL_PATTERN.findall(text[start:]):
        try:
            payload = json.loads(block)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return text, []
        arguments = payload.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if not calls:
        return text, []
    return text[:start], calls


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _calls_key(tool_calls: list[dict[str, Any]] | None) -> list[list[Any]]:
    return [
        [call["function"]["name"], _canonical_arguments(call["function"].get("arguments", "{}"))]
        for call in tool_calls or []
    ]


def answer_fingerprint(content: str, tool_calls: list[dict[str, Any]] | None) -> str | None:
    """Identity of an answer as a client echoes it back: stripped text plus tool calls (ids ignored)."""
    if not content.strip() and not tool_calls:
        return None
    return _digest({"content": content.strip(), "tool_calls": _calls_key(tool_calls)})


def message_hash(message: dict[str, Any]) -> str:
    """Identity of one message, tolerant of the re-serialisation clients do."""
    return _digest(
        {
            "role": message["role"],
            "content": content_text(message.get("content")).strip(),
            "tool_calls": _calls_key(message.get("tool_calls")),
            "tool_call_id": message.get("tool_call_id"),
        }
    )[:16]


class ResponseDecoder:
    """Turns generated token ids into text deltas that are safe to stream.

    Detokenization is incremental: each step decodes only a short window of recent tokens and
    keeps what that window adds beyond the previous one, so a long answer costs O(n), and a
    multi-byte character split across tokens is only released once complete. Text that might
    still become a stop string or the start of a tool call is held back, so a client never sees
    half a stop string or raw `<tool_call>` markup.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str], parse_tools: bool) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.parse_tools = parse_tools
        self.token_ids: list[int] = []
        self.text = ""  # everything decoded so far, cut at the first stop string
        self.emitted = 0  # how much of `text` has been released
        self.stopped = False  # a stop string was found; the caller should end generation
        self._prefix_offset = 0  # window start: decoding from here gives stable leading text
        self._read_offset = 0  # tokens before this are already part of `text`

    def add(self, token_id: int) -> str:
        """Feed one token; return the new text that may be shown now."""
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        decode = self.tokenizer.decode
        known = decode(self.token_ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        window = decode(self.token_ids[self._prefix_offset :], skip_special_tokens=True)
        if len(window) <= len(known) or window.endswith("\ufffd"):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence
        searched_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += window[len(known) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        for stop in self.stop:
            found = self.text.find(stop, searched_from)
            if found >= 0:
                self.text, self.stopped = self.text[:found], True
        return self._release()

    def _release(self) -> str:
        safe_end = len(self.text)
        if self.parse_tools and (start := self.text.find(TOOL_CALL_OPEN)) >= 0:
            safe_end = start
        elif not self.stopped:
            safe_end -= self._pending_prefix_length()
        delta = self.text[self.emitted : max(safe_end, self.emitted)]
        self.emitted = max(safe_end, self.emitted)
        return delta

    def _pending_prefix_length(self) -> int:
        """Length of the longest text suffix that could still grow into a stop string or tool call."""
        markers = self.stop + ([TOOL_CALL_OPEN] if self.parse_tools else [])
        longest = 0
        for marker in markers:
            for size in range(min(len(marker) - 1, len(self.text)), longest, -1):
                if self.text.endswith(marker[:size]):
                    longest = size
                    break
        return longest
