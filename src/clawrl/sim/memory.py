"""The simulated conversations' system prompts, with or without memory notes.

Pre-training (`sim/chats.py`, `sim/pretrain.py`) shows the tiny model notes in the block that
`clawrl serve --memory on` appends to a system prompt (`model/notes.py`), so that it follows them as
a real instruction-tuned model would. The learning benchmark's memory arms no longer write notes
into their requests: the server keeps and injects them.
"""

from __future__ import annotations

from clawrl.model.notes import notes_text

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def system_prompt_with_notes(notes: list[str], base: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """`base`, then the notes' block as the server appends it; just `base` when there are none."""
    if not notes:
        return base
    return f"{base}\n\n{notes_text(notes)}"
