"""Memory notes in a prompt (`--memory on`, DESIGN §13): where they go and how they read (serving renders them, the trainer trains them in).

The notes are appended to the end of the first system (or developer) message, or make a system
message of their own at the front when the client sent none. Why there: an agent resends the whole
conversation every turn, so what a prefix cache (the engine's, and the trainer's shared-prefix
batches) keeps is what stays put at the front. While a user's notes are unchanged, a block at the
end of the system prompt is part of that fixed front, and every turn reuses all of it; only a
change of the notes (rare: a correction) recomputes the prompt once. A block just before the last
user message would move every turn and cost its tokens and the last exchange's on each one
(`benchmarks/memory_notes.py` measures both).

Only the rendering sees the notes: the turn's `messages` stay what the client sent, because the
next request's echo of them is how its session is found, and the teacher's prompt
(`model.chat.teacher_prompt_ids`) is rendered from those messages and the hint, never with notes.
"""

from __future__ import annotations

from typing import Any

from clawrl.types import MemoryNote, Message

# The tiny pre-trained model learnt to follow notes under this heading at the end of a system prompt
# (`sim/chats.py`), as instruction-tuned models follow such a block
NOTES_HEADING = "Notes from earlier conversations with this user:"
_SYSTEM_ROLES = ("system", "developer")


def notes_block(notes: list[MemoryNote]) -> str:
    """The text the notes add: a heading and one line per note, oldest first."""
    return notes_text([note.text for note in notes])


def notes_text(texts: list[str]) -> str:
    """The heading and one line per text: the block, from the notes' texts alone."""
    return "\n".join([NOTES_HEADING, *(f"- {text}" for text in texts)])


def with_notes(messages: list[Message], notes: list[MemoryNote]) -> list[Message]:
    """`messages` as they are rendered with `notes`: a copy; the list given is left as it is."""
    if not notes:
        return messages
    block = notes_block(notes)
    for position, message in enumerate(messages):
        if message["role"] in _SYSTEM_ROLES:
            return [*messages[:position], {**message, "content": _appended(message.get("content"), block)},
                    *messages[position + 1 :]]  # fmt: skip
    return [{"role": "system", "content": block}, *messages]


def _appended(content: Any, block: str) -> Any:
    """A message's content (text, or content parts) with the block after it."""
    if isinstance(content, list):
        return [*content, {"type": "text", "text": "\n\n" + block}]
    return f"{content}\n\n{block}" if content else block
