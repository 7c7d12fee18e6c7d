"""Our own multi-page forms: what each task asks, where it starts, and what it must submit.

The pages are static files under `forms/` (a shipping checkout of three pages, account settings
with a confirmation page, a library search that submits on Enter); each passes what has been
entered to the next page in its URL, and the last page publishes the submitted fields as
`window.clawrlResult` (forms.js). The lists the pages offer (countries, languages, books) are
written from this module into `forms/data.js`, so the pages and the instructions share them.

A task is a seeded draw (`form_task`): its instruction, its start page (with the account's
current settings in the query, for the settings form) and the fields the last page must hold.
The reward is 1 when every expected field was submitted with its value, else 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

COUNTRIES = ("Argentina", "Canada", "Chile", "Denmark", "Japan", "Kenya", "Norway", "Portugal")
LANGUAGES = ("English", "Deutsch", "Français", "Español", "Italiano", "Nederlands")
FIRST_NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Keiko", "Luis")
LAST_NAMES = ("Alvarez", "Berg", "Costa", "Dubois", "Eriksen", "Fischer", "Gallo", "Haddad", "Ito", "Jensen")
STREETS = ("Elm Street", "Harbour Road", "Mill Lane", "Oak Avenue", "Quay Street", "Station Road", "Tower Hill")
CITIES = ("Aldford", "Brackley", "Corbridge", "Dunmore", "Elsworth", "Fairlie", "Glenrock")
METHODS = ("standard", "express", "overnight")
# Titles share words, so that a search finds several and the right one must be picked
BOOKS = (
    ("The River Garden", "M. Okafor"), ("Winter on the River", "S. Lindqvist"), ("A River of Stone", "P. Haddad"),
    ("The Glass River", "A. Moreau"), ("Night Garden", "L. Tanaka"), ("The Garden Wall", "R. Byrne"),
    ("Gardens of Glass", "E. Novak"), ("Winter Night", "J. Castillo"), ("The Long Winter", "K. Adeyemi"),
    ("Stone and Winter", "H. Larsen"), ("The Stone Harbour", "C. Ferreira"), ("Harbour Lights", "D. Mbeki"),
    ("The Night Harbour", "T. Schulz"), ("Lights of the North", "I. Sato"), ("Northern Glass", "V. Petrov"),
    ("The Glass Night", "N. O'Brien"),
)  # fmt: skip
SEARCH_WORDS = ("river", "garden", "winter", "night", "stone", "harbour", "glass", "lights")


@dataclass(frozen=True)
class FormSpec:
    """One drawn form task."""

    instruction: str
    start: str  # the first page, relative to the forms' directory, with its query
    expected: dict[str, str]  # fields the last page must hold; "on"/"off" for checkboxes


def data_js() -> str:
    """forms/data.js: the lists the pages offer."""
    books = [{"id": number, "title": title, "author": author} for number, (title, author) in enumerate(BOOKS, 1)]
    data = {"countries": COUNTRIES, "languages": LANGUAGES, "books": books}
    return f"var CLAWRL_DATA = {json.dumps(data, ensure_ascii=False, indent=1)};\n"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _shipping(rng: random.Random) -> FormSpec:
    name, street = _person(rng), f"{rng.randint(2, 180)} {rng.choice(STREETS)}"
    city, country, method, gift = rng.choice(CITIES), rng.choice(COUNTRIES), rng.choice(METHODS), rng.random() < 0.5
    instruction = (
        f"Order a delivery to {name}, {street}, {city}, {country}, with {method} shipping"
        f"{', as a gift' if gift else ', not as a gift'}, and place the order."
    )
    expected = {"name": name, "street": street, "city": city, "country": country, "method": method,
                "gift": "on" if gift else "off"}  # fmt: skip
    return FormSpec(instruction, "shipping/address.html", expected)


_SWITCHES = {"notifications": "email notifications", "newsletter": "the weekly newsletter", "darkmode": "dark mode"}


def _settings(rng: random.Random) -> FormSpec:
    current = {"name": _person(rng), "language": rng.choice(LANGUAGES)}
    current["email"] = f"{current['name'].split()[0].lower()}@example.org"
    current |= {switch: rng.choice(("on", "off")) for switch in _SWITCHES}
    wanted, changes = dict(current), []
    if rng.random() < 0.7:
        wanted["name"] = _person(rng)
        changes.append(f'change the display name to "{wanted["name"]}"')
    wanted["language"] = rng.choice([language for language in LANGUAGES if language != current["language"]])
    changes.append(f"set the language to {wanted['language']}")
    switch = rng.choice(sorted(_SWITCHES))
    wanted[switch] = "off" if current[switch] == "on" else "on"
    changes.append(f"turn {wanted[switch]} {_SWITCHES[switch]}")
    instruction = f"In the account settings, {', '.join(changes[:-1])} and {changes[-1]}. Save and confirm the changes."
    query = urlencode({key: value for key, value in current.items() if value != "off"})  # a box is "on" or absent
    return FormSpec(instruction, f"settings/settings.html?{query}", wanted)


def _library(rng: random.Random) -> FormSpec:
    word = rng.choice(SEARCH_WORDS)
    number, (title, author) = rng.choice([(n, book) for n, book in enumerate(BOOKS, 1) if word in book[0].lower()])
    instruction = f'Search the library for "{word}" and borrow the book "{title}" by {author}.'
    return FormSpec(instruction, "library/search.html", {"id": str(number)})


FORMS: dict[str, Callable[[random.Random], FormSpec]] = {"shipping": _shipping, "settings": _settings, "library": _library}


def form_task(family: str, task_id: str) -> FormSpec:
    """The task `task_id` of form `family`, drawn from a generator seeded by the id."""
    return FORMS[family](random.Random(f"web:{task_id}"))


def form_reward(expected: dict[str, str], submitted: dict[str, str]) -> tuple[float, dict[str, list[str]]]:
    """1 when every expected field was submitted as expected (an unchecked box is not submitted:
    "off"), else 0; and the fields that were wrong, as [expected, submitted]."""
    wrong = {}
    for field, value in expected.items():
        got = submitted.get(field, "off" if value in ("on", "off") else "")
        if got.strip() != value:
            wrong[field] = [value, got]
    return (0.0 if wrong else 1.0), wrong
