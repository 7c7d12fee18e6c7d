"""The web oracle: a scripted solver per task family that reads the observation as the model does.

It sees only the conversation: the instruction (the user message before the page's listing) and
the latest listing (page.py), and answers with the calls that finish the current page, in one
assistant message (the click that leaves a page last). That it scores 1 on every task shows
that the text observation holds what a task needs and that the tools can do it. A page it cannot
read (an element it looks for is missing) makes it answer without a tool call, which ends the
episode unsolved instead of crashing the rollout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from clawrl.envs.web.page import Listing, PageElement, parse_listing
from clawrl.types import Message

Call = tuple[str, dict[str, Any]]  # a tool and its arguments
_QUOTED = re.compile(r'"([^"]*)"')


class _Stuck(Exception):
    """The page lacks what the solver looks for."""


def oracle_reply(family: str, messages: list[Message]) -> Message:
    """The oracle's next assistant message for a web task of `family`."""
    instruction = str(messages[1]["content"]).split('\n\nPage "')[0]
    page = parse_listing(str(messages[-1]["content"]))
    try:
        calls = SOLVERS[family](instruction, page)
    except _Stuck as stuck:
        return {"role": "assistant", "content": f"I cannot find {stuck} on the page."}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_oracle_{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for index, (name, arguments) in enumerate(calls)
    ]}  # fmt: skip


def _find(page: Listing, label: str, *roles: str) -> PageElement:
    """The first element with this label (and one of `roles`, when given)."""
    for element in page.elements:
        if element.label == label and (not roles or element.role in roles):
            return element
    raise _Stuck(f"{'/'.join(roles) or 'an element'} {label!r}")


def _first(page: Listing, role: str) -> PageElement:
    for element in page.elements:
        if element.role == role:
            return element
    raise _Stuck(f"a {role}")


def _click(element: PageElement) -> Call:
    return "click", {"element": element.id}


def _type(element: PageElement, text: str) -> Call:
    return "type", {"element": element.id, "text": text}


def _select(element: PageElement, option: str) -> Call:
    return "select", {"element": element.id, "option": option}


def _set_box(element: PageElement, checked: bool) -> list[Call]:
    return [_click(element)] if element.checked != checked else []


def _match(pattern: str, instruction: str) -> re.Match[str]:
    match = re.search(pattern, instruction)
    if match is None:
        raise _Stuck(f"the instruction's {pattern!r}")
    return match


def _part(pattern: str, instruction: str) -> str:
    return _match(pattern, instruction)[1]


# --- MiniWoB++ ------------------------------------------------------------------------------------


def _choose_checkboxes(instruction: str, page: Listing) -> list[Call]:
    wanted = _part(r"^Select (.*) and click Submit\.$", instruction)
    names = set() if wanted == "nothing" else set(wanted.split(", "))
    boxes = [element for element in page.elements if element.role == "checkbox"]
    return [call for box in boxes for call in _set_box(box, box.label in names)] + [_click(_find(page, "Submit", "button"))]


def _login(instruction: str, page: Listing) -> list[Call]:
    user, password = _QUOTED.findall(instruction)[:2]
    return [_type(_find(page, "Username", "textbox"), user), _type(_find(page, "Password", "password"), password),
            _click(_find(page, "Login", "button"))]  # fmt: skip


def _passwords(instruction: str, page: Listing) -> list[Call]:
    password = _QUOTED.findall(instruction)[0]
    fields = [element for element in page.elements if element.role == "password"]
    return [_type(field, password) for field in fields] + [_click(_find(page, "Submit", "button"))]


_MINIWOB: dict[str, Callable[[str, Listing], list[Call]]] = {
    "click-test-2": lambda instruction, page: [_click(_find(page, "ONE", "button"))],
    "click-button": lambda instruction, page: [_click(_find(page, _QUOTED.findall(instruction)[0], "button"))],
    "click-link": lambda instruction, page: [_click(_find(page, _QUOTED.findall(instruction)[0], "clickable", "link"))],
    "click-dialog": lambda instruction, page: [_click(_find(page, "Close", "button"))],
    "click-tab": lambda instruction, page: [_click(_find(page, _part(r"(Tab #\d)", instruction), "tab"))],
    "click-option": lambda instruction, page: [
        _click(_find(page, _part(r"^Select (.*) and click Submit\.$", instruction), "radio")),
        _click(_find(page, "Submit", "button")),
    ],
    "click-checkboxes": _choose_checkboxes,
    "focus-text": lambda instruction, page: [_click(_first(page, "textbox"))],
    "enter-text": lambda instruction, page: [
        _type(_first(page, "textbox"), _QUOTED.findall(instruction)[0]), _click(_find(page, "Submit", "button"))
    ],
    "enter-password": _passwords,
    "login-user": _login,
    "choose-list": lambda instruction, page: [
        _select(_first(page, "combobox"), _part(r"^Select (.*) from the list", instruction)),
        _click(_find(page, "Submit", "button")),
    ],
}  # fmt: skip


# --- our forms -------------------------------------------------------------------------------------

_ORDER = re.compile(
    r"^Order a delivery to (?P<name>[^,]+), (?P<street>[^,]+), (?P<city>[^,]+), (?P<country>[^,]+), "
    r"with (?P<method>\w+) shipping, (?P<gift>as a gift|not as a gift), and place the order\.$"
)
_SWITCH_LABELS = {"email notifications": "Email notifications", "the weekly newsletter": "Weekly newsletter",
                  "dark mode": "Dark mode"}  # fmt: skip


def _shipping(instruction: str, page: Listing) -> list[Call]:
    order = _ORDER.match(instruction)
    if order is None:
        raise _Stuck("the order in the instruction")
    if page.title == "Shipping address":
        fields = [_type(_find(page, label, "textbox"), order[key]) for label, key in
                  (("Full name", "name"), ("Street", "street"), ("City", "city"))]  # fmt: skip
        return [*fields, _select(_find(page, "Country", "combobox"), order["country"]), _click(_find(page, "Continue", "button"))]
    if page.title == "Delivery":
        method = next((e for e in page.elements if e.role == "radio" and e.label.lower().startswith(order["method"])), None)
        if method is None:
            raise _Stuck(f"the {order['method']} option")
        gift = _set_box(_find(page, "This is a gift", "checkbox"), order["gift"] == "as a gift")
        return [_click(method), *gift, _click(_find(page, "Continue", "button"))]
    return [_click(_find(page, "Place order", "button"))]


def _settings(instruction: str, page: Listing) -> list[Call]:
    if page.title != "Account settings":
        return [_click(_find(page, "Confirm", "button"))]
    calls = []
    if "display name" in instruction:
        calls.append(_type(_find(page, "Display name", "textbox"), _part(r'display name to "([^"]+)"', instruction)))
    calls.append(_select(_find(page, "Language", "combobox"), _part(r"set the language to (\S+?)(?: and|,)", instruction)))
    state, switch = _match(r"turn (on|off) (email notifications|the weekly newsletter|dark mode)", instruction).groups()
    calls += _set_box(_find(page, _SWITCH_LABELS[switch], "checkbox"), state == "on")
    return [*calls, _click(_find(page, "Save", "button"))]


def _library(instruction: str, page: Listing) -> list[Call]:
    word, title = _QUOTED.findall(instruction)[:2]
    if page.title == "Library search":
        return [_type(_find(page, "Search titles", "textbox"), word), ("key", {"name": "Enter"})]
    if page.title == "Search results":
        link = next((e for e in page.elements if e.role == "link" and e.label.startswith(f"{title} by ")), None)
        if link is None:
            raise _Stuck(f"a link to {title!r}")
        return [_click(link)]
    return [_click(_find(page, "Borrow", "button"))]


SOLVERS: dict[str, Callable[[str, Listing], list[Call]]] = {
    **_MINIWOB, "shipping": _shipping, "settings": _settings, "library": _library,
}  # fmt: skip
