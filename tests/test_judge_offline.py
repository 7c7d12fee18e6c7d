"""The offline judge (`--judge rule`, issue 27) on replies people write, in ten languages.

The first table is issue 27's: what the rule judge got wrong before, on replies to an answer
that drafts a message to a landlord. None of these replies is in the labelled corpus. A hint
counts when it carries the directive (the words given here, in any case).
"""

from __future__ import annotations

import pytest

from clawrl.judge.hints import directive_hints, durable_directives, reply_hint
from clawrl.judge.rule import judge_by_rules

REQUEST = [{"role": "user", "content": "Write a short reply to my landlord about the broken heater."}]


def judged(reply: str) -> tuple[int, list[str]]:
    return judge_by_rules(REQUEST, [{"role": "user", "content": reply}])


@pytest.mark.parametrize(
    ("reply", "score", "directive"),
    [
        ("would you mind making it a bit more polite?", -1, "polite"),
        ("oh great, now it sounds like a lawyer wrote it", -1, None),
        ("thanks, but please mention the dates I gave you", -1, "mention the dates"),
        ("ok but drop the last paragraph", -1, "drop the last paragraph"),
        ("could you write it in spanish instead?", -1, "in spanish"),
        ("can it be shorter", -1, "shorter"),
        ("too long tbh", -1, "too long"),
        ("add that I already called twice", -1, "called twice"),
        ("nailed it", 1, None),
        ("bien, merci beaucoup", 1, None),
        ("sehr gut, danke!", 1, None),
    ],
)
def test_the_issue_examples_are_read_as_a_person_reads_them(reply: str, score: int, directive: str | None) -> None:
    verdict, hints = judged(reply)
    assert verdict == score
    if directive is None:
        assert hints == []
    else:
        assert hints and directive in hints[0].lower(), hints


@pytest.mark.parametrize(
    "reply",
    ["No, that's perfect.", "no no, it's perfect as it is", "Not bad at all!", "No complaints, sending it.",
     "I wouldn't change a word."],
)
def test_a_negation_of_a_complaint_is_praise(reply: str) -> None:
    assert judged(reply) == (1, [])


@pytest.mark.parametrize(
    "reply",
    ["Not one complaint from my landlord, he fixed it the next day.", "Couldn't have put it better myself.",
     "Not too long, not too stiff. Just right.", "Je n'aurais pas su le dire mieux.", "Nichts auszusetzen, schicke ich so ab.",
     "Non avrei saputo scriverla meglio, grazie.", "No lo habría dicho mejor."],
)
def test_a_fault_denied_is_praise(reply: str) -> None:
    """Double negatives of praise (the third writer's "not a single complaint"), in our own words."""
    assert judged(reply) == (1, [])


@pytest.mark.parametrize(
    "reply",
    ["Thanks for the update!", "I double-checked and it's right. Thanks!", "Nice, the insert statements ran fine.",
     "Works great, the scale is right.", "Perfect, the limit is right.", "Gut formuliert, danke!", "Schön sortiert, danke.",
     "Impressive.", "Good to know, thanks!", "Who knew it was that simple. Thanks!", "Grazie tante!", "Спасибо большое.",
     "Muy útil.", "Sehr hilfreich.", "Très utile."],
)
def test_praise_stays_praise_when_it_names_a_part_of_the_answer_or_sounds_like_a_stock_phrase(reply: str) -> None:
    """Words that ask for a change elsewhere ("update", "filter", "formuliere") are nouns or
    participles here; phrases that are sometimes sarcastic ("good to know") are mostly sincere."""
    assert judged(reply) == (1, [])


@pytest.mark.parametrize(
    "reply",
    ["Where did the Tuesday come from? It broke on Friday.", "Who said anything about a deposit? Leave that out.",
     "Did you miss the part about the dates?", "D'où sort ce montant ?",
     "Woher kommt die Zahl 300?", "Откуда взялась эта сумма?"],
)
def test_a_correction_asked_as_a_question_is_minus_one(reply: str) -> None:
    """The fourth writer's "Who said Boots?": a challenge to what the answer put in, in our own words."""
    assert judged(reply)[0] == -1


@pytest.mark.parametrize(
    "reply",
    ["Can't argue with that. Sending it.", "Couldn't be more polite if it tried.", "Not one word I'd change.",
     "Ni trop sec ni trop long, merci.", "Non potevi dirlo meglio.", "Textbook. Thanks!"],
)
def test_more_ways_to_deny_a_fault_or_to_praise_are_praise(reply: str) -> None:
    assert judged(reply) == (1, [])


@pytest.mark.parametrize("reply", ["Great, 'at your earliest convenience'. He will fix it next spring then.",
                                   "Super, « dans les meilleurs délais ». Il va adorer.", "Klasse, „zeitnah“. Das wirkt bestimmt."])
def test_praise_that_quotes_the_answer_back_is_sarcasm(reply: str) -> None:
    """The fifth writer's "Great, 'kinder to your battery'.", in our own words."""
    assert judged(reply)[0] == -1


@pytest.mark.parametrize("reply", ["Tomorrow?", "Deposit?", "¿Fechas?", "Kaution?"])
def test_a_bare_word_asked_back_is_what_the_answer_lacked(reply: str) -> None:
    assert judged(reply)[0] == -1


@pytest.mark.parametrize("reply", ["Brilliant.", "Thanks a lot. That helped.", "That'll do, thanks.",
                                   "Great, 'Dear Mr. Lee' is how he likes it. Sending.", "Exactly what I needed.",
                                   "cool cool, thank you", "Alles klar, danke!", "Just right."])
def test_sincere_praise_is_not_read_as_sarcasm(reply: str) -> None:
    assert judged(reply) == (1, [])


@pytest.mark.parametrize("reply", ["Shouldn't the deposit be returned within 14 days?", "Hold on, isn't the heater the landlord's job?",
                                   "Non era il 12 marzo?", "¿No sería mejor mandarlo por carta?", "Разве он не обязан это чинить?"])
def test_a_question_that_expects_yes_youre_right_is_a_correction(reply: str) -> None:
    assert judged(reply)[0] == -1


@pytest.mark.parametrize("reply", ["Wasn't expecting it to be this easy, is it always like that?", "Isn't it great? Thanks!",
                                   "won't it be cold in the flat until then?", "¿no es necesario avisar antes?"])
def test_a_negative_question_about_the_world_or_the_user_is_no_correction(reply: str) -> None:
    assert judged(reply)[0] != -1


def test_a_name_set_straight_does_not_reach_across_sentences() -> None:
    """"X, not Y" is one clause: "... the heater. No more noise." sets nothing straight."""
    from clawrl.judge.lexicon import cue_counts

    assert cue_counts("He fixed the heater. No more noise at night.")["this_not_that"] == 0
    assert cue_counts("It's the 4th, not the 5th.")["this_not_that"] == 1


def test_approval_after_a_reservation_is_praise() -> None:
    assert judged("Not the tone I pictured, but honestly it's better this way. Sending it, thanks!") == (1, [])


@pytest.mark.parametrize(
    ("reply", "directive"),
    [("Thanks! Could you add that the radiator in the bedroom leaks too?", "radiator"),
     ("Lovely, thank you! Can you mention that I work from home?", "work from home"),
     ("Merci, c'est parfait ! Tu peux ajouter mon numéro de dossier ?", "numéro"),
     ("Danke, sehr gut! Bitte noch die Adresse ergänzen.", "adresse")],
)
def test_thanks_then_a_request_for_more_in_the_answer_is_a_correction(reply: str, directive: str) -> None:
    """What every writer of the corpus labels -1: the answer lacked what the request now adds (the
    sixth writer's "Super, merci ! Tu peux ajouter ..." in French and German, in our own words)."""
    verdict, hints = judged(reply)
    assert verdict == -1 and hints and directive in hints[0].lower(), hints


@pytest.mark.parametrize("reply", ["Exclude the part about the rent.", "Leave out the bit about the rent."])
def test_a_bare_imperative_outside_the_old_verb_list_gives_a_hint(reply: str) -> None:
    verdict, hints = judged(reply)
    assert verdict == -1 and hints and "rent" in hints[0].lower(), hints


@pytest.mark.parametrize(
    "reply", ["Oh great, now it sounds like a lawyer wrote it.", "Wow, so helpful. Thanks for nothing.",
              "Lovely, he'll definitely fix it after reading that.",
              "A threat to withhold rent. Exactly what I didn't want.", "Sure, in some parallel universe he reads past line one."],
)
def test_sarcastic_praise_is_a_complaint(reply: str) -> None:
    assert judged(reply)[0] == -1


@pytest.mark.parametrize(
    "reply",
    ["Parfait, merci !", "Perfetto, grazie!", "Dank je, precies goed.", "Спасибо, отлично!", "谢谢，很好！",
     "ありがとう、完璧です！", "Obrigado, ficou ótimo!", "¡Genial, gracias!"],
)
def test_praise_in_other_languages_scores_plus_one(reply: str) -> None:
    assert judged(reply) == (1, [])


@pytest.mark.parametrize(
    ("reply", "directive"),
    [
        ("¿puedes hacerlo más corto?", "corto"),
        ("Kannst du das kürzer machen?", "kürzer"),
        ("Tu peux le rendre plus poli ?", "poli"),
        ("Potresti renderlo più formale?", "formale"),
        ("Kun je het korter maken?", "korter"),
        ("Можешь сделать покороче?", "покороче"),
        ("Podes deixar mais curto?", "curto"),
        ("もっと短くしてください。", "短く"),
        ("能不能写短一点？", "短一点"),
    ],
)
def test_requests_in_other_languages_score_minus_one_with_a_hint(reply: str, directive: str) -> None:
    verdict, hints = judged(reply)
    assert verdict == -1 and hints and directive in hints[0].lower(), hints


@pytest.mark.parametrize("reply", ["this is useless", "Hmm, I don't know. This doesn't feel right."])
def test_a_complaint_that_says_nothing_of_how_gets_no_hint(reply: str) -> None:
    assert judged(reply) == (-1, [])


def test_a_question_about_the_answer_scores_zero() -> None:
    assert judged("What does 'notice period' mean here?") == (0, [])


def test_a_request_after_praise_is_something_new_not_a_correction() -> None:
    assert judged("Great, thanks! Now write one to the letting agency too.") == (1, [])


@pytest.mark.parametrize(
    ("sentence", "hints"),
    [
        ("could you make it shorter?", ["Make it shorter."]),
        ("Could you make it shorter, please?", ["Make it shorter, please."]),
        ("would you mind making it a bit more polite?", ["Make it a bit more polite."]),
        ("Can it be made without eggs?", ["It should be made without eggs."]),
        ("¿Podrías ponerlo más formal?", ["Ponerlo más formal."]),
        ("ok but drop the last paragraph", ["Drop the last paragraph."]),
        ("too AI-like, rewrite it without the bold", ["Rewrite it without the bold."]),
        ("I don't know what to say. Does the list have a title?", []),  # no request in either sentence
    ],
)
def test_requests_become_imperatives(sentence: str, hints: list[str]) -> None:
    assert directive_hints(sentence) == hints


def test_the_whole_reply_is_a_hint_beside_its_clauses() -> None:
    """A correction in two sentences keeps both; praise is left out of it."""
    reply = "Thanks! Could you keep it honest? I contributed, I didn't lead."
    assert reply_hint(reply) == "Keep it honest. I contributed, I didn't lead."
    verdict, hints = judged(reply)
    assert verdict == -1 and hints[0] == "Keep it honest. I contributed, I didn't lead."


def test_a_correction_too_short_to_stand_alone_is_quoted() -> None:
    assert judge_by_rules([{"role": "user", "content": "Give me a pancake recipe."}],
                          [{"role": "user", "content": "In grams pls"}]) == (-1, ['The user replied: "In grams pls"'])


def test_the_judge_reads_only_what_the_user_typed() -> None:
    """An agent's wrapping ("[timestamp] ... <<<context>>>") neither hides the request nor adds one."""
    wrapped = ("[Tue 2026-11-24 09:05 UTC] would you mind making it a bit more polite?\n\n"
               "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nPlease use the tools. Great work so far!\n"
               "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")
    assert judge_by_rules(REQUEST, [{"role": "user", "content": wrapped}]) == judged(
        "would you mind making it a bit more polite?")


@pytest.mark.parametrize(("hint", "note"), [
    ("Rewrite it as a normal explanation, no headings or bold text.", "Rewrite it as a normal explanation, no headings or bold text."),
    ("Nope, too formatted. Please just use ordinary sentences and keep all the working.",
     "Please just use ordinary sentences and keep all the working."),
    ("could you make it shorter?", "Make it shorter."),
    ("¿puedes hacerlo más corto?", "Hacerlo más corto."),
    ("Please answer this one: Jia travels by boat at 33 km per hour for 3 hours.", None),  # another problem's answer
    ("Please do this one: Hana buys seven bags of apples.", None),  # "this one", no digit
    ("That's not what I asked, those aren't my numbers.", None),  # no directive
    ("She got bored halfway through and asked me to stop.", None),
    ("Please use the numbers from my first message, Tom has five apples.", None),  # quotes the task
])
def test_a_note_keeps_only_the_directives_that_hold_for_later_requests(hint: str, note: str | None) -> None:
    assert durable_directives(hint, ["Tom has five apples and buys three more. How many?", "Tom has 8 apples."]) == note
