"""The learning benchmark's committed summary: one persona's merged report, with other personas' beside it.

`clawrl bench merge` writes one persona's report (`results.json`). The summary in
`docs/results/learn.json` is the main persona's (the student's) with each other persona's report
under its name, so that one file answers "what did each arm reach with this user":

    .venv/bin/python benchmarks/learn_summary.py runs/learn/merged-student/results.json \
        --section runs/learn/merged-student-strict/results.json --out docs/results/learn.json

A section keeps its own arms, paired differences, judge agreement and settings; the top level
stays exactly the main report, so every reader of the old layout still finds its fields.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary(main: dict, sections: list[dict]) -> dict:
    """`main` with each section under its persona's name; refuses a section of the main persona or a repeat."""
    combined = dict(main)
    for section in sections:
        name = section["persona"]
        if name == main["persona"] or name in combined:
            raise ValueError(f"a section for {name!r} cannot go beside the {main['persona']!r} report")
        combined[name] = section
    return combined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("main", type=Path, help="the main persona's merged results.json")
    parser.add_argument("--section", type=Path, action="append", default=[], help="another persona's results.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sections = [json.loads(path.read_text()) for path in args.section]
    combined = summary(json.loads(args.main.read_text()), sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(combined, indent=1) + "\n")
    beside = ", ".join(section["persona"] for section in sections) or "nothing"
    print(f"wrote {args.out}: the {combined['persona']} report, with {beside} beside it")


if __name__ == "__main__":
    main()
