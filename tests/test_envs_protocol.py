"""The environment protocol on the wire: our server on a real port, driven by raw HTTP and by
`HTTPEnvironment`, and the same client driving a minimal server written to OpenEnv's shapes."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from clawrl.config import EnvConfig
from clawrl.envs.http import HTTPEnvironment, create_env_app
from clawrl.envs.protocol import Action, EpisodeOverError
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.envs.toolcall.problems import problem
from tests.helpers import wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(app: FastAPI) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the environment server to start", every=0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def toolcall_url() -> Iterator[str]:
    config = EnvConfig(toolcall_train_problems=20, toolcall_eval_problems=5, max_steps=3)
    yield from _serve(create_env_app(lambda: ToolCallEnv(config), "math", max_episodes=4))


def answer(task: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"The answer is \\boxed{{{problem(task).answer}}}"}


def test_health_schema_and_tasks(toolcall_url: str) -> None:
    assert httpx.get(f"{toolcall_url}/health").json() == {"status": "healthy"}
    schema = httpx.get(f"{toolcall_url}/schema").json()
    assert set(schema) == {"action", "observation", "state"}
    assert "tool_calls" in schema["action"]["properties"]
    train = httpx.get(f"{toolcall_url}/tasks", params={"split": "train"}).json()["tasks"]
    evaluation = httpx.get(f"{toolcall_url}/tasks", params={"split": "eval"}).json()["tasks"]
    assert len(train) == 20 and len(evaluation) == 5 and not set(train) & set(evaluation)


def test_an_episode_over_raw_http_in_openenv_shape(toolcall_url: str) -> None:
    task = httpx.get(f"{toolcall_url}/tasks").json()["tasks"][0]
    reset = httpx.post(f"{toolcall_url}/reset", json={"seed": 3, "episode_id": "ep-1", "task": task}).json()
    assert set(reset) >= {"observation", "reward", "done"} and reset["done"] is False
    roles = [message["role"] for message in reset["observation"]["messages"]]
    assert roles == ["system", "user"] and problem(task).question in reset["observation"]["messages"][1]["content"]
    assert [tool["function"]["name"] for tool in reset["observation"]["tools"]] == ["python"]
    assert reset["metadata"]["episode_id"] == "ep-1"

    step = httpx.post(f"{toolcall_url}/step", json={"action": answer(task), "episode_id": "ep-1"}).json()
    assert step["done"] is True and step["reward"] == 1.0 and step["metadata"]["correct"] is True
    state = httpx.get(f"{toolcall_url}/state", params={"episode_id": "ep-1"}).json()
    assert state == {"episode_id": "ep-1", "step_count": 1, "task": task, "done": True, "reward": 1.0}


def test_bad_requests_get_error_objects_not_500s(toolcall_url: str) -> None:
    httpx.post(f"{toolcall_url}/reset", json={"episode_id": "ep-bad"})
    cases = [
        ("/step", {"action": {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
                   "episode_id": "ep-bad"}, 400),
        ("/step", {"action": {"role": "user", "content": "hi"}, "episode_id": "ep-bad"}, 400),
        ("/step", {"episode_id": "ep-bad"}, 400),
        ("/step", {"action": {"content": "1"}, "episode_id": "nope"}, 404),
        ("/reset", {"task": "arithmetic-9-1"}, 400),
        ("/reset", {"seed": -1}, 400),
        ("/close", {"episode_id": "nope"}, 404),
    ]
    for path, body, status in cases:
        response = httpx.post(f"{toolcall_url}{path}", json=body)
        assert response.status_code == status, (body, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    httpx.post(f"{toolcall_url}/step", json={"action": {"content": "1"}, "episode_id": "ep-bad"})
    over = httpx.post(f"{toolcall_url}/step", json={"action": {"content": "1"}, "episode_id": "ep-bad"})
    assert over.status_code == 409 and over.json()["error"]["code"] == "episode_over"
    assert httpx.post(f"{toolcall_url}/step", content=b"not json", headers={"content-type": "application/json"}).status_code == 400


HUGE_INTEGER = b"1" * 5000  # json.loads raises ValueError (not JSONDecodeError) over 4,300 digits


@pytest.mark.parametrize(("path", "body"), [
    ("/reset", b'{"seed": ' + HUGE_INTEGER + b', "episode_id": "ep-json"}'),
    ("/reset", b'{"episode_id": "ep-json", "extra": [' + HUGE_INTEGER + b"]}"),
    ("/step", b'{"action": {"content": "1", "x": {"y": [' + HUGE_INTEGER + b']}}, "episode_id": "ep-json"}'),
    ("/close", b'{"episode_id": ' + HUGE_INTEGER + b"}"),
    # parses, but the answer echoing it could not be encoded (a 500)
    ("/step", b'{"action": {"content": "\\ud800"}, "episode_id": "ep-json"}'),
    ("/step", b"[" * 30_000 + b"]" * 30_000),
], ids=["reset-seed", "reset-nested", "step-nested", "close", "step-lone-surrogate", "step-nested-too-deep"])  # fmt: skip
def test_bodies_the_json_parser_refuses_get_an_invalid_json_error(toolcall_url: str, path: str, body: bytes) -> None:
    assert httpx.post(f"{toolcall_url}/reset", json={"episode_id": "ep-json"}).status_code == 200
    response = httpx.post(f"{toolcall_url}{path}", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_json" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("The request body") and "sys.set_int_max_str_digits" not in error["message"]
    # the refused request changed nothing: the episode is still open, no step taken
    state = httpx.get(f"{toolcall_url}/state", params={"episode_id": "ep-json"})
    assert state.status_code == 200 and state.json()["step_count"] == 0 and state.json()["done"] is False
    assert httpx.post(f"{toolcall_url}/close", json={"episode_id": "ep-json"}).status_code == 200


@pytest.mark.parametrize("arguments", ['{"code": ' + "1" * 5000 + "}", "[" * 5000 + "]" * 5000], ids=["5000-digits", "nested"])
def test_tool_call_arguments_the_json_parser_refuses_are_answered_in_band(toolcall_url: str, arguments: str) -> None:
    """The model's arguments are parsed by the environment: an integer over 4,300 digits or a deep
    nesting raised there, and the episode was closed with a 500. The tool now answers the error."""
    assert httpx.post(f"{toolcall_url}/reset", json={"episode_id": "ep-args"}).status_code == 200
    call = {"id": "c1", "function": {"name": "python", "arguments": arguments}}
    response = httpx.post(f"{toolcall_url}/step", json={"action": {"tool_calls": [call]}, "episode_id": "ep-args"})
    assert response.status_code == 200, response.text
    [reply] = response.json()["observation"]["messages"]
    assert reply["role"] == "tool" and reply["content"].startswith("error: the arguments are not valid JSON")
    assert httpx.post(f"{toolcall_url}/close", json={"episode_id": "ep-args"}).status_code == 200


def test_too_many_open_episodes_is_a_429_and_finished_ones_make_room(toolcall_url: str) -> None:
    for index in range(4):
        assert httpx.post(f"{toolcall_url}/reset", json={"episode_id": f"full-{index}"}).status_code == 200
    refused = httpx.post(f"{toolcall_url}/reset", json={"episode_id": "full-4"})
    assert refused.status_code == 429
    httpx.post(f"{toolcall_url}/step", json={"action": {"content": "1"}, "episode_id": "full-0"})  # ends full-0
    assert httpx.post(f"{toolcall_url}/reset", json={"episode_id": "full-4"}).status_code == 200
    for index in range(1, 5):
        assert httpx.post(f"{toolcall_url}/close", json={"episode_id": f"full-{index}"}).status_code == 200


def test_an_episode_nobody_touches_is_closed_and_a_used_one_is_kept() -> None:
    config = EnvConfig(toolcall_train_problems=20, toolcall_eval_problems=5, max_steps=1000)
    python = {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]}
    for url in _serve(create_env_app(lambda: ToolCallEnv(config), "math", max_episodes=4, idle_timeout_s=2.0)):
        for episode_id in ("left", "used"):
            assert httpx.post(f"{url}/reset", json={"episode_id": episode_id}).status_code == 200

        def left_closed() -> bool:
            assert httpx.post(f"{url}/step", json={"action": python, "episode_id": "used"}).status_code == 200  # in use
            return httpx.get(f"{url}/state", params={"episode_id": "left"}).status_code == 404

        wait_until(left_closed, 30, "the idle episode to be closed", every=0.1)


class CountedToolCallEnv(ToolCallEnv):
    """The tool-call environment, counting how many were made and closed, and hanging on the answer "hang"."""

    made: list["CountedToolCallEnv"] = []

    def __init__(self, config: EnvConfig) -> None:
        super().__init__(config)
        self.closed = False
        CountedToolCallEnv.made.append(self)

    async def step(self, action: Action) -> Any:
        if action.content == "hang":
            await asyncio.sleep(60)
        return await super().step(action)

    async def close(self) -> None:
        self.closed = True
        await super().close()


def test_finished_episodes_leave_their_environment_warm_and_a_hung_one_is_closed() -> None:
    config = EnvConfig(toolcall_train_problems=20, toolcall_eval_problems=5, max_steps=3)
    CountedToolCallEnv.made = []
    app = create_env_app(lambda: CountedToolCallEnv(config), "math", max_episodes=2, step_timeout_s=0.5)
    for url in _serve(app):
        tasks = httpx.get(f"{url}/tasks").json()["tasks"]
        for index, task in enumerate(tasks[:3]):  # one after another: one environment, reset each time
            httpx.post(f"{url}/reset", json={"episode_id": f"seq-{index}", "task": task}).raise_for_status()
            ended = httpx.post(f"{url}/step", json={"action": answer(task), "episode_id": f"seq-{index}"}).json()
            assert ended["done"] is True and ended["reward"] == 1.0
        assert len(CountedToolCallEnv.made) == 2  # the one answering /tasks, and the one that played all three
        counts = httpx.get(f"{url}/metadata").json()["environments"]
        assert (counts["started"], counts["reused"], counts["running"], counts["warm"]) == (1, 2, 0, 1)
        # a finished episode still answers /state, and refuses another step
        state = httpx.get(f"{url}/state", params={"episode_id": "seq-0"}).json()
        assert state == {"episode_id": "seq-0", "step_count": 1, "task": tasks[0], "done": True, "reward": 1.0}
        assert httpx.post(f"{url}/step", json={"action": answer(tasks[0]), "episode_id": "seq-0"}).status_code == 409

        httpx.post(f"{url}/reset", json={"episode_id": "stuck"}).raise_for_status()
        hung = httpx.post(f"{url}/step", json={"action": {"content": "hang"}, "episode_id": "stuck"}, timeout=30)
        assert hung.status_code == 500 and "did not answer in time" in hung.json()["error"]["message"]
        assert CountedToolCallEnv.made[1].closed  # the warm environment it had is gone, not given to the next episode
        assert httpx.get(f"{url}/state", params={"episode_id": "stuck"}).status_code == 404
        httpx.post(f"{url}/reset", json={"episode_id": "after"}).raise_for_status()
        assert len(CountedToolCallEnv.made) == 3 and httpx.get(f"{url}/metadata").json()["environments"]["running"] == 1
    assert all(env.closed for env in CountedToolCallEnv.made)  # shutting down closes every environment


def test_http_environment_drives_our_server(toolcall_url: str) -> None:
    async def play() -> None:
        env = HTTPEnvironment(toolcall_url)
        task = (await env.tasks("eval"))[0]
        opening = await env.reset(seed=0, task=task)
        assert opening.tools[0]["function"]["name"] == "python"
        bad_call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{}"}}]}
        first = await env.step(Action.model_validate(bad_call))
        assert not first.done and first.observation.messages[0].tool_call_id == "c1"
        assert "no tool 'nope'" in first.observation.messages[0].content
        last = await env.step(Action.model_validate(answer(task)))
        assert last.done and last.reward == 1.0
        assert (await env.state()).step_count == 2
        with pytest.raises(EpisodeOverError):
            await env.step(Action.model_validate(answer(task)))
        await env.close()

    asyncio.run(play())


# --- a server written to OpenEnv's documented shapes (stateless HTTP, its own action JSON) ---


class EchoAction(BaseModel):
    message: str


def openenv_echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/reset")
    async def reset(body: dict[str, Any]) -> dict[str, Any]:
        return {"observation": {"echoed_message": "", "message_length": 0}, "reward": None, "done": False}

    @app.post("/step")
    async def step(body: dict[str, Any]) -> dict[str, Any]:
        action = EchoAction.model_validate(body["action"])
        observation = {"echoed_message": action.message, "message_length": len(action.message)}
        return {"observation": observation, "reward": float(len(action.message)), "done": action.message == "bye"}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {"action": EchoAction.model_json_schema(), "observation": {}, "state": {}}

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return {"episode_id": None, "step_count": 0}

    return app


def test_http_environment_drives_an_openenv_server_through_an_act_tool() -> None:
    async def play(url: str) -> None:
        env = HTTPEnvironment(url)
        assert await env.tasks("train") == []  # no task list: the server picks
        opening = await env.reset(seed=1)
        assert [tool["function"]["name"] for tool in opening.tools] == ["act"]
        assert opening.tools[0]["function"]["parameters"]["required"] == ["message"]
        call = {"id": "a1", "type": "function", "function": {"name": "act", "arguments": '{"message": "hello"}'}}
        bad = {"id": "a2", "type": "function", "function": {"name": "act", "arguments": '{"msg": 1}'}}
        result = await env.step(Action(tool_calls=[call, bad]))
        assert '"echoed_message": "hello"' in result.observation.messages[0].content
        assert result.observation.messages[1].content.startswith("error: missing argument 'message'")
        assert result.reward == 5.0 and not result.done
        bye = {"id": "a3", "type": "function", "function": {"name": "act", "arguments": '{"message": "bye"}'}}
        assert (await env.step(Action(tool_calls=[bye]))).done
        await env.close()

    for url in _serve(openenv_echo_app()):
        asyncio.run(play(url))
