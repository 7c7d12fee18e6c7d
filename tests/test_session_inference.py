"""Session inference over a real SQLite store, including cases a live model cannot be steered into."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clawrl.messages import conversation_hashes, echoed_answers, recorded_fingerprint
from clawrl.serve.sessions import resolve_session
from clawrl.store import Store
from clawrl.types import TurnSampling
from tests.helpers import record, user


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def test_same_answer_in_two_sessions_goes_to_the_one_whose_conversation_precedes_it(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t-apples", "s-apples", [user("tell me about apples")], "Sure!")
    record(store, "t-pears", "s-pears", [user("tell me about pears")], "Sure!")  # newer, same answer
    request = [user("tell me about apples"), assistant("Sure!"), user("more please")]
    identity = resolve_session(store, None, request, "main")
    assert identity.session_id == "s-apples"
    assert identity.continues_turn_id == "t-apples"
    assert identity.next_state == [user("more please")]


def test_identical_conversations_newest_wins(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t-old", "s-old", [user("hi")], "Hello!")
    record(store, "t-new", "s-new", [user("hi")], "Hello!")
    identity = resolve_session(store, None, [user("hi"), assistant("Hello!"), user("bye")], "main")
    assert identity.session_id == "s-new"


def test_client_reformatting_is_tolerated(tmp_path: Path) -> None:
    """Agents strip whitespace, send content parts, and re-serialise tool-call arguments."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("question")], "  An answer.\n")
    request = [
        {"role": "user", "content": [{"type": "text", "text": "question"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "An answer."}]},
        user("next"),
    ]
    assert resolve_session(store, None, request, "main").session_id == "s1"


def test_unknown_answer_starts_a_new_session(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("question")], "An answer.")
    identity = resolve_session(store, None, [user("question"), assistant("Something else"), user("next")], "main")
    assert identity.id_source == "new" and identity.session_id != "s1"
    assert identity.continues_turn_id is None


def test_answer_echoed_after_a_different_conversation_is_not_a_continuation(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("question one")], "Okay.")
    identity = resolve_session(store, None, [user("a totally different question"), assistant("Okay."), user("next")], "main")
    assert identity.id_source == "new"


def test_next_state_is_attached_once(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    first = resolve_session(store, None, [user("q"), assistant("A."), user("retry 1")], "main")
    record(store, "t2", first.session_id, [user("q"), assistant("A."), user("retry 1")], "B.",
           continues_turn_id=first.continues_turn_id, next_state=first.next_state)
    second = resolve_session(store, None, [user("q"), assistant("A."), user("retry 2")], "main")
    record(store, "t3", second.session_id, [user("q"), assistant("A."), user("retry 2")], "C.",
           continues_turn_id=second.continues_turn_id, next_state=second.next_state)
    turns = store.turns.session_turns("s1")
    assert [entry.turn.id for entry in turns] == ["t1", "t2", "t3"]
    assert turns[0].next_messages == [user("retry 1")]


def test_side_turn_never_carries_a_next_state(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    identity = resolve_session(store, None, [user("q"), assistant("A."), user("title please")], "side")
    assert identity.session_id == "s1" and identity.next_state is None and identity.continues_turn_id is None


def test_explicit_session_without_echoed_answer_uses_trailing_messages(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    identity = resolve_session(store, ("s1", "header"), [user("only the new message")], "main")
    assert identity.continues_turn_id == "t1"
    assert identity.next_state == [user("only the new message")]


def test_an_empty_answer_after_a_known_one_is_still_continued(tmp_path: Path) -> None:
    """A model can answer with nothing (EOS first); the next request must continue that turn,
    not the earlier one whose answer it can recognise (seen in CI with the untrained tiny model)."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("first question")], "An answer.")
    second = [user("first question"), assistant("An answer."), user("no, the other file")]
    record(store, "t2", "s1", second, "", continues_turn_id="t1", next_state=[user("no, the other file")])
    third = second + [assistant(""), user("thanks, that works")]
    identity = resolve_session(store, None, third, "main")
    assert identity.session_id == "s1"
    assert identity.continues_turn_id == "t2"
    assert identity.next_state == [user("thanks, that works")]


def test_two_empty_answers_in_a_row_continue_the_newest(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    second = [user("q"), assistant("A."), user("again")]
    record(store, "t2", "s1", second, "", continues_turn_id="t1", next_state=[user("again")])
    third = second + [assistant(""), user("and again")]
    record(store, "t3", "s1", third, " ", continues_turn_id="t2", next_state=[user("and again")])
    fourth = third + [assistant(" "), user("last try")]
    identity = resolve_session(store, None, fourth, "main")
    assert (identity.session_id, identity.continues_turn_id) == ("s1", "t3")
    assert identity.next_state == [user("last try")]


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def test_a_retry_of_an_empty_answer_without_echoing_it_continues_that_turn(tmp_path: Path) -> None:
    """OpenClaw, given an empty answer (EOS first), drops it and asks again with a note of its own
    and a fresh context message (seen in CI): that request continues the empty turn, whose next
    state is what the retry added, instead of starting a session of its own."""
    store = Store.for_run_dir(tmp_path)
    asked = [system("You are an agent."), user("[Wed 12:51] Plan a day in Lyon for me."), user("<context 1>")]
    record(store, "t1", "s1", asked, "")
    note = user("[Wed 12:51] The previous attempt did not produce a user-visible answer. Reply to the user.")
    retry = [system("You are an agent."), user("[Wed 12:51] Plan a day in Lyon for me."), note, user("<context 2>")]
    identity = resolve_session(store, None, retry, "main")
    assert (identity.session_id, identity.id_source, identity.continues_turn_id) == ("s1", "inferred", "t1")
    assert identity.next_state == [note, user("<context 2>")]
    assert resolve_session(store, None, retry, "side").id_source == "new"  # a side turn never continues one


def test_only_a_recent_empty_answer_that_ended_its_session_is_retried(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("hello there")], "Hi!")  # answered: a retry of it would echo it
    record(store, "t2", "s2", [user("what time is it")], "")
    record(store, "t3", "s2", [user("what time is it"), user("well?")], "It is noon.")  # the session went on
    record(store, "t4", "s3", [user("a question")], "")
    for request in ([user("hello there"), user("more")], [user("what time is it"), user("again")],
                    [user("a different question"), user("more")], [user("a question")]):  # fmt: skip
        assert resolve_session(store, None, request, "main").id_source == "new", request
    assert resolve_session(store, None, [user("a question"), user("hello?")], "main").continues_turn_id == "t4"


# --------------------------------------------------------------------------- agents that echo answers their own way


def tool_call_turn_fields(call_id: str, name: str, arguments: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A turn's fields when its answer was one tool call (arguments as JSON text, as the server writes them)."""
    calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]
    fingerprint = recorded_fingerprint("", calls, conversation_hashes(messages))
    return {"tool_calls": calls, "finish_reason": "tool_calls", "answer_fingerprint": fingerprint}


def test_a_tool_call_echoed_as_text_in_smolagents_way_continues_its_turn(tmp_path: Path) -> None:
    """smolagents echoes a call as "Calling tools:\\n" and Python's repr, its arguments parsed."""
    store = Store.for_run_dir(tmp_path)
    asked = [user("New task:\nWrite a poem")]
    record(store, "t1", "s1", asked, "", **tool_call_turn_fields("call_1", "final_answer", {"answer": "Tea, l'été"}, asked))
    echo = "Calling tools:\n" + str([{"id": "call_1", "type": "function", "function": {"name": "final_answer", "arguments": {"answer": "Tea, l'été"}}}])
    reply = user("Observation:\nTea, l'été\nNew task:\nshorter please")
    identity = resolve_session(store, None, [*asked, assistant(echo), reply], "main")
    assert (identity.session_id, identity.continues_turn_id, identity.next_state) == ("s1", "t1", [reply])
    # other arguments, or text that only looks like it, are other answers
    other = echo.replace("Tea, l'été", "Coffee")
    for text in (other, "Calling tools:\n[{'function': {'name': 'final_answer'}}, {1, 2}]", "Calling tools:\n[not python"):
        assert resolve_session(store, None, [*asked, assistant(text), reply], "main").id_source == "new", text


def test_an_echo_that_kept_its_stop_string_continues_its_turn(tmp_path: Path) -> None:
    """smolagents' CodeAgent stops at "</code>" and keeps it at the end of every answer it echoes,
    also in a request that asks for no stop string."""
    store = Store.for_run_dir(tmp_path)
    asked = [user("New task:\nsum 2 and 2")]
    record(store, "t1", "s1", asked, "Thought: add.\n<code>\nprint(2 + 2)\n", sampling=TurnSampling(stop=["Observation:", "</code>"]))
    echoed = assistant("Thought: add.\n<code>\nprint(2 + 2)\n</code>")
    reply = user("Observation:\n4\nNew task:\nthanks")
    for stop in (None, ["</code>"]):
        identity = resolve_session(store, None, [*asked, echoed, reply], "main", stop)
        assert (identity.session_id, identity.continues_turn_id) == ("s1", "t1"), stop
    # a tag that was no stop string of the turn: the echo is another answer
    record(store, "t2", "s2", [user("q")], "Use <b>bold", sampling=TurnSampling(stop=["</code>"]))
    assert resolve_session(store, None, [user("q"), assistant("Use <b>bold</b>"), user("ok")], "main").id_source == "new"
    # a stop string of the request (no closing tag) is found the same way
    record(store, "t3", "s3", [user("list")], "1. a\n2. b", sampling=TurnSampling(stop=["\nEND"]))
    identity = resolve_session(store, None, [user("list"), assistant("1. a\n2. b\nEND"), user("ok")], "main", ["\nEND"])
    assert identity.continues_turn_id == "t3"


STUCK = "Error:\nError while parsing tool call from model output: no call\nNow let's retry: take care not to repeat previous errors! If you have retried several times, try a completely different approach.\n"


def test_the_user_replies_to_an_agents_follow_up_it_never_echoes(tmp_path: Path) -> None:
    """smolagents after max_steps: the step's answer failed, so it asks for an answer in one more
    request and shows the user that answer, but keeps only the step in its memory. The user's reply
    (after the step's echo) is the reply to the answer they saw."""
    store = Store.for_run_dir(tmp_path)
    task = [user("New task:\nWrite a poem")]
    record(store, "step", "s1", task, "random words")
    follow_up = user(STUCK + "\nBased on the above, please provide an answer to the following user task:\nWrite a poem")
    stuck_request = [system("An agent tried to answer a user query but it got stuck"), *task, assistant("random words"), follow_up]
    identity = resolve_session(store, None, stuck_request, "main")
    assert (identity.continues_turn_id, identity.next_state) == ("step", [follow_up])
    record(store, "stuck", "s1", stuck_request, "A poem.", continues_turn_id="step", next_state=[follow_up])
    reply = user(STUCK.replace("Error while parsing tool call from model output: no call", "Reached max steps.") + "New task:\nmake it rhyme")
    identity = resolve_session(store, None, [*task, assistant("random words"), reply], "main")
    assert (identity.session_id, identity.continues_turn_id, identity.next_state) == ("s1", "stuck", [reply])


def test_a_branch_after_the_users_own_words_does_not_move_to_the_newest_turn(tmp_path: Path) -> None:
    """A user who edits their message after an answer branches the conversation: the newest turn's
    request added words of the user, so the branch's message is no reply to that turn's answer."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    record(store, "t2", "s1", [user("q"), assistant("A."), user("shorter")], "B.", continues_turn_id="t1", next_state=[user("shorter")])
    identity = resolve_session(store, None, [user("q"), assistant("A."), user("much shorter")], "main")
    assert (identity.session_id, identity.continues_turn_id) == ("s1", "t1")  # t1 keeps its first next state


def code_agent_echo(answer: str, code: str) -> dict[str, Any]:
    """A smolagents CodeAgent's memory of an answer whose code it ran: the answer's text (with the
    closing tag it puts back), then its own call of `python_interpreter` with that code, merged into
    one message as smolagents merges messages of one role."""
    call = {"id": "call_1", "type": "function", "function": {"name": "python_interpreter", "arguments": code}}
    return assistant(f"{answer}\nCalling tools:\n{[call]}")


def test_a_code_agents_answer_is_known_with_the_call_it_made_of_its_code(tmp_path: Path) -> None:
    """A CodeAgent runs the code of each answer itself and echoes the answer followed by that call:
    the server answered text only (the stop string "</code>" cut it), so the echo is that text."""
    store = Store.for_run_dir(tmp_path)
    task = [system("You are an expert assistant who can solve any task using code blobs."), user("New task:\nAdd 2 and 3")]
    record(store, "code", "s1", task, "Thought: add them.\n<code>\nfinal_answer(2 + 3)\n", sampling=TurnSampling(stop=["Observation:", "Calling tools:", "</code>"]))
    echo = code_agent_echo("Thought: add them.\n<code>\nfinal_answer(2 + 3)\n</code>", "final_answer(2 + 3)")
    reply = user("Observation:\nExecution logs:\nLast output from code snippet:\n5\nNew task:\nnow multiply them")
    identity = resolve_session(store, None, [*task, echo, reply], "main")
    assert (identity.session_id, identity.continues_turn_id, identity.next_state) == ("s1", "code", [reply])


def test_a_code_agents_empty_answer_is_known_by_the_empty_code_it_ran(tmp_path: Path) -> None:
    """An empty answer (the model stopped at once; seen in CI) is code too for a CodeAgent: it runs
    "" and echoes only its call, on a line of its own. Its call for an answer after max_steps
    continues that turn."""
    store = Store.for_run_dir(tmp_path)
    task = [user("New task:\nWrite a poem")]
    record(store, "empty", "s1", [system("You are an expert assistant who can solve any task using code blobs."), *task], "")
    follow_up = user(STUCK.replace("Error while parsing tool call from model output: no call", "Reached max steps.") + "Based on the above, please provide an answer to the following user task:\nWrite a poem")
    stuck_request = [system("An agent tried to answer a user query but it got stuck"), *task, code_agent_echo("", ""), follow_up]
    identity = resolve_session(store, None, stuck_request, "main")
    assert (identity.session_id, identity.continues_turn_id, identity.next_state) == ("s1", "empty", [follow_up])
    assert echoed_answers("\nCalling tools:\n[{'id': 'c', 'type': 'function', 'function': {'name': 'final_answer', 'arguments': {}}}]", None)[0][0] == ""


def test_a_text_echo_too_large_to_parse_quickly_stays_text() -> None:
    """Python's parser holds the GIL: a request's "Calling tools:\\n[1,1,1,...]" megabytes long must not
    stall serving, so such text is never parsed (it is an answer of that text, known by it or not at all)."""
    call = {"id": "c", "type": "function", "function": {"name": "final_answer", "arguments": {"answer": "and then there were some more words in the answer, " * 1150}}}
    assert echoed_answers("Calling tools:\n" + str([call]), None) == [("", [call])]  # 60K characters of prose still read
    for hostile in ("[" + "1," * 500_000 + "]", "[" + "[" * 3000 + "]" * 3000 + "]"):
        assert echoed_answers("Calling tools:\n" + hostile, None) == [("Calling tools:\n" + hostile, None)]


def test_inference_never_crosses_users(tmp_path: Path) -> None:
    """Another user's echoed answer, retried empty answer or quoted conversation joins nothing of theirs."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t-answer", "alice/a", [user("tell me about apples")], "Apples are pomes.", user_id="alice")
    echo = [user("tell me about apples"), assistant("Apples are pomes."), user("more please")]
    assert resolve_session(store, None, echo, "main", user_id="bob").id_source == "new"
    assert resolve_session(store, None, echo, "main", user_id="alice").continues_turn_id == "t-answer"
    asked = [user("Plan a day in Lyon for me.")]
    record(store, "t-empty", "alice/b", asked, "", user_id="alice")
    retry = [*asked, user("The previous attempt did not produce a user-visible answer. Reply to the user.")]
    assert resolve_session(store, None, retry, "main", user_id="bob").id_source == "new"
    assert resolve_session(store, None, retry, "main", user_id="alice").continues_turn_id == "t-empty"
    summary = [system("You are a context summarization assistant."), user("[User]: tell me about apples\n[Assistant]: Apples are pomes.")]
    assert resolve_session(store, None, summary, "side", user_id="bob").id_source == "new"
    assert resolve_session(store, None, summary, "side", user_id="alice").session_id in ("alice/a", "alice/b")
