"""The request contract honoured (issue 31): JSON outputs, forced tool calls and strict tools, decoded
under a grammar.

Against a real server on the tiny model, which on its own writes neither JSON nor tool calls on
these prompts: every answer parses, validates, or is a call, because every token was sampled from
the model's distribution masked to the grammar; the turn records the grammar and the log-probs of
that masked distribution. Strict tools under `tool_choice` auto take a lazy grammar: free text, or
text and then calls held to their schemas; the tiny model fitted to call get_weather shows a call
it chooses to make held, where on its own it writes one that breaks the schema.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch

from clawrl.model.constraints import (
    Constraint,
    GrammarVocabulary,
    allowed_bits,
    json_output_grammar,
    masked_logits,
    text_or_calls_grammar,
    unpack_bits,
)
from clawrl.serve.runner import ServerThread
from tests.helpers import WEATHER_QUESTION, start_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Lagos", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with start_server(tiny_model_dir, tmp_path_factory.mktemp("constrained"), served_model_name="tiny") as running:
        yield running


def chat(server: ServerThread, **fields: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about someone."}], "max_tokens": 120,
            "logprobs": True, **fields}  # fmt: skip
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("seed", range(4))
def test_a_json_schema_answer_validates(server: ServerThread, seed: int) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    answer = chat(server, response_format=format_, seed=seed, temperature=1.0)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_a_json_object_answer_parses_and_without_the_grammar_it_would_not(server: ServerThread) -> None:
    # any object: its strings are free, so an answer may also run out of tokens (finish_reason "length")
    choices = [chat(server, response_format={"type": "json_object"}, seed=seed, max_tokens=300).json()["choices"][0]
               for seed in range(4)]  # fmt: skip
    finished = [choice for choice in choices if choice["finish_reason"] == "stop"]
    assert finished, [choice["message"]["content"][-80:] for choice in choices]
    assert all(isinstance(json.loads(choice["message"]["content"]), dict) for choice in finished)
    free = chat(server, seed=1).json()["choices"][0]["message"]["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)


@pytest.mark.parametrize("seed", range(3))
def test_tool_choice_required_always_returns_a_tool_call(server: ServerThread, seed: int) -> None:
    answer = chat(server, tools=WEATHER_TOOLS, tool_choice="required", seed=seed)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    tool = next(tool for tool in WEATHER_TOOLS if tool["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def test_a_named_function_is_the_one_called(server: ServerThread) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    message = chat(server, tools=WEATHER_TOOLS, tool_choice=choice, seed=3).json()["choices"][0]["message"]
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["get_time"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["zone"] in ("UTC", "CET")


@pytest.mark.parametrize(
    ("fields", "code"),
    [({"tool_choice": "required"}, "tool_choice"),
     ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_mail"}}}, "unknown_tool"),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
      "unsupported_schema"),
     ({"response_format": {"type": "json_schema"}}, "response_format"),
     ({"tools": WEATHER_TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format")],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused(server: ServerThread, fields: dict[str, Any], code: str) -> None:
    """Refused for its shape (the OpenAPI document states these: the error names the field), or for
    what it names (its own codes)."""
    answer = chat(server, **fields)
    error = answer.json()["error"]
    assert answer.status_code == 400 and code in (error["code"], error["param"]), answer.text


def test_the_turn_records_its_grammar_and_the_log_probs_it_was_sampled_from(server: ServerThread) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    answer = chat(server, response_format=format_, seed=7)
    turn_id = answer.headers["X-Clawrl-Turn"]
    turn = server.app.state.service.store.turns.turn(turn_id)
    assert turn.sampling.grammar == json_output_grammar(PERSON)
    expected, unmasked = replayed_logprobs(server, turn)
    assert torch.allclose(torch.tensor(turn.response_logprobs, dtype=torch.float64), expected, atol=1e-4)
    assert not torch.allclose(expected, unmasked, atol=1e-2)  # the mask mattered
    assert all(math.isfinite(value) for value in turn.response_logprobs)


def replayed_logprobs(server: ServerThread, turn: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probs of `turn`'s response under the masks the trainer replays from its grammar
    (`allowed_bits`), recomputed from the served model in float64; and without the masks."""
    engine = server.app.state.service.engine
    model = engine.base_model
    vocabulary = GrammarVocabulary.of(engine.tokenizer, model.config.vocab_size)
    masks = allowed_bits(turn.sampling.grammar, vocabulary, turn.response_token_ids)
    ids = torch.tensor([turn.prompt_token_ids + turn.response_token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(turn.prompt_token_ids) - 1 : -1].double()
    masked = torch.log_softmax(masked_logits(logits, masks), dim=-1)
    raw = torch.log_softmax(logits, dim=-1)
    chosen = torch.tensor(turn.response_token_ids)
    return masked.gather(1, chosen[:, None])[:, 0], raw.gather(1, chosen[:, None])[:, 0]


def test_an_engine_without_constrained_decoding_refuses_the_contract(tiny_model_dir: Path) -> None:
    """`--engine openai` (a server clawrl did not start, whose grammar backend it cannot know) refuses
    with a 400 naming the way out, rather than answer free text."""
    from transformers import AutoTokenizer

    from clawrl.engines.remote import RemoteEngine
    from clawrl.errors import APIError
    from clawrl.serve.contract import request_grammar
    from clawrl.serve.schemas import ChatCompletionRequest

    assert RemoteEngine.constrained_decoding is False
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "response_format": {"type": "json_object"}})  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(APIError) as refused:
        request_grammar(request, None, tokenizer, engine_can=False)
    assert refused.value.status == 400 and refused.value.code == "unsupported_constraint"
    assert "--engine hf" in refused.value.message
    assert request_grammar(request, None, tokenizer, engine_can=True) == json_output_grammar(None)


# --- strict tools under tool_choice auto: a lazy grammar ----------------------------------------------

# get_weather as the tool model was fitted to call it (`tests.helpers.weather_conversations`: Lyon),
# but strict and with parameters its fitted call breaks: only the grammar makes its calls valid
STRICT_WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"]}}}  # fmt: skip
FREE_TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def tool_server(tool_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A server on the tiny model fitted to call get_weather when asked about the weather."""
    with start_server(tool_model_dir, tmp_path_factory.mktemp("strict"), served_model_name="tiny") as running:
        yield running


def weather_chat(server: ServerThread, tools: list[dict[str, Any]], seed: int, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": WEATHER_QUESTION}], "tools": tools, "seed": seed,
            "temperature": 1.0, "max_tokens": 80, **fields}  # fmt: skip
    answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json() | {"turn": server.app.state.service.store.turns.turn(answer.headers["X-Clawrl-Turn"])}


def calls_of(choice: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [json.loads(call["function"]["arguments"]) for call in choice["message"].get("tool_calls") or []
            if call["function"]["name"] == name]  # fmt: skip


def test_a_call_the_model_chooses_to_make_is_held_to_its_strict_tools_schema(tool_server: ServerThread) -> None:
    """`tool_choice` absent (auto): the model calls or not; every call of the strict tool validates (the
    same requests with `strict: false` show the fitted model's calls on their own do not)."""
    schema = STRICT_WEATHER["function"]["parameters"]
    held = [weather_chat(tool_server, [STRICT_WEATHER, FREE_TIME], seed) for seed in range(5)]
    calls = [arguments for answer in held for arguments in calls_of(answer["choices"][0], "get_weather")]
    assert calls, [answer["choices"][0]["message"] for answer in held]
    for arguments in calls:
        jsonschema.validate(arguments, {**schema, "additionalProperties": False})
    assert all(answer["turn"].sampling.grammar is not None for answer in held)
    loose = {**STRICT_WEATHER, "function": {**STRICT_WEATHER["function"], "strict": False}}
    free = [weather_chat(tool_server, [loose, FREE_TIME], seed) for seed in range(5)]
    assert all(answer["turn"].sampling.grammar is None for answer in free)
    unheld = [answer["choices"][0] for answer in free]
    assert any("Lyon" in json.dumps(choice["message"]) for choice in unheld), unheld


def test_a_strict_tools_turn_records_the_log_probs_the_trainer_replays(tool_server: ServerThread) -> None:
    """A turn decoded under the lazy grammar: its recorded log-probs are those of the distribution
    masked as the trainer's replay of its grammar masks it, and in a call the masks matter."""
    for seed in range(8):
        answer = weather_chat(tool_server, [STRICT_WEATHER], seed)
        if calls_of(answer["choices"][0], "get_weather"):
            break
    else:
        pytest.fail("the fitted model made no call in 8 seeds")
    turn = answer["turn"]
    expected, unmasked = replayed_logprobs(tool_server, turn)
    assert torch.allclose(torch.tensor(turn.response_logprobs, dtype=torch.float64), expected, atol=1e-4)
    assert not torch.allclose(expected, unmasked, atol=1e-2)  # the call's masks mattered


@pytest.mark.parametrize("seed", range(4))
def test_the_untrained_model_under_strict_tools_writes_text_or_valid_calls(server: ServerThread, seed: int) -> None:
    """The untrained model's random text, free until it opens a call: an answer is its text, or its
    text and then calls that validate; no call markup is left in the text."""
    answer = chat(server, tools=[STRICT_WEATHER, FREE_TIME], seed=seed, temperature=1.0, max_tokens=200)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert "<tool_call>" not in (message.get("content") or "")
    for arguments in calls_of(answer.json()["choices"][0], "get_weather"):
        jsonschema.validate(arguments, STRICT_WEATHER["function"]["parameters"])


def test_an_auto_request_without_strict_tools_records_no_grammar_and_none_never_calls(tool_server: ServerThread) -> None:
    """Ordinary turns are decoded as before: no grammar. `tool_choice: "none"` with strict tools needs
    none either: no call is parsed from its answer, whatever the model writes."""
    plain = weather_chat(tool_server, WEATHER_TOOLS, seed=1)
    assert plain["turn"].sampling.grammar is None
    for seed in range(3):
        answer = weather_chat(tool_server, [STRICT_WEATHER], seed, tool_choice="none")
        assert answer["turn"].sampling.grammar is None
        assert answer["choices"][0]["finish_reason"] != "tool_calls" and not answer["choices"][0]["message"].get("tool_calls")


def test_a_json_answer_with_tools_is_json_or_calls(tool_server: ServerThread) -> None:
    """An agent with a structured output and tools (the Agents SDK's `output_type`): the model may call
    its tools before it answers; the answer is JSON valid under the format, or calls held to the
    strict tool's schema. A forced JSON answer alone would leave it no way to call them."""
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    answers = [weather_chat(tool_server, [STRICT_WEATHER], seed, response_format=format_)["choices"][0] for seed in range(4)]
    called = [choice for choice in answers if choice["message"].get("tool_calls")]
    assert called, answers
    for choice in answers:
        if choice in called:
            for arguments in calls_of(choice, "get_weather"):
                jsonschema.validate(arguments, STRICT_WEATHER["function"]["parameters"])
        elif choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_free_text_cannot_open_a_call_the_grammar_does_not_see(tiny_model_dir: Path) -> None:
    """The lazy grammar, token by token (llguidance, the tiny tokenizer): free text runs unmasked but
    for the marker, spelled out in ordinary tokens or as its own token outside a call; the call after
    it is held; the tokenizer's other added tokens are free text, its special ones are not."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    grammar = text_or_calls_grammar(tokenizer, [STRICT_WEATHER, FREE_TIME], {"get_weather"})
    vocabulary = GrammarVocabulary.of(tokenizer, len(tokenizer))
    opening, closing, tools_token, im_start = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<tools>", "<|im_start|>"])

    def ids_of(pieces: list[str | int]) -> list[int]:
        return [token for piece in pieces for token in ([piece] if isinstance(piece, int) else tokenizer.encode(piece, add_special_tokens=False))]

    def refused_at(pieces: list[str | int]) -> int | None:
        """The index of the first token the grammar masks out, or None."""
        ids = ids_of(pieces)
        constraint = Constraint(grammar, vocabulary)
        for index, token_id in enumerate(ids):
            if not unpack_bits(constraint.allowed_words(), vocabulary.vocab_size)[token_id]:
                return index
            constraint.accept(token_id)
        return None

    spelled = ["Sure: <", "tool", "_call", ">"]
    assert refused_at(spelled[:-1]) is None and refused_at(spelled) == len(ids_of(spelled[:-1]))
    assert refused_at(["Hi ", tools_token, " there <b>"]) is None
    assert refused_at(["Hi", im_start]) == len(ids_of(["Hi"]))
    call = '\n{"name": "get_weather", "arguments": {"city": "Lima", "days": 3}}\n'
    assert refused_at(["Checking. ", opening, call, closing, "\n", opening, '\n{"name": "get_time", "arguments": {"x": [1]}}\n', closing]) is None
    assert refused_at([opening, call, closing, " and more"]) is not None  # after the calls, only the end
    assert refused_at([opening, '\n{"name": "get_weather", "arguments": {"city": "Lyon"']) is not None
    assert refused_at(["a ", closing]) == len(ids_of(["a "]))


def test_a_tokenizer_without_the_markers_spells_them_out(tiny_model_dir: Path) -> None:
    """Without `<tool_call>` in its vocabulary the markers are text: free text still ends at the first
    one (a lazy lexeme), and the call after it is held."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tiny = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = json.loads(tiny.backend_tokenizer.to_str())
    spec["added_tokens"] = [token for token in spec["added_tokens"] if token["special"]]  # the tool tokens go
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="<|im_end|>")
    assert "<tool_call>" not in tokenizer.get_added_vocab()
    grammar = text_or_calls_grammar(tokenizer, [STRICT_WEATHER], {"get_weather"})
    vocabulary = GrammarVocabulary.of(tokenizer, len(tokenizer))

    def accepts(text: str) -> bool:
        constraint = Constraint(grammar, vocabulary)
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            if not unpack_bits(constraint.allowed_words(), vocabulary.vocab_size)[token_id]:
                return False
            constraint.accept(token_id)
        return True

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    assert accepts("A <b>word</b> first. " + call) and accepts(call + "\n" + call)
    assert not accepts('Then <tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"')
    assert not accepts("Then <tool_call> more text")


def test_strict_tools_are_refused_by_an_engine_without_constrained_decoding(tiny_model_dir: Path) -> None:
    """`--engine openai` cannot hold a strict tool's calls: refused, naming the way out; an auto request
    whose tools are not strict is served as ever."""
    from transformers import AutoTokenizer

    from clawrl.errors import APIError
    from clawrl.serve.contract import request_grammar
    from clawrl.serve.schemas import ChatCompletionRequest

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "tools": [STRICT_WEATHER, FREE_TIME]})  # fmt: skip
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    assert all("strict" not in tool["function"] for tool in tools)  # the prompt renders the tools as before
    with pytest.raises(APIError) as refused:
        request_grammar(request, tools, tokenizer, engine_can=False)
    assert refused.value.status == 400 and refused.value.code == "unsupported_constraint" and refused.value.param == "tools"
    assert "strict to false" in refused.value.message
    assert request_grammar(request, tools, tokenizer, engine_can=True) == text_or_calls_grammar(tokenizer, tools, {"get_weather"})
    loose = request.model_copy(update={"tools": request.tools[1:]})
    assert request_grammar(loose, tools[1:], tokenizer, engine_can=False) is None
