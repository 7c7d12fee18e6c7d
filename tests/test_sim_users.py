"""Simulated users: preference detectors on realistic answers, requests the rule judge reads as a
person's, reactions drawn from the held-out corpus, the session protocol, and the LLM-driven voice
against a scripted OpenAI-compatible server.

What the judge makes of the held-out reactions is never asserted here: that is what the learning
benchmark measures (its judge agreement), and a test on it would invite tuning on held-out words.
"""

from __future__ import annotations

import json
import random
import threading
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from clawrl.judge.corpus import TUNING, load_part
from clawrl.judge.rule import rule_hints, rule_score
from clawrl.sim.answers import has_markup, is_warm, on_topic, result_correct, student_satisfied, teacher_satisfied
from clawrl.sim.corpus import Problem
from clawrl.sim.personas import COMPLAINT_STYLES, PERSONAS, PRAISE_STYLES, STUDENT, STUDENT_STRICT, TEACHER, Persona, Requests, held_out_reactions
from clawrl.sim.styles import render_ai, render_plain, render_warm
from clawrl.sim.users import Cue, Intent, LLMVoice, ScriptedVoice, UserSession, problems, satisfies

CUPCAKES = Problem(
    "Emma has 57 cupcakes. She gets 6 more. How many cupcakes does Emma have now?",
    ("Emma starts with 57 cupcakes.", "Adding the 6 new ones gives 57 + 6 = 63."),
    "63",
)
STICKERS = Problem(
    "Leo has 5 stickers. He buys 3 packs with 4 stickers in each, then gives 2 away. How many stickers does Leo have now?",
    ("The packs hold 3 × 4 = 12 stickers.", "Together with the first ones that makes 5 + 12 = 17.",
     "After giving 2 away, 17 - 2 = 15 are left."),
    "15",
)

# --------------------------------------------------------------------------- detectors

CHATBOT_MARKDOWN = """Sure! Let's solve this step by step.

### Step 1: Find the total
Emma has 57 cupcakes and gets 6 more: 57 + 6 = 63.

**Answer:** Emma has 63 cupcakes."""
BULLETS = "Here is the working:\n- 57 + 6 = 63\n- so Emma has 63 cupcakes"
NUMBERED_PAREN = "1) Emma starts with 57.\n2) 57 + 6 = 63, so she has 63."
PLAIN_PROSE = "Emma starts with 57 cupcakes, and getting 6 more makes 57 + 6 = 63. So she has 63 cupcakes now."
NO_WORKING = "Emma has 63 cupcakes now."
ASTERISK_TIMES = "The packs hold 3 * 4 = 12 stickers, plus the first 5 is 5 + 12 = 17, and giving 2 away leaves 17 - 2 = 15."


@pytest.mark.parametrize(("answer", "satisfied"), [
    (CHATBOT_MARKDOWN, False),  # a heading and bold
    (BULLETS, False),
    (NUMBERED_PAREN, False),
    (PLAIN_PROSE, True),
    (NO_WORKING, False),  # plain, but the step is not shown
])
def test_student_detector_on_realistic_answers(answer: str, satisfied: bool) -> None:
    assert student_satisfied(answer, CUPCAKES) is satisfied


def test_student_wants_every_step_of_a_longer_problem() -> None:
    assert student_satisfied(ASTERISK_TIMES, STICKERS)  # "3 * 4" is multiplication, not bold
    assert not has_markup(ASTERISK_TIMES)
    two_of_three = "The packs hold 3 × 4 = 12 stickers, so with the first ones 5 + 12 = 17. He has 15 left."
    assert not student_satisfied(two_of_three, STICKERS)


def test_student_on_every_style_the_tiny_model_learns() -> None:
    rng = random.Random(0)
    for problem in problems(rng, 40):
        assert student_satisfied(render_plain(problem, rng), problem)
        assert not student_satisfied(render_ai(problem, rng), problem)


def test_teacher_wants_long_and_warm() -> None:
    rng = random.Random(1)
    for problem in problems(rng, 40):
        assert teacher_satisfied(render_warm(problem, rng), problem)
        assert not teacher_satisfied(render_plain(problem, rng), problem)
        assert not teacher_satisfied(render_ai(problem, rng), problem)
    long_and_cold = " ".join([PLAIN_PROSE] * 5)
    assert not teacher_satisfied(long_and_cold, CUPCAKES)
    assert not teacher_satisfied("Well done! 57 + 6 = 63.", CUPCAKES)  # warm but short
    assert teacher_satisfied(long_and_cold + " You're doing great, keep practising!", CUPCAKES)
    assert not is_warm("Great question! Let's break it down step by step.")  # eager, not encouraging


# --------------------------------------------------------------------------- replies and the rule judge

REQUESTS = ("corrections", "step_corrections", "repeated_corrections", "reasks", "topic_corrections",
            "result_corrections")  # -1, with a hint


def judged(text: str) -> tuple[int, list[str]]:
    """The rule judge's score and hints for a reply to an answer to CUPCAKES."""
    next_state = [{"role": "user", "content": text}]
    return rule_score(next_state, previous_user_text=CUPCAKES.question), rule_hints(next_state)


@pytest.mark.parametrize("persona", [STUDENT, TEACHER, STUDENT_STRICT], ids=lambda p: p.name)
@pytest.mark.parametrize("pool", ["pretraining", "evaluation"])
def test_the_rule_judge_reads_requests_as_a_person_means_them(persona: Persona, pool: str) -> None:
    requests: Requests = getattr(persona, pool)
    for kind in REQUESTS:
        for phrasing in getattr(requests, kind):
            text = phrasing.format(question=CUPCAKES.question if kind == "reasks" else STICKERS.question)
            score, hints = judged(text)
            assert score == -1 and hints, text


@pytest.mark.parametrize("persona", [STUDENT, TEACHER], ids=lambda p: p.name)
def test_moving_on_is_never_read_as_a_complaint(persona: Persona) -> None:
    for phrasing in (*persona.move_on_next, *persona.move_on_done):  # nothing said about the answer
        score, hints = judged(phrasing.format(question=STICKERS.question))
        assert score >= 0 and not hints, phrasing


def test_reactions_are_held_out_replies_chosen_by_their_labels() -> None:
    """Praise is what the corpus's readers scored +1, complaints -1 with no directive; none is in the tuning part."""
    reactions = held_out_reactions()
    held_out = load_part("held_out")
    tuning = {item.reply.lower() for item in load_part(TUNING)}
    assert reactions.praise and reactions.complaints

    def labelled(text: str, score: int, styles: tuple[str, ...]) -> bool:
        return any(item.reply == text and item.language == "en" and item.score == score and item.style in styles
                   and item.hint is None for item in held_out)

    assert all(labelled(text, 1, PRAISE_STYLES) and text.lower() not in tuning for text in reactions.praise)
    assert all(labelled(text, -1, COMPLAINT_STYLES) and text.lower() not in tuning for text in reactions.complaints)


# --------------------------------------------------------------------------- the session protocol


def session(persona: Persona = STUDENT, count: int = 2, seed: int = 0, **options: Any) -> UserSession:
    return UserSession(persona, problems(random.Random(seed), count), random.Random(seed), **options)


def test_satisfying_answers_get_thanks_and_the_next_problem_then_done() -> None:
    user = session()
    first, second = user.problems
    assert first.question in user.first_message()
    reply = user.react(render_plain(first, random.Random(0)))
    praise = held_out_reactions().praise
    assert not reply.done and any(reply.text == f"{said} {second.question}" for said in praise)
    reply = user.react(render_plain(second, random.Random(0)))
    assert reply.done and reply.text in praise
    assert user.first_attempts == [True, True] and user.satisfied


def test_an_unsatisfying_answer_is_corrected_and_the_rewrite_judged_again() -> None:
    user = session()
    first, second = user.problems
    user.first_message()
    complaint = user.react(render_ai(first, random.Random(0)))
    assert not complaint.done and second.question not in complaint.text
    assert rule_score([{"role": "user", "content": complaint.text}], first.question) == -1
    moved_on = user.react(render_plain(first, random.Random(0)))
    assert second.question in moved_on.text
    assert user.first_attempts == [False] and not user.satisfied  # the first answer needed a correction


def test_the_user_gives_up_after_the_retries_and_moves_on() -> None:
    user = session(max_retries=1)
    first, second = user.problems
    user.first_message()
    user.react(render_ai(first, random.Random(0)))
    gave_up = user.react(render_ai(first, random.Random(1)))
    assert not gave_up.done
    assert any(gave_up.text == f"{said} {second.question}" for said in held_out_reactions().complaints)


def test_the_turn_limit_ends_the_session() -> None:
    user = session(count=5, max_turns=3)
    user.first_message()
    replies = [user.react(render_ai(user.problem, random.Random(turn))) for turn in range(3)]
    assert [reply.done for reply in replies] == [False, False, True]
    assert user.turns == 3


def test_sessions_are_deterministic_given_the_seed() -> None:
    def transcript(seed: int) -> list[str]:
        user = session(seed=seed)
        said = [user.first_message()]
        for turn in range(3):
            reply = user.react(render_ai(user.problem, random.Random(turn)))
            said.append(reply.text)
            if reply.done:
                break
        return said

    assert transcript(3) == transcript(3) != transcript(4)


def test_the_next_problem_never_reads_as_the_last_one_asked_again() -> None:
    # Two problems from one template share most words; the rule judge would take the second for a
    # restatement of the first (a complaint) and punish an answer the user was happy with.
    chosen = problems(random.Random(5), 300)
    for asked, following in zip(chosen, chosen[1:]):
        praise = [{"role": "user", "content": f"thanks! next one: {following.question}"}]
        assert rule_score(praise, previous_user_text=asked.question) == 1, (asked.question, following.question)


# --------------------------------------------------------------------------- the LLM-driven voice


class ScriptedUserModel:
    """An OpenAI-compatible server that answers with scripted replies (or HTTP errors) in order."""

    def __init__(self) -> None:
        self.replies: deque[str | int] = deque()
        self.requests: list[dict[str, Any]] = []
        self.url = ""


@pytest.fixture
def user_model() -> Iterator[ScriptedUserModel]:
    model = ScriptedUserModel()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model.requests.append({**body, "_path": self.path, "_auth": self.headers.get("Authorization")})
            action = model.replies.popleft()
            status, payload = (
                (action, {"error": {"message": "scripted"}}) if isinstance(action, int)
                else (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": action}}]})
            )
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    model.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield model
    server.shutdown()
    server.server_close()


def test_llm_voice_words_the_reactions_and_code_supplies_the_questions(user_model: ScriptedUserModel) -> None:
    user_model.replies.extend([503, "ugh, too robotic. can you rewrite it without the bold?", "ok that's better, thanks!",
                               "great, that's it for today."])
    voice = LLMVoice(user_model.url, "user-sim", api_key="k")
    user = session(voice=voice)
    first, second = user.problems
    assert first.question in user.first_message()  # asking is left to code: no call
    assert user_model.requests == []

    complaint = user.react(render_ai(first, random.Random(0)))
    assert complaint.text == "ugh, too robotic. can you rewrite it without the bold?"
    assert len(user_model.requests) == 2  # the 503 was retried
    request = user_model.requests[-1]
    assert request["_path"] == "/v1/chat/completions" and request["_auth"] == "Bearer k" and request["model"] == "user-sim"
    system, prompt = request["messages"][0]["content"], request["messages"][1]["content"]
    assert STUDENT.character in system and STUDENT.preference in system
    assert "**Final answer**" in prompt and "rewrite" in prompt

    moved_on = user.react(render_plain(first, random.Random(0)))
    assert moved_on.text == f"ok that's better, thanks! {second.question}"
    done = user.react(render_plain(second, random.Random(0)))
    assert done.done and done.text == "great, that's it for today."
    assert user.first_attempts == [False, True]


def test_llm_voice_gives_up_loudly_when_the_endpoint_keeps_failing(user_model: ScriptedUserModel) -> None:
    user_model.replies.extend([500, 500])
    voice = LLMVoice(user_model.url, "user-sim", retries=2)
    user = session(voice=voice)
    user.first_message()
    with pytest.raises(RuntimeError, match="no reply"):
        user.react(render_ai(user.problem, random.Random(0)))


def test_a_plain_answer_that_skips_working_is_asked_for_every_step() -> None:
    user = session(seed=2)
    first = user.problems[0]
    user.first_message()
    reply = user.react("Okay, so the answer is " + first.answer + ".")
    assert not reply.done and "step" in reply.text and "bold" not in reply.text
    assert rule_score([{"role": "user", "content": reply.text}], first.question) == -1


# --------------------------------------------------------------------------- the noisy user


class RecordingVoice:
    """Records what the user means to say; draws nothing from the rng, so the protocol's draws alone decide."""

    def __init__(self) -> None:
        self.intents: list[str] = []

    def say(self, cue: Cue, rng: random.Random) -> str:
        self.intents.append(cue.intent.value)
        return cue.question or "..."


def played(persona: Persona, seed: int, **noise: float) -> tuple[list[str], list[bool]]:
    """The intents of a three-problem session answered in random styles, and its first attempts."""
    voice = RecordingVoice()
    user = session(persona, count=3, seed=seed, voice=voice, max_turns=8, max_retries=2, **noise)
    user.first_message()
    answers = random.Random(seed + 100)
    while True:
        render = answers.choice((render_ai, render_plain, render_warm))
        if user.react(render(user.problem, answers)).done:
            return voice.intents, user.first_attempts


# What the user meant to say in these sessions before the noise options existed: with every rate at
# 0 the protocol must not change, only the words.
# (A second complaint about one problem is worded as the first: the benchmark's user asks for one
# rewrite, so a "still not right" of its own was never said; issue 28.)
TIDY = {
    ("student", 0): "open correct correct praise_next praise_next correct praise_done",
    ("student", 3): "open reask praise_next praise_next correct correct praise_done",
    ("teacher", 1): "open praise_next reask correct give_up_next correct correct give_up_done",
    ("teacher", 2): "open correct correct give_up_next reask reask praise_next praise_done",
}


@pytest.mark.parametrize(("name", "seed"), list(TIDY))
def test_without_noise_the_protocol_is_the_tidy_users(name: str, seed: int) -> None:
    persona = {"student": STUDENT, "teacher": TEACHER}[name]
    intents, _ = played(persona, seed)
    assert " ".join(intents) == TIDY[(name, seed)]
    assert played(persona, seed, wrong_rate=0, quiet_rate=0, vague_rate=0, move_on_rate=0)[0] == intents


def test_a_quiet_user_says_nothing_when_satisfied() -> None:
    user = session(quiet_rate=1.0)
    first, second = user.problems
    user.first_message()
    reply = user.react(render_plain(first, random.Random(0)))
    assert not reply.done and reply.text in [p.format(question=second.question) for p in STUDENT.move_on_next]
    assert rule_score([{"role": "user", "content": reply.text}], first.question) >= 0
    done = user.react(render_plain(second, random.Random(0)))
    assert done.done and done.text in STUDENT.move_on_done and rule_score([{"role": "user", "content": done.text}]) >= 0
    assert user.first_attempts == [True, True]
    complaint = session(quiet_rate=1.0)
    complaint.first_message()
    assert not complaint.react(render_ai(first, random.Random(0))).text.startswith(second.question)  # still complains


def test_a_vague_user_complains_without_saying_why() -> None:
    user = session(vague_rate=1.0)
    first = user.problems[0]
    user.first_message()
    reply = user.react(render_ai(first, random.Random(0)))
    assert reply.text in held_out_reactions().complaints  # labelled -1 with no directive (above)
    assert user.first_attempts == [False]


def test_a_user_who_moves_on_never_complains() -> None:
    intents, first_attempts = played(TEACHER, 2, move_on_rate=1.0)
    assert intents[0] == "open" and set(intents[1:]) <= {"move_on_next", "move_on_done", "praise_next", "praise_done"}
    assert first_attempts == [False, False, False]  # one answer each: the user never asked for a rewrite
    user = session(move_on_rate=1.0)
    first, second = user.problems
    user.first_message()
    reply = user.react(render_ai(first, random.Random(0)))
    assert second.question in reply.text and rule_score([{"role": "user", "content": reply.text}], first.question) >= 0


def test_a_wrong_user_reacts_to_the_opposite_of_the_truth() -> None:
    user = session(wrong_rate=1.0)
    first, second = user.problems
    user.first_message()
    complaint = user.react(render_plain(first, random.Random(0)))  # satisfying, but the user complains
    assert second.question not in complaint.text
    assert rule_score([{"role": "user", "content": complaint.text}], first.question) == -1
    praise = user.react(render_ai(first, random.Random(0)))  # not satisfying, but the user is happy
    assert any(praise.text == f"{said} {second.question}" for said in held_out_reactions().praise)
    assert user.first_attempts == [True]  # what the benchmark scores is still the truth


def test_noise_is_deterministic_given_the_seed() -> None:
    noise = {"wrong_rate": 0.2, "quiet_rate": 0.3, "vague_rate": 0.3, "move_on_rate": 0.2}
    assert played(STUDENT, 5, **noise) == played(STUDENT, 5, **noise)


def test_the_scripted_voice_speaks_only_the_evaluation_pool() -> None:
    pretraining = {text.format(question="") for persona in (STUDENT, TEACHER)
                   for text in (*persona.pretraining.complaints(), *persona.pretraining_praise_next,
                                *persona.pretraining_praise_done)}
    rng = random.Random(0)
    for persona in PERSONAS.values():
        for intent in Intent:
            if intent is Intent.CORRECT_STEPS and not persona.evaluation.step_corrections:
                continue
            if intent is Intent.CORRECT_RESULT and not persona.evaluation.result_corrections:
                continue  # only the strict student checks the result
            for _ in range(10):
                assert ScriptedVoice().say(Cue(intent, persona, "", None), rng) not in pretraining


# --------------------------------------------------------------------------- correctness beside the style

CARDS = Problem(
    question="A shop puts 11 cards in every pack. How many cards are in 12 full packs?",
    steps=("Each pack has 11 cards.", "12 packs hold 12 × 11 = 132 cards."),
    answer="132 cards",
)


@pytest.mark.parametrize(
    ("answer", "about_it", "right"),
    [
        ("Each pack has 11 cards, so 12 packs hold 12 × 11 = 132 cards.", True, True),
        ("Each pack has 11 cards, so 12 packs hold 12 × 11 = 122 cards.", True, False),  # on topic, wrong sum
        ("So the answer is 132.", True, True),  # terse, but the question's answer
        ("2 × 2 + 2 × 6 = 22 m", False, False),  # seen after training in the demo: a perimeter, not the cards
        ("10 × 3 = 305. That gives 30.", False, False),
        ("There are 1,320 cards... no: 12 × 11 = 132.", True, True),
    ],
)
def test_an_answer_is_on_topic_when_it_uses_the_problems_numbers_and_right_when_it_ends_on_the_result(
    answer: str, about_it: bool, right: bool
) -> None:
    assert on_topic(answer, CARDS) is about_it
    assert result_correct(answer, CARDS) is right


def test_no_user_is_satisfied_by_a_stylish_answer_to_another_problem_and_each_says_so() -> None:
    off_topic = "First, 4 + 5 = 9. Then 9 × 2 = 18. So the answer is 18."  # plain, every step: the student's style
    assert student_satisfied(off_topic, CARDS) and not satisfies(STUDENT, off_topic, CARDS)
    for persona in PERSONAS.values():
        user = UserSession(persona, [CARDS, CUPCAKES], random.Random(0))
        user.first_message()
        reply = user.react(off_topic)
        assert not reply.done and reply.text in [text.format(question=CARDS.question)
                                                 for text in persona.evaluation.topic_corrections]
        assert CARDS.question in reply.text and user.first_attempts == [False]


def test_the_strict_student_wants_the_style_and_the_right_result() -> None:
    wrong = "Each pack has 11 cards. So 12 packs hold 12 × 11 = 122 cards."
    right = "Each pack has 11 cards. So 12 packs hold 12 × 11 = 132 cards."
    assert STUDENT.satisfied(wrong, CARDS) and not STUDENT_STRICT.satisfied(wrong, CARDS)
    assert STUDENT_STRICT.satisfied(right, CARDS)
    user = UserSession(STUDENT_STRICT, [CARDS, CUPCAKES], random.Random(0))
    user.first_message()
    complaint = user.react(wrong)
    assert complaint.text in STUDENT_STRICT.evaluation.result_corrections and user.first_attempts == [False]
    assert user.react(right).text.endswith(CUPCAKES.question)  # satisfied: thanks, then the next problem
    # the strict student is no pre-training persona: the tiny model's corpus is what it was
    assert STUDENT_STRICT.pretraining == STUDENT.pretraining and not STUDENT.evaluation.result_corrections
