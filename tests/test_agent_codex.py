"""The real Codex CLI against a real server, over the Responses API.

`make test` installs Codex's native binary (`@openai/codex`, pinned) into a cache outside the
repository (scripts/install-codex.sh). Each test starts the server on a free port with the
offline judge, writes the `config.toml` of docs/clients.md (this server's URL and model filled
in) into a `CODEX_HOME` of its own, and holds a conversation the way a user does from a shell:
`codex exec "<request>"`, then `codex exec resume --last "<reply>"` for each later message.

What Codex 0.171 sends (docs/clients.md has the whole list): every request is streamed, carries
`store: false`, Codex's prompt as two developer messages, a user message of context blocks (the
workspace's AGENTS.md and an `<environment_context>` block), then what the user typed, alone, as a
user message; about 11,800 prompt tokens with the tiny model's tokenizer. Codex keeps its own
history and sends all of it each time, echoing every answer: sessions are inferred from the echoes.

The tiny model answers gibberish, which is fine: Codex shows it and ends its turn. It often writes
until the server's token limit (512: Codex sends no `max_output_tokens`), and Codex takes a
response that stopped there (`incomplete`) as a failed turn: it prints "Incomplete response
returned, reason: max_output_tokens" and exits 1, but keeps the partial answer in its history and
the next `resume` goes on from it. The tests accept exactly that failure, and check it against the
recorded turn's finish reason.

Codex sends `store: false` on every request (hard-coded for every provider but Azure); the
documented config sends `X-Clawrl-Record: true` through the provider's `http_headers`, and
`/v1/responses` records a `store: false` request that carries it (`NotRecorded` if not).

When the sandbox, the directory or the date changes between two turns, Codex sends a new
`<environment_context>` user message before the user's reply; `messages.user_typed` removes that
block and Codex's `# AGENTS.md instructions` block, so the judge reads only the reply
(`WrapperReadAsTyped` if not: before that, Codex's XML became a hint candidate, and sometimes the hint).

Where the registry could not be reached the install script records why and the tests skip
saying so; under CI (`CLAWRL_REQUIRE_CODEX=1`, set by .ci/run) they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clawrl.config import JudgeConfig
from clawrl.messages import content_text, user_typed
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.types import TurnContext
from tests.helpers import start_server, wait_for_judgment

MODEL = "clawrl-tiny"
API_KEY = "sk-codex"
LINES = ["Write a two-line poem about tea.", "no, make it rhyme and keep it short", "thanks, that's perfect"]
HINT = "Make it rhyme and keep it short."  # the rule judge's hint from the correction's directive
CLIENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
DOCUMENTED_URL, DOCUMENTED_MODEL = "http://127.0.0.1:30000/v1", "Qwen/Qwen3-4B-Instruct-2507"
# Nothing but the provider is contacted: no update check (GitHub), no analytics, no plugin or app
# catalogue (chatgpt.com, GitHub). Codex works without them; they only cost time without a network.
OFFLINE = ["-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false",
           "--disable", "plugins", "--disable", "apps", "--disable", "remote_plugin"]  # fmt: skip


class NotRecorded(AssertionError):
    """Codex's requests were answered but none was recorded (its `store: false`)."""


class WrapperReadAsTyped(AssertionError):
    """The judge read Codex's context blocks as what the user typed."""


STORE_FALSE = "Codex sends store: false on every request; the documented X-Clawrl-Record: true header should have it recorded"


# --------------------------------------------------------------------------- the installed agent


def codex_dir() -> Path:
    """Where scripts/install-codex.sh installs (the same rule as the script)."""
    if os.environ.get("CLAWRL_CODEX_DIR"):
        return Path(os.environ["CLAWRL_CODEX_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "clawrl" / "codex"


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    """The `codex` binary; skips only where npm could not be reached (fails under CI)."""
    root = codex_dir()
    if (root / "bin" / "codex").exists():
        return root / "bin" / "codex"
    unavailable = root / "unavailable"
    if not unavailable.exists():
        pytest.fail(f"Codex is not installed in {root}: run scripts/install-codex.sh (`make test` does)")
    reason = f"Codex is not installed: {unavailable.read_text().strip()} (scripts/install-codex.sh)"
    if os.environ.get("CLAWRL_REQUIRE_CODEX") == "1":
        pytest.fail(reason + "; CLAWRL_REQUIRE_CODEX=1 says it must run here")
    pytest.skip(reason)


@pytest.fixture
def server(tiny_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), served_model_name=MODEL,
                      api_key=API_KEY) as running:  # fmt: skip
        yield running


def documented_config(base_url: str) -> str:
    """The config.toml of docs/clients.md, for this server: its URL and the tiny model."""
    page = CLIENTS_PAGE.read_text()
    config = page.split("\n## Codex CLI\n", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    for documented, ours in [(DOCUMENTED_URL, base_url), (DOCUMENTED_MODEL, MODEL)]:
        assert documented in config, f"docs/clients.md's Codex config no longer has {documented!r}"
        config = config.replace(documented, ours)
    return config


# How `codex exec` reports a response that stopped at the token limit (and then exits 1)
INCOMPLETE = "Incomplete response returned, reason: max_output_tokens"


@dataclass
class Reply:
    """What `codex exec --json` reported for one user message."""

    thread_id: str
    text: str  # the agent's message, as Codex showed it
    complete: bool  # False: the answer stopped at the token limit, and Codex failed the turn (INCOMPLETE)
    input_tokens: int | None  # the thread's prompt tokens so far, as Codex reports them for a completed turn


class Codex:
    """The CLI with its own CODEX_HOME and HOME under `root`, never the user's, working in `root/work`
    (where `agents_md`, when given, is the workspace's AGENTS.md)."""

    def __init__(self, binary: Path, root: Path, base_url: str, agents_md: str | None = None) -> None:
        self.binary, self.workdir = binary, root / "work"
        home = root / "home"
        codex_home = home / ".codex"
        for directory in (self.workdir, codex_home):
            directory.mkdir(parents=True)
        (codex_home / "config.toml").write_text(documented_config(base_url))
        if agents_md is not None:
            (self.workdir / "AGENTS.md").write_text(agents_md)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("CODEX_", "OPENAI_"))}
        env.update(HOME=str(home), CODEX_HOME=str(codex_home), CLAWRL_API_KEY=API_KEY, NO_PROXY="127.0.0.1,localhost", NO_COLOR="1")
        self.env = env

    def say(self, text: str, resume: bool = False, sandbox: str = "read-only") -> Reply:
        """One user message: a new conversation, or (`resume`) the next message of the latest one."""
        command = [str(self.binary), "exec", "--json", "--skip-git-repo-check", "--sandbox", sandbox, *OFFLINE]
        command += ["resume", "--last", text] if resume else [text]
        # stdin closed: `codex exec` would otherwise wait to read more of the prompt from it
        result = subprocess.run(command, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        failures = [event["error"]["message"] for event in events if event["type"] == "turn.failed"]
        # exit 1 is accepted for one reason only: the answer stopped at the token limit
        output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert (result.returncode, failures) in ((0, []), (1, [INCOMPLETE])), f"codex exec failed ({result.returncode}):\n{output}"
        messages = [event["item"]["text"] for event in events
                    if event["type"] == "item.completed" and event["item"]["type"] == "agent_message"]  # fmt: skip
        (thread,) = [event["thread_id"] for event in events if event["type"] == "thread.started"]
        usage = [event["usage"]["input_tokens"] for event in events if event["type"] == "turn.completed"]
        assert len(messages) == 1, events
        return Reply(thread, messages[0], complete=not failures, input_tokens=usage[0] if usage else None)

    def converse(self, lines: list[str], later_sandbox: str = "read-only") -> list[Reply]:
        """`lines` as one conversation, the first message read-only, the later ones in `later_sandbox`."""
        replies = [self.say(lines[0])]
        replies += [self.say(line, resume=True, sandbox=later_sandbox) for line in lines[1:]]
        assert len({reply.thread_id for reply in replies}) == 1, "codex exec resume --last started a new thread"
        return replies


# --------------------------------------------------------------------------- what the store shows


def recorded_conversation(store: Store, replies: list[Reply]) -> list[TurnContext]:
    """The one session the conversation was recorded as; `NotRecorded` when nothing was."""
    counts = store.turns.counts()
    if counts["main_turns"] + counts["side_turns"] == 0:
        raise NotRecorded(f"Codex's {len(replies)} requests were answered and none was recorded: {STORE_FALSE}")
    sessions = store.turns.list_sessions()
    assert len(sessions) == 1, f"{len(sessions)} sessions for one conversation"
    return store.turns.session_turns(sessions[0].id)


def text_message(role: str, text: str) -> dict[str, Any]:
    """A message as the server records a Responses message item with one text part."""
    return {"role": role, "content": [{"type": "text", "text": text}]}


def test_a_codex_conversation_is_one_session_judged_from_the_users_replies(codex_bin: Path, server: ServerThread, run_dir: Path,
                                                                           tmp_path: Path) -> None:  # fmt: skip
    replies = Codex(codex_bin, tmp_path / "codex", server.base_url).converse(LINES)
    store = Store.for_run_dir(run_dir)
    turns = recorded_conversation(store, replies)
    # one main turn per message, each answered with the engine's token ids, as Codex showed it
    assert [entry.turn.kind for entry in turns] == ["main"] * len(LINES)
    assert store.turns.counts()["side_turns"] == 0  # Codex sent nothing else
    for reply, entry in zip(replies, turns):
        assert entry.turn.prompt_token_ids and entry.turn.response_token_ids
        assert entry.turn.finish_reason == ("stop" if reply.complete else "length")
        assert entry.turn.response_text.strip() == reply.text.strip()
    if replies[0].complete:  # Codex reports our usage (a thread's running total, so the first alone)
        assert replies[0].input_tokens == len(turns[0].turn.prompt_token_ids)
    corrected, thanked = wait_for_judgment(store, turns[0].turn.id), wait_for_judgment(store, turns[1].turn.id)
    assert corrected.score == -1 and "rhyme" in (corrected.hint or "").lower()
    assert thanked.score == 1


def test_codex_wraps_the_users_words_and_the_judge_reads_only_them(codex_bin: Path, server: ServerThread, run_dir: Path,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """The recorded shape of Codex's requests: its prompt, its context blocks, the user's words alone."""
    codex = Codex(codex_bin, tmp_path / "codex", server.base_url, agents_md="Answer in plain text.\n")
    replies = codex.converse(LINES[:2])
    store = Store.for_run_dir(run_dir)
    first, second = recorded_conversation(store, replies)
    messages = first.turn.messages
    # Codex's prompt: two developer messages (system once recorded), its agent prompt first
    assert [message["role"] for message in messages] == ["system", "system", "user", "user"]
    assert content_text(messages[0]["content"]).startswith("You are a coding agent running in the Codex CLI")
    assert "<permissions instructions>" in content_text(messages[1]["content"])
    # its context blocks in a user message of their own: AGENTS.md, then the environment
    agents_md, environment = (part["text"] for part in messages[2]["content"])
    assert agents_md.startswith(f"# AGENTS.md instructions for {codex.workdir}\n\n<INSTRUCTIONS>\nAnswer in plain text.")
    assert environment.startswith("<environment_context>") and f"<cwd>{codex.workdir}</cwd>" in environment
    # then what the user typed, alone; function tools only (the documented config turns off the rest)
    assert messages[3] == text_message("user", LINES[0])
    assert {"exec_command", "write_stdin", "view_image"} <= {tool["function"]["name"] for tool in first.turn.tools or []}
    assert 10_000 < len(first.turn.prompt_token_ids) < 32768 - 512  # fits the tiny model's window with the default answer
    assert first.turn.sampling.temperature == 1.0 and first.turn.sampling.max_tokens == 512  # Codex sets neither

    # The next request is Codex's whole history: the answer echoed, then the user's reply alone,
    # which is all of the first turn's next state, and all the judge reads.
    assert second.turn.messages == [*messages, {"role": "assistant", "content": first.turn.response_text}, text_message("user", LINES[1])]
    assert first.next_messages == [text_message("user", LINES[1])]
    assert [user_typed(message) for message in first.next_messages] == [LINES[1]]
    verdict = wait_for_judgment(store, first.turn.id)
    assert verdict.score == -1 and [candidate.hint for candidate in verdict.hint_candidates] == [HINT]


def test_a_context_update_between_turns_is_not_read_as_the_users_words(codex_bin: Path, server: ServerThread, run_dir: Path,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """The user lets Codex write from the second message on (`--sandbox workspace-write`): Codex
    tells the model with a developer message and a new `<environment_context>` user message before
    the reply, and the judge must still read only the reply."""
    replies = Codex(codex_bin, tmp_path / "codex", server.base_url).converse(LINES[:2], later_sandbox="workspace-write")
    store = Store.for_run_dir(run_dir)
    first, _second = recorded_conversation(store, replies)
    permissions, environment, reply = first.next_messages
    assert permissions["role"] == "system" and "`workspace-write`" in content_text(permissions["content"])
    assert environment["role"] == "user" and content_text(environment["content"]).startswith("<environment_context>")
    assert reply == text_message("user", LINES[1])
    verdict = wait_for_judgment(store, first.turn.id)
    assert verdict.score == -1
    candidates = [candidate.hint for candidate in verdict.hint_candidates]
    if candidates != [HINT] or verdict.hint != HINT:
        raise WrapperReadAsTyped(f"the judge read Codex's context as the user's reply: hint {verdict.hint!r}, candidates {candidates!r}")
