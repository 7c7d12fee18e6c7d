"""The rule judge as it was before issue 27 (commit 10fee54) on a part of today's labelled corpus.

That commit has no corpus module and another judge API, so this script reads the JSONL itself and
calls the old `judge_by_rules` directly: agreement, hint recall (the longest candidate, as the
worker chose without a scoring engine) and false hints, overall. Run it with the old code first on
the path:

    git worktree add /tmp/before 10fee54
    PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/judge_replies_before.py src/clawrl/judge/data/held_out.jsonl
"""

from __future__ import annotations

import json
import sys

from clawrl.judge.rule import judge_by_rules


def main(path: str) -> dict[str, object]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    agree = hinted = recalled = unhinted = false_hints = 0
    for row in rows:
        request = [{"role": "user", "content": row["request"]}]
        reply = ([{"role": "tool", "tool_call_id": "call_1", "content": row["reply"]}] if row["role"] == "tool"
                 else [{"role": "user", "content": row["reply"]}])
        score, candidates = judge_by_rules(request, reply)
        hint = max(candidates, key=len) if candidates else None
        agree += score == row["score"]
        if row["hint_keywords"]:
            hinted += 1
            recalled += bool(hint) and all(any(a.lower() in hint.lower() for a in group) for group in row["hint_keywords"])
        else:
            unhinted += 1
            false_hints += hint is not None
    return {"judge": "rule", "commit": "10fee54", "items": len(rows), "agreement": round(agree / len(rows), 4),
            "hinted_items": hinted, "hint_recall": round(recalled / hinted, 4),
            "false_hints": round(false_hints / unhinted, 4)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
