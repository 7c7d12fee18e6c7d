"""Prompt memory: what the user said in past sessions, carried into the system prompt.

The learning benchmark's `memory` arm is a stand-in for memory systems such as Mem0: no weights
change; instead the hints the judge drew from earlier sessions (and any explicit feedback text)
are kept and listed in the system prompt of every later request. It shows what training adds
over simply remembering. The tiny model is pre-trained on system prompts in this format, as a
real instruction-tuned model would follow such notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
NOTES_HEADING = "Notes from earlier conversations with this user:"


def system_prompt_with_notes(notes: list[str], base: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """`base`, then the notes as a list under a heading; just `base` when there are none."""
    if not notes:
        return base
    return "\n".join([base, "", NOTES_HEADING, *(f"- {note}" for note in notes)])


@dataclass
class PromptMemory:
    """The most recent distinct notes, oldest first; a repeated note moves to the end."""

    capacity: int = 5
    notes: list[str] = field(default_factory=list)

    def remember(self, note: str) -> None:
        note = note.strip()
        if not note:
            return
        if note in self.notes:
            self.notes.remove(note)
        self.notes.append(note)
        del self.notes[: -self.capacity]

    def system_prompt(self, base: str = DEFAULT_SYSTEM_PROMPT) -> str:
        return system_prompt_with_notes(self.notes, base)
