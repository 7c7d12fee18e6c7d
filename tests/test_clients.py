"""docs/clients.md, run as written: the openai SDK script and the curl lines against a real server.

The snippets are read from the page itself, so the documentation cannot drift from what works.
Only the address changes: the page says `http://localhost:30000`, the test server runs on a free port.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from tests.helpers import start_server

CLIENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
DOCUMENTED_ADDRESS = "http://localhost:30000"


def snippet(section: str, language: str) -> str:
    """The first fenced `language` block under the `## section` heading of docs/clients.md."""
    page = CLIENTS_PAGE.read_text(encoding="utf-8")
    body = page.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", body, re.DOTALL)
    assert match, f"no {language} block under '## {section}'"
    return match.group(1)


@pytest.fixture
def server(tiny_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    """The server the page starts: `--served-model-name my-agent --api-key sk-local`."""
    with start_server(tiny_model_dir, run_dir, served_model_name="my-agent", api_key="sk-local") as running:
        yield running


def run_against(server: ServerThread, command: list[str], code: str) -> str:
    address = server.base_url.removesuffix("/v1")
    result = subprocess.run([*command, code.replace(DOCUMENTED_ADDRESS, address)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_openai_sdk_script_records_a_session_its_next_state_and_feedback(server: ServerThread, run_dir: Path) -> None:
    output = run_against(server, [sys.executable, "-c"], snippet("The openai Python SDK", "python"))
    store = Store.for_run_dir(run_dir)
    turns = store.turns.session_turns("tea-notes")
    assert [entry.turn.kind for entry in turns] == ["main", "main"]
    first = turns[0]
    assert f"turn {first.turn.id} served by policy version 0" in output
    assert first.next_messages == [{"role": "user", "content": "no, make it rhyme and keep it short"}]
    assert [(item.score, item.text) for item in store.judging.turn_context(first.turn.id).feedback] == [
        (-1, "Rhyme the last words of lines one and three.")
    ]
    assert turns[1].turn.response_token_ids  # the streamed answer is recorded with its token ids


def test_the_curl_lines_answer_take_feedback_and_refuse_an_unknown_model(server: ServerThread, run_dir: Path) -> None:
    output = run_against(server, ["bash", "-euo", "pipefail", "-c"], snippet("curl", "bash"))
    assert re.search(r"(?im)^x-clawrl-session: curl-demo\r?$", output)
    assert '"recorded":true' in output.replace(" ", "")
    assert '"code":"model_not_found"' in output.replace(" ", "") and output.rstrip().endswith("HTTP 404")
    store = Store.for_run_dir(run_dir)
    (only,) = store.turns.session_turns("curl-demo")
    assert [(item.score, item.text) for item in store.judging.turn_context(only.turn.id).feedback] == [
        (1, "Good list, keep answers this short.")
    ]
