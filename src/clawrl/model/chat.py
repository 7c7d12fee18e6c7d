"""Between OpenAI chat messages and token ids: rendering prompts, decoding answers, tool calls.

Shared by every engine that runs the chat template locally. The prompt is rendered once, here,
and the resulting ids are the ones the engine is fed and the store records.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from transformers import PreTrainedTokenizerBase

from clawrl.messages import canonical_arguments, content_text, teacher_messages
from clawrl.types import Message, ToolSpec, Turn

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_PATTERN = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
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
                        "arguments": canonical_arguments(call["function"].get("arguments", "{}")),
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
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[ToolSpec] | None
) -> list[int]:
    """The exact token ids the engine will be fed for this conversation."""
    text = tokenizer.apply_chat_template(
        template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def teacher_prompt_ids(tokenizer: PreTrainedTokenizerBase, turn: Turn, hint: str) -> list[int]:
    """The OPD teacher's prompt ids: the turn's request with the hint attached, rendered with its tools.

    One function for the hint judge (which scores candidate hints under this prompt) and the
    trainer (whose teacher log-probs are taken under it): the two must score the same prompt. Only
    the prompt is new text; the response stays the turn's recorded ids.
    """
    return render_prompt(tokenizer, teacher_messages(turn.messages, hint), turn.tools)


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

    def extend(self, token_ids: list[int]) -> str:
        """Feed the next tokens (one as it streams, or a whole answer taken at once: one decode
        instead of one per token); return the new text that may be shown now."""
        if self.stopped or not token_ids:
            return ""
        self.token_ids.extend(token_ids)
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
