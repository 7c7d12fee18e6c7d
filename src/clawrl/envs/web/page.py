"""What the model reads of a page: its interactive elements as a compact, accessibility-like list.

`snapshot.js` runs in the page and returns the elements (and headings) in document order, each
with an id that stays with its element while the page lives, a role, a label and its state;
`render` writes them one a line, as the observation shows them:

    Page "Shipping address":
    [1] heading "Shipping address"
    [2] textbox "Full name" value=""
    [3] combobox "Country" value="Chile" options=["Chile", "Norway"]
    [4] checkbox "This is a gift" unchecked
    [5] button "Continue"

Labels, values and options are JSON strings (quotes inside are escaped), so the listing reads
back unambiguously (`parse_listing`: the oracle reads the pages so).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

SNAPSHOT_JS = (Path(__file__).with_name("snapshot.js")).read_text()
_TITLE = re.compile(r'^Page (?P<title>"(?:[^"\\]|\\.)*"):$')
_LINE = re.compile(r'^\[(?P<id>\d+)\] (?P<role>\S+) (?P<label>"(?:[^"\\]|\\.)*")(?P<rest>.*)$')
_VALUE = re.compile(r' value=(?P<value>"(?:[^"\\]|\\.)*")')
_OPTIONS = re.compile(r" options=(?P<options>\[.*\])$")


class PageElement(BaseModel):
    """One element as snapshot.js describes it."""

    id: int = Field(description="The element's id on this page (`click(element=id)`).")
    role: str = Field(description="link, button, textbox, password, checkbox, radio, combobox, heading, clickable, ...")
    label: str = Field(description="What a user reads as its name.")
    value: str | None = Field(None, description="The text of a text field, the chosen option of a list.")
    checked: bool | None = Field(None, description="Whether a checkbox or radio button is checked.")
    options: list[str] | None = Field(None, description="The options of a list.")
    focused: bool = Field(False, description="Whether it has the keyboard focus.")
    disabled: bool = Field(False, description="Whether it is disabled.")


class PageSnapshot(BaseModel):
    """The page's elements, and the id the next new element will get."""

    title: str
    next_id: int = Field(alias="nextId")
    elements: list[PageElement]


def render(snapshot: PageSnapshot) -> str:
    """The listing the model reads."""
    lines = [f"Page {json.dumps(snapshot.title, ensure_ascii=False)}:"]
    lines += [_element_line(element) for element in snapshot.elements]
    if not snapshot.elements:
        lines.append("(no interactive elements)")
    return "\n".join(lines)


def _element_line(element: PageElement) -> str:
    line = f"[{element.id}] {element.role} {json.dumps(element.label, ensure_ascii=False)}"
    if element.value is not None:
        line += f" value={json.dumps(element.value, ensure_ascii=False)}"
    if element.checked is not None:
        line += " checked" if element.checked else " unchecked"
    line += " focused" * element.focused + " disabled" * element.disabled
    if element.options is not None:
        line += f" options={json.dumps(element.options, ensure_ascii=False)}"
    return line


@dataclass(frozen=True)
class Listing:
    """A listing read back: the page's title and its elements."""

    title: str
    elements: list[PageElement]


def parse_listing(text: str) -> Listing:
    """The last listing in `text` (an observation), read back from `render`'s lines."""
    lines = text[text.rfind('\nPage "') + 1 :].splitlines()  # from the start when it is the only listing
    heading = _TITLE.match(lines[0]) if lines else None
    title = json.loads(heading["title"]) if heading else ""
    elements = []
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        rest = match["rest"]
        value, options = _VALUE.search(rest), _OPTIONS.search(rest)
        flags = _OPTIONS.sub("", _VALUE.sub("", rest)).split()
        elements.append(PageElement(
            id=int(match["id"]), role=match["role"], label=json.loads(match["label"]),
            value=json.loads(value["value"]) if value else None,
            checked=True if "checked" in flags else False if "unchecked" in flags else None,
            options=json.loads(options["options"]) if options else None,
            focused="focused" in flags, disabled="disabled" in flags,
        ))  # fmt: skip
    return Listing(title, elements)
