"""The real Claude Code against a real server, over Anthropic's Messages API.

`make test` installs Claude Code's native binary (`@anthropic-ai/claude-code`, pinned) into a cache
outside the repository (scripts/install-claude-code.sh). The tests start the server on a free port
with the offline judge and hold a conversation of three user messages the way a user does from a
shell, with the environment of docs/clients.md (this server's URL, key and model filled in) and a
HOME, config directory and working directory of their own: `claude -p "<request>"`, then
`claude -p --continue "<reply>"` twice. A recorder in front of the app keeps every request as sent.

What Claude Code 2.1.332 sends (docs/clients.md has the whole list): in print mode, nothing but
`POST /v1/messages?beta=true` (no count_tokens, title or quota request), streamed, with `x-api-key`,
`anthropic-beta` and an `X-Claude-Code-Session-Id` header; `metadata.user_id` is a JSON string
holding its session id, which names the clawrl session (`user:<user_id>`). The system prompt is
text blocks with `cache_control`, the first a per-build `x-anthropic-billing-header` line; the first
user message is its context as `<system-reminder>` blocks, then what the user typed as a block of
its own; a later user message is what the user typed, alone. About 21,700 prompt tokens with the
tiny model's tokenizer (12 tools). When an answer shows nothing (the model stopped at once),
Claude Code asks once more in the same call, repeating the user's message with a
`<system-reminder>` that says so: an extra main turn, which the judge scores -1 with no hint.

What Claude Code sends by default, each served as it should be (and each with the check that
names it, raised if not):

* `SystemMessagesRefused`: its environment, tool, agent and skill sections as a `role: "system"`
  message after the first user message (mid-conversation system turns): a chat system message there.
* `ThinkingRefused`: `thinking: {"type": "adaptive"}`: the model decides whether to think, and this
  one never does, so the answer has no thinking blocks (`enabled` is still refused).
* `CompactionReadAsReply`: told the model's window (`CLAUDE_CODE_MAX_CONTEXT_TOKENS`), it compacts
  the conversation once it nears it, sending the whole conversation with its summary instruction
  ("CRITICAL: Respond with TEXT ONLY. ...") as the last user message: a side turn, so the last
  answer's next state is the user's next message, not the instruction.

The tiny model, untrained, rarely ends an answer within Claude Code's token limit (64 here), and
Claude Code then asks it to resume ("Output token limit hit"), several times. The tests therefore
serve the tiny model fitted for a few seconds, on a long prompt like Claude Code's, to end its
answers early (`brief_model_dir`); what it writes is still gibberish, which is fine.

Where the registry could not be reached the install script records why and the tests skip saying
so; under CI (`CLAWRL_REQUIRE_CLAUDE_CODE=1`, set by .ci/run) they fail instead.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clawrl.config import JudgeConfig
from clawrl.messages import content_text, user_typed
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.types import TurnContext
from tests.helpers import fit, start_server, wait_for_judgment

VERSION = "2.1.332"  # scripts/install-claude-code.sh installs this one
MODEL = "clawrl-tiny"
API_KEY = "sk-claude-code"
MAX_TOKENS = 64
LINES = ["Write a two-line poem about tea.", "no, make it rhyme and keep it short", "thanks, that's perfect"]
HINT = "Make it rhyme and keep it short."  # the rule judge's hint from the correction's directive
WINDOW = 32768  # the tiny model's context
CLIENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
DOCUMENTED_URL, DOCUMENTED_KEY = "http://127.0.0.1:30000", "sk-local"
DOCUMENTED_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
# What Claude Code adds to the user's message when it asks again after an answer that showed nothing
NO_VISIBLE_OUTPUT = "[Your previous response had no visible output. Please continue and produce a user-visible response.]"
# The start of the last user message of Claude Code's compaction request
SUMMARY_REQUEST = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."


class SystemMessagesRefused(AssertionError):
    """The server refused Claude Code's mid-conversation system message."""


class ThinkingRefused(AssertionError):
    """The server refused Claude Code's adaptive thinking."""


class CompactionReadAsReply(AssertionError):
    """Claude Code's compaction request was taken for a main turn: its instruction for the user's reply."""


SYSTEM_MESSAGES = ("Claude Code sends a role 'system' message after the first user message (its environment and tool "
                   "sections) and /v1/messages refuses it with a 400 (proposed: translate it to a chat system message)")  # fmt: skip
ADAPTIVE_THINKING = ("Claude Code asks for thinking {type: adaptive} and /v1/messages refuses it with a 400 (proposed: "
                     "accept adaptive thinking as a model that does not think: it is the model's choice)")  # fmt: skip
COMPACTION = ("Claude Code's compaction request (summary instruction as the last user message) is recorded as a main "
              "turn, so the judge reads the instruction as the user's reply (proposed: recognise it as a side turn)")  # fmt: skip


# --------------------------------------------------------------------------- the installed agent


def claude_code_dir() -> Path:
    """Where scripts/install-claude-code.sh installs (the same rule as the script)."""
    if os.environ.get("CLAWRL_CLAUDE_CODE_DIR"):
        return Path(os.environ["CLAWRL_CLAUDE_CODE_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "clawrl" / "claude-code"


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    """The `claude` binary; skips only where npm could not be reached (fails under CI)."""
    root = claude_code_dir()
    if (root / "bin" / "claude").exists():
        return root / "bin" / "claude"
    unavailable = root / "unavailable"
    if not unavailable.exists():
        pytest.fail(f"Claude Code is not installed in {root}: run scripts/install-claude-code.sh (`make test` does)")
    reason = f"Claude Code is not installed: {unavailable.read_text().strip()} (scripts/install-claude-code.sh)"
    if os.environ.get("CLAWRL_REQUIRE_CLAUDE_CODE") == "1":
        pytest.fail(reason + "; CLAWRL_REQUIRE_CLAUDE_CODE=1 says it must run here")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def brief_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model fitted (10 steps, seconds) to answer briefly. Behind Claude Code's 21,700 prompt
    tokens the tiny model hardly reads the conversation: fitted on short prompts it still runs past
    the 64-token limit more than half the time; fitted behind a long prompt (a system prompt of 500
    filler words, each user message after a filler reminder), it ends its answers well within it
    (and now and then at once: Claude Code then asks again, see `retried`)."""
    draw = random.Random(0)
    words = "the tool file agent user code run read write edit search task model answer shell path".split()

    def filler(count: int) -> str:
        return " ".join(draw.choice(words) for _ in range(count))

    answers = ["Steam curls from the cup, morning settles in.", "Tea in the pot, warm and hot.", "Glad you like it!"]
    history: list[dict[str, Any]] = [{"role": "system", "content": f"You are a Claude agent. {filler(500)}"}]
    conversations = []
    for line, answer in zip(LINES, answers):
        history = [*history, {"role": "user", "content": f"<system-reminder>\n{filler(50)}\n</system-reminder>\n{line}"}]
        conversations.append((history, answer))
        history = [*history, {"role": "assistant", "content": answer}]
    return fit(tiny_model_dir, tmp_path_factory.mktemp("brief-model"), conversations, steps=10, tools=None)


# --------------------------------------------------------------------------- what the server got


@dataclass
class Exchange:
    """One HTTP request as the server received it, and the headers of its answer."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any = None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class RecordExchanges:
    """ASGI middleware in front of the app: keeps every request as sent (the recorded turn keeps
    only what the chat path reads: no headers, no block structure, no `cache_control`)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], exchanges: list[Exchange]) -> None:
        self.app, self.exchanges = app, exchanges

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        exchange = Exchange(scope["method"], scope["path"], scope["query_string"].decode(), headers)
        self.exchanges.append(exchange)
        chunks: list[bytes] = []

        async def receiving() -> MutableMapping[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    raw = b"".join(chunks)
                    exchange.body = json.loads(raw) if raw else None
            return message

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                exchange.response_headers = {key.decode().lower(): value.decode() for key, value in message.get("headers", [])}
            await send(message)

        await self.app(scope, receiving, sending)


@dataclass
class Served:
    server: ServerThread
    store: Store
    exchanges: list[Exchange]

    @property
    def root(self) -> str:
        return self.server.base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def served(brief_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the module, with the offline judge, an API key and the request recorder."""
    run_dir = tmp_path_factory.mktemp("claude-code") / "run"
    exchanges: list[Exchange] = []
    server = start_server(brief_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), served_model_name=MODEL, api_key=API_KEY)
    server.app.add_middleware(RecordExchanges, exchanges=exchanges)  # before the app starts: outermost
    with server:
        yield Served(server, Store.for_run_dir(run_dir), exchanges)


# --------------------------------------------------------------------------- the documented setup


def documented_setup(root_url: str) -> tuple[dict[str, str], list[list[str]]]:
    """The environment and `claude` commands of docs/clients.md, for this server: its URL, key and
    model, and a token limit the tiny model's window holds beside Claude Code's prompt."""
    section = CLIENTS_PAGE.read_text().split("\n## Claude Code\n", 1)[1].split("\n## ", 1)[0]
    (script,) = [block for block in section.split("```bash\n")[1:] if "export ANTHROPIC_BASE_URL=" in block]
    env: dict[str, str] = {}
    commands = []
    for line in script.split("```", 1)[0].splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
        elif words[:1] == ["claude"]:
            commands.append(words[1:])
    ours = {DOCUMENTED_URL: root_url, DOCUMENTED_KEY: API_KEY, DOCUMENTED_MODEL: MODEL}
    for documented in ours:
        assert documented in env.values(), f"docs/clients.md's Claude Code setup no longer has {documented!r}"
    env = {name: ours.get(value, value) for name, value in env.items()}
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" in env
    env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(MAX_TOKENS)
    assert [command[-1] for command in commands] == LINES, "docs/clients.md's Claude Code conversation changed"
    return env, commands


@dataclass
class Reply:
    """What `claude -p --output-format json` reported for one user message."""

    returncode: int
    session_id: str
    text: str  # the answer as Claude Code showed it, or its error
    is_error: bool
    input_tokens: int  # summed over the call's requests
    result: dict[str, Any]


class ClaudeCode:
    """The CLI with a HOME and config directory of its own under `root`, never the user's, working in
    `root/work`, with the documented environment (`unset`: names left out, `extra`: added)."""

    def __init__(self, binary: Path, root: Path, root_url: str) -> None:
        self.binary, self.workdir, self.home = binary, root / "work", root / "home"
        for directory in (self.workdir, self.home):
            directory.mkdir(parents=True)
        self.documented, self.commands = documented_setup(root_url)
        # Nothing else from the user's environment, which Claude Code reads (ANTHROPIC_*, CLAUDE_*, proxies ...).
        self.base = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR") if name in os.environ}
        self.base.update(HOME=str(self.home), CLAUDE_CONFIG_DIR=str(self.home / ".claude"))

    def run(self, args: list[str], unset: tuple[str, ...] = (), **extra: str) -> Reply:
        env = self.base | {name: value for name, value in self.documented.items() if name not in unset} | extra
        # stdin closed: print mode would otherwise wait to read more of the prompt from it
        result = subprocess.run([str(self.binary), *args, "--output-format", "json"], cwd=self.workdir, env=env,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)  # fmt: skip
        try:
            report = json.loads(result.stdout)
        except ValueError:
            output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            raise AssertionError(f"claude {shlex.join(args)} printed no result:\n{output}") from None
        return Reply(result.returncode, report["session_id"], report.get("result", ""), report.get("is_error", False),
                     report["usage"]["input_tokens"], report)  # fmt: skip

    def say(self, args: list[str], **extra: str) -> Reply:
        reply = self.run(args, **extra)
        assert reply.returncode == 0 and not reply.is_error, f"claude {shlex.join(args)} failed: {reply.result}"
        return reply

    def converse(self) -> list[Reply]:
        """The documented conversation: the request, then two replies with `--continue`."""
        replies = [self.say(command) for command in self.commands]
        assert len({reply.session_id for reply in replies}) == 1, "claude -p --continue started a new session"
        return replies


# --------------------------------------------------------------------------- what the store shows


def typed(messages: list[dict[str, Any]]) -> list[str]:
    """What the user typed in each user message that carries any."""
    words = [user_typed(message) for message in messages if message["role"] == "user"]
    return [text for text in words if text]


def retried(entry: TurnContext) -> bool:
    """The turn answered with nothing and Claude Code asked again in the same call."""
    asked_again = any(NO_VISIBLE_OUTPUT in content_text(m.get("content")) for m in entry.next_messages if m["role"] == "user")
    return not entry.turn.response_text.strip() and not entry.turn.tool_calls and asked_again


def messages_requests(exchanges: list[Exchange]) -> list[Exchange]:
    return [exchange for exchange in exchanges if exchange.path == "/v1/messages"]


@dataclass
class Conversation:
    """The documented conversation, as Claude Code reported it and as the server saw and recorded it
    (taken when it ended: a later test may go on with it)."""

    claude: ClaudeCode
    replies: list[Reply]
    session_id: str
    turns: list[TurnContext]
    exchanges: list[Exchange]


@pytest.fixture(scope="module")
def conversation(claude_bin: Path, served: Served, tmp_path_factory: pytest.TempPathFactory) -> Conversation:
    root = tmp_path_factory.mktemp("claude")
    claude = ClaudeCode(claude_bin, root, served.root)
    before = len(served.exchanges)
    try:
        replies = claude.converse()
    finally:  # what Claude Code sent, for whoever reads a failure
        sent = [{"path": e.path, "headers": e.headers, "body": e.body, "status": e.status} for e in served.exchanges[before:]]
        (root / "requests.jsonl").write_text("".join(json.dumps(exchange) + "\n" for exchange in sent))
    # the module's other tests hold conversations of their own: this one's sessions name its session id
    sessions = [session for session in served.store.turns.list_sessions() if replies[0].session_id in session.id]
    assert len(sessions) == 1, f"{len(sessions)} sessions for one conversation: {[session.id for session in sessions]}"
    turns = served.store.turns.session_turns(sessions[0].id)
    for entry in turns:
        assert entry.turn.finish_reason != "length", (
            f"the model ran to the {MAX_TOKENS}-token limit and Claude Code asked it to resume: {entry.turn.response_text!r}"
        )
    return Conversation(claude, replies, sessions[0].id, turns, served.exchanges[before:])


def shown(turns: list[TurnContext]) -> list[TurnContext]:
    """The answers the user saw, one per message (Claude Code's retries after an empty answer left out)."""
    return [entry for entry in turns if not retried(entry)]


# --------------------------------------------------------------------------- the tests


def test_a_claude_code_conversation_is_one_session_judged_from_the_users_replies(conversation: Conversation,
                                                                                 served: Served) -> None:  # fmt: skip
    replies, turns = conversation.replies, conversation.turns
    # One session, named by Claude Code's `metadata.user_id` (a JSON string holding its session id).
    prefix = "user:"
    assert conversation.session_id.startswith(prefix)
    assert json.loads(conversation.session_id.removeprefix(prefix))["session_id"] == replies[0].session_id
    # One main turn per message (and one more each time the model stopped at once and Claude Code
    # asked again); nothing else was sent.
    assert [entry.turn.kind for entry in turns] == ["main"] * len(turns)
    answered = shown(turns)
    assert len(answered) == len(LINES) and len(turns) == len(messages_requests(conversation.exchanges))
    # Each call's answer is the last turn it made, as Claude Code showed it; it reports our usage.
    calls: list[list[TurnContext]] = [[]]
    for entry in turns:
        calls[-1].append(entry)
        if not retried(entry):
            calls.append([])
    for reply, call in zip(replies, calls):
        assert reply.text.strip() == call[-1].turn.response_text.strip()
        assert reply.input_tokens == sum(len(entry.turn.prompt_token_ids) for entry in call)
    for entry in turns:
        assert 15_000 < len(entry.turn.prompt_token_ids) < WINDOW - MAX_TOKENS  # fits the tiny model's window
        assert entry.turn.sampling.max_tokens == MAX_TOKENS and entry.turn.sampling.temperature == 1.0  # Claude Code sets none

    # Each answer's next state is what the user typed next, and it is judged from that alone.
    assert [typed(entry.next_messages) for entry in answered] == [[LINES[1]], [LINES[2]], []]
    corrected, thanked = (wait_for_judgment(served.store, entry.turn.id) for entry in answered[:2])
    assert corrected.score == -1 and "rhyme" in (corrected.hint or "").lower()
    assert thanked.score == 1
    # An empty answer that Claude Code asked again for failed; its note is not a correction to learn.
    for entry in turns:
        if retried(entry):
            verdict = wait_for_judgment(served.store, entry.turn.id)
            assert verdict.score == -1 and verdict.hint is None


def test_claude_code_wraps_the_users_words_and_the_judge_reads_only_them(conversation: Conversation, served: Served) -> None:
    """What Claude Code sends, as sent and as recorded: its system blocks, its context as reminder
    blocks before the user's words, and the judge reading only the words."""
    requests = conversation.exchanges
    # Print mode sends nothing but messages: no count_tokens, title, topic or quota request.
    assert {(exchange.method, exchange.path, exchange.query) for exchange in requests} == {("POST", "/v1/messages", "beta=true")}
    first, later = requests[0], requests[1:]
    session = conversation.replies[0].session_id
    for exchange in requests:
        headers, body = exchange.headers, exchange.body
        assert exchange.status == 200 and exchange.response_headers["x-clawrl-turn-kind"] == "main"
        assert headers["x-api-key"] == API_KEY and "authorization" not in headers  # ANTHROPIC_API_KEY
        assert headers["anthropic-version"] == "2023-06-01" and "claude-code-20250219" in headers["anthropic-beta"].split(",")
        assert headers["user-agent"].startswith(f"claude-cli/{VERSION} ") and headers["x-claude-code-session-id"] == session
        assert body["model"] == MODEL and body["stream"] is True and body["max_tokens"] == MAX_TOKENS
        assert "temperature" not in body and "thinking" not in body  # CLAUDE_CODE_DISABLE_THINKING=1
        assert json.loads(body["metadata"]["user_id"])["session_id"] == session
        assert all(message["role"] in ("user", "assistant") for message in body["messages"])  # -mid_conv_system

    # The system prompt: text blocks, a per-build billing line first, then the agent's prompt, cached.
    system = first.body["system"]
    assert system[0]["text"].startswith(f"x-anthropic-billing-header: cc_version={VERSION}.") and "cache_control" not in system[0]
    assert system[1] == {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                         "cache_control": {"type": "ephemeral"}}  # fmt: skip
    tools = {tool["name"]: tool for tool in first.body["tools"]}
    assert {"Bash", "Read", "Write", "Edit", "ToolSearch"} <= set(tools) and len(tools) == 12
    assert tools["DeferredToolPlaceholder"]["defer_loading"] is True  # Anthropic's tool search; clawrl ignores the flag

    # The first user message: Claude Code's context as <system-reminder> blocks (environment, model,
    # deferred tools, agents, skills, date, attribution), then what the user typed, alone, cached.
    (message,) = first.body["messages"]
    *context, words = message["content"]
    assert all(block["text"].startswith("<system-reminder>\n") for block in context) and len(context) == 7
    assert f"Primary working directory: {conversation.claude.workdir}" in context[0]["text"]
    assert words == {"type": "text", "text": LINES[0], "cache_control": {"type": "ephemeral"}}
    # A later message is what the user typed, alone, after Claude Code's whole history (its answers
    # echoed); asking again after an empty answer, it adds a reminder that says so.
    for exchange in later:
        roles, content = [m["role"] for m in exchange.body["messages"]], exchange.body["messages"][-1]["content"]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        if any(NO_VISIBLE_OUTPUT in block["text"] for block in content):
            continue
        assert len(content) == 1 and content[0]["text"] in LINES[1:] and content[0]["cache_control"] == {"type": "ephemeral"}

    # As recorded: the system blocks joined into one system message, the blocks of the user message
    # joined into one text, and the judge reading only the user's words from it.
    recorded = conversation.turns[0].turn
    assert recorded.messages[0] == {"role": "system", "content": "\n\n".join(block["text"] for block in system)}
    assert recorded.messages[1:] == [{"role": "user", "content": "\n\n".join(block["text"] for block in message["content"])}]
    assert user_typed(recorded.messages[1]) == LINES[0]
    assert {tool["function"]["name"] for tool in recorded.tools or []} == set(tools)
    answered = shown(conversation.turns)
    assert typed(answered[0].next_messages) == [LINES[1]]
    verdict = wait_for_judgment(served.store, answered[0].turn.id)
    assert verdict.score == -1 and [candidate.hint for candidate in verdict.hint_candidates] == [HINT]


def refusal(reply: Reply) -> str:
    return reply.text if reply.is_error and reply.result.get("api_error_status") == 400 else ""


def test_claude_codes_mid_conversation_system_message_is_served(claude_bin: Path, served: Served, tmp_path: Path) -> None:
    """Without `CLAUDE_CODE_MODEL_CAPABILITIES=-mid_conv_system`, Claude Code sends its context as a
    system message after the user's first message; the server must serve and record it."""
    claude = ClaudeCode(claude_bin, tmp_path, served.root)
    before = len(served.exchanges)
    reply = claude.run([*claude.commands[0]], unset=("CLAUDE_CODE_MODEL_CAPABILITIES",))
    sent = messages_requests(served.exchanges[before:])
    assert [m["role"] for m in sent[0].body["messages"]] == ["user", "system"]  # the shape that needs the fix
    if "a message's role is 'user' or 'assistant'" in refusal(reply):
        raise SystemMessagesRefused(f"{len(sent)} requests refused: {reply.text}")
    assert reply.returncode == 0 and not reply.is_error, reply.result
    turn = served.store.judging.turn_context(sent[-1].response_headers["x-clawrl-turn"]).turn
    assert turn.kind == "main" and user_typed([m for m in turn.messages if m["role"] == "user"][-1]) == LINES[0]
    assert any("# Environment" in content_text(m["content"]) for m in turn.messages if m["role"] == "system")


def test_claude_codes_adaptive_thinking_is_served(claude_bin: Path, served: Served, tmp_path: Path) -> None:
    """Without `CLAUDE_CODE_DISABLE_THINKING=1`, Claude Code asks for adaptive thinking (the model
    decides whether to think); a model that never thinks can serve that request."""
    claude = ClaudeCode(claude_bin, tmp_path, served.root)
    before = len(served.exchanges)
    reply = claude.run([*claude.commands[0]], unset=("CLAUDE_CODE_DISABLE_THINKING",))
    sent = messages_requests(served.exchanges[before:])
    assert sent[0].body["thinking"]["type"] == "adaptive"
    if "extended thinking ('adaptive') is not supported" in refusal(reply):
        raise ThinkingRefused(f"{len(sent)} requests refused: {reply.text}")
    assert reply.returncode == 0 and not reply.is_error, reply.result


def test_claude_codes_compaction_is_a_side_turn(conversation: Conversation, served: Served) -> None:
    """Told the model's window, Claude Code compacts the conversation before the next message (its
    21,700-token prompt is close to the 32K window): it asks the model for a summary of the whole
    conversation, then sends the summary, the last answer and the user's message. The summary
    requests are side turns, and the last answer's next state is the user's message."""
    before = len(served.exchanges)
    line = "now one about coffee"
    conversation.claude.say(["-p", "--continue", line], CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(WINDOW))
    sent = messages_requests(served.exchanges[before:])
    summaries = [e for e in sent if content_text(e.body["messages"][-1]["content"]).startswith(SUMMARY_REQUEST)]
    assert summaries, "Claude Code did not compact the conversation"
    kinds = {exchange.response_headers["x-clawrl-turn-kind"] for exchange in summaries}
    last_answer = shown(conversation.turns)[-1].turn.id
    entry = served.store.judging.turn_context(last_answer)
    if kinds != {"side"}:
        verdict = wait_for_judgment(served.store, last_answer)
        raise CompactionReadAsReply(
            f"{len(summaries)} summary requests recorded as {sorted(kinds)}; the last answer's next state reads "
            f"{typed(entry.next_messages)[0][:60]!r}..., judged {verdict.score} with the hint {verdict.hint!r}"
        )
    assert typed(entry.next_messages) == [line]
