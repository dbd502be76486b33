"""XMLParser: fields with alternatives, first/last occurrence, format, format reward."""

from __future__ import annotations

import doctest
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import vfkit.parsers.xml_parser as xml_module
from vfkit.parsers.xml_parser import XMLParser


@pytest.fixture
def parser() -> XMLParser:
    return XMLParser(["think", ("answer", "final")])


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_parse_reads_each_field_and_none_when_absent(parser):
    parsed = parser.parse("<think>\n  because  \n</think>")
    assert parsed.think == "because"
    assert parsed.answer is None


def test_alternative_tag_fills_the_canonical_attribute(parser):
    parsed = parser.parse("<final>7</final>")
    assert parsed.answer == "7"
    assert not hasattr(parsed, "final")


def test_first_occurrence_by_default_last_on_request(parser):
    text = "<answer>1</answer> <final>2</final> <answer>3</answer>"
    assert parser.parse(text).answer == "1"
    assert parser.parse(text, last=True).answer == "3"


def test_strip_false_keeps_whitespace(parser):
    assert parser.parse("<answer> 5 </answer>", strip=False).answer == " 5 "


def test_unclosed_field_is_absent(parser):
    assert parser.parse("<answer>cut off").answer is None


def test_parse_answer_takes_last_message_with_the_answer_field(parser):
    chat = [
        assistant("<answer>old</answer>"),
        {"role": "user", "content": "<answer>user text is ignored</answer>"},
        assistant("<answer>a</answer><answer>b</answer>"),
        assistant("<think>no answer in the final turn</think>"),
    ]
    assert parser.parse_answer(chat) == "b"  # last message with an answer, last occurrence
    assert parser.parse_answer("<final>x</final>") == "x"
    assert parser.parse_answer([assistant("none")]) is None


def test_custom_answer_field():
    p = XMLParser(["reasoning", "code"], answer_field="code")
    assert p.parse_answer([assistant("<reasoning>r</reasoning><code>print(1)</code>")]) == (
        "print(1)"
    )


def test_format_renders_in_declared_order_and_accepts_alternatives(parser):
    assert parser.format(answer="4", think="2+2") == (
        "<think>\n2+2\n</think>\n<answer>\n4\n</answer>"
    )
    assert parser.format(final="4") == "<final>\n4\n</final>"
    assert parser.parse(parser.format(think="t", answer="a")).answer == "a"


def test_format_rejects_unknown_fields(parser):
    with pytest.raises(ValueError, match="unknown field"):
        parser.format(answr="4")


def test_format_str_and_fields(parser):
    assert parser.get_fields() == ["think", "answer"]
    assert (
        parser.get_format_str()
        == "<think>\n...\n</think>\n<[answer | final]>\n...\n</[answer | final]>"
    )


@pytest.mark.parametrize(
    "fields",
    [[], "think", ["think", "think"], ["think", ("answer", "think")], ["a b"], [()]],
)
def test_bad_field_specs_raise(fields):
    with pytest.raises(ValueError, match="XMLParser"):
        XMLParser(fields)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>t</think>\n<answer>a</answer>", 1.0),  # 2 of 2 fields
        ("<think>t</think><final>a</final>", 1.0),  # alternative name counts
        ("<answer>a</answer>", 0.5),  # 1 of 2 fields
        ("plain text", 0.0),  # 0 of 2
        ("<answer>x</think>", 0.0),  # mismatched closing tag
        ("<answer>x</final>", 0.0),  # closed with another alternative
        ("<think>t</think><answer>a", 0.0),  # unclosed
        ("</think><answer>a</answer>", 0.0),  # closing tag without opening
        ("<think>t <answer>a</answer></think>", 0.0),  # nested
        ("<answer>a</answer><answer>b</answer>", 0.0),  # repeated field
        ("<answer>a</answer><think>t</think>", 0.0),  # out of order
        ("<answer>a</answer><final>b</final>", 0.0),  # same field twice via alternatives
    ],
)
def test_format_score(parser, text, score):
    assert parser.format_score(text) == score


def test_format_reward_averages_assistant_text_turns(parser):
    reward = parser.get_format_reward_func()
    chat = [
        assistant("<think>t</think><answer>a</answer>"),  # 1.0
        {"role": "user", "content": "<answer>x</think>"},  # not scored: user turn
        assistant("<answer>a</answer>"),  # 0.5
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},  # skipped: tools only
        assistant("<answer>x</think>"),  # 0.0
    ]
    assert reward(completion=chat) == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert reward(completion="<answer>a</answer>") == 0.5


def test_docstring_examples_run():
    assert doctest.testmod(xml_module).failed == 0


@settings(max_examples=100, deadline=None)
@given(think=st.text(), answer=st.text())
def test_format_then_parse_round_trips_tag_free_values(think, answer):
    parser = XMLParser(["think", "answer"])
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    assume(not any(tag in value for value in (think, answer) for tag in tags))
    parsed = parser.parse(parser.format(think=think, answer=answer))
    assert parsed.think == think.strip()
    assert parsed.answer == answer.strip()
    assert parser.format_score(parser.format(think=think, answer=answer)) == 1.0


def test_answer_field_must_be_one_of_the_fields():
    with pytest.raises(ValueError, match=re.escape(
        "XMLParser: answer_field 'answer' is not one of the fields ['reasoning', 'final_answer']; "
        "pass answer_field=<the field holding the answer>, e.g. XMLParser(['reasoning', "
        "'final_answer'], answer_field='final_answer')"
    )):
        XMLParser(["reasoning", "final_answer"])  # answer_field defaults to "answer"
    with pytest.raises(ValueError, match="answer_field 'final'"):
        XMLParser(["think", "answer"], answer_field="final")


def test_an_alternative_name_as_answer_field_reads_its_field():
    parser = XMLParser(["think", ("answer", "final")], answer_field="final")
    reply = [{"role": "assistant", "content": "<think>t</think><final>42</final>"}]
    assert parser.answer_field == "answer" and parser.parse_answer(reply) == "42"
    assert XMLParser(["reasoning", "final_answer"], answer_field="final_answer").parse_answer(
        [{"role": "assistant", "content": "<final_answer>7</final_answer>"}]) == "7"
