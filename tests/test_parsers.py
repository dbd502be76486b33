"""Base Parser, message helpers, extract functions; every parser never raises on arbitrary input."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessage

import vfkit.parsers.parser as parser_module
import vfkit.parsers.utils as utils_module
from vfkit.parsers.parser import Parser, message_text
from vfkit.parsers.think_parser import MaybeThinkParser, ThinkParser
from vfkit.parsers.utils import extract_boxed_answer, extract_last_number, final_number
from vfkit.parsers.xml_parser import XMLParser

CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "first"},
    {"role": "tool", "content": "4", "tool_call_id": "c1"},
    {"role": "assistant", "content": "last"},
]


def test_parse_is_identity_by_default_and_applies_extract_fn():
    assert Parser().parse(" x ") == " x "
    assert Parser(extract_fn=str.strip).parse(" x ") == "x"


def test_parse_answer_reads_last_assistant_message():
    assert Parser().parse_answer(CHAT) == "last"


def test_parse_answer_in_completion_mode_parses_the_string():
    assert Parser(extract_fn=str.upper).parse_answer("abc") == "ABC"


def test_parse_answer_without_assistant_message_is_none():
    assert Parser().parse_answer([{"role": "user", "content": "hi"}]) is None
    assert Parser().parse_answer([]) is None


def test_role_getters_split_a_chat():
    p = Parser()
    assert [m["content"] for m in p.get_assistant_messages(CHAT)] == ["first", "last"]
    assert [m["content"] for m in p.get_system_messages(CHAT)] == ["be brief"]
    assert [m["content"] for m in p.get_user_messages(CHAT)] == ["2+2?"]
    assert [m["content"] for m in p.get_tool_messages(CHAT)] == ["4"]
    assert p.get_assistant_messages("plain text") == []


def test_messages_may_be_openai_objects_and_content_lists():
    obj = ChatCompletionMessage(role="assistant", content="from pydantic")
    assert Parser().parse_answer([obj]) == "from pydantic"
    parts = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
    parts["content"].append({"type": "text", "text": "b"})
    assert message_text(parts) == "ab"
    assert message_text({"role": "assistant", "content": None}) == ""


def test_base_format_reward_is_one_per_text_message_and_zero_without_any():
    reward = Parser().get_format_reward_func()
    assert reward.__name__ == "format_reward_func"
    assert reward(completion=CHAT) == 1.0
    assert reward(completion=[{"role": "user", "content": "hi"}]) == 0.0
    tool_only = {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}
    # the tool-only turn is skipped: mean over the one text turn = 1.0
    assert reward(completion=[tool_only, {"role": "assistant", "content": "x"}]) == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"the answer is \boxed{42}", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # the last box wins
        (r"\boxed{ {a}{b} }", "{a}{b}"),  # nested braces kept, outer space stripped
        (r"\boxed{7} and a cut-off \boxed{\frac{1", "7"),  # unbalanced last box: earlier one
        ("no box here", "no box here"),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("3 then -4.5.", "-4.5"), ("1, 2", "2"), ("x2y", "2"), ("none", None), ("", None),
     (None, None)],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


def test_final_number_reads_the_last_turn_with_text_tagged_first():
    parser = XMLParser(["answer"])
    tool_only = {"role": "assistant", "content": None, "tool_calls": []}  # a turn with no text
    parts = {"role": "assistant", "content": [{"type": "text", "text": "3 gives <answer>7.5"}]}
    assert final_number(parser, [parts, tool_only]) == "7.5"  # content parts, tool turn skipped
    untagged = {"role": "assistant", "content": "3 then 4"}
    assert final_number(parser, [parts, untagged]) == "4"  # the last turn with text decides
    assert final_number(parser, [{"role": "assistant", "content": "<answer>no</answer> 5"}]) is None
    assert final_number(parser, [{"role": "user", "content": "9"}]) is None
    assert final_number(parser, []) is None
    coded = XMLParser(["reasoning", "code"], answer_field="code")
    assert final_number(coded, "<reasoning>1</reasoning><code>x = 2</code> 3") == "2"


@pytest.mark.parametrize("module", [parser_module, utils_module])
def test_docstring_examples_run(module):
    assert doctest.testmod(module).failed == 0


# --- every parser, arbitrary input: never raises -------------------------------------------

PARSERS = [
    Parser(),
    XMLParser(["think", ("answer", "final")]),
    XMLParser(["reasoning", "code"], answer_field="code"),
    ThinkParser(),
    ThinkParser(extract_fn=extract_boxed_answer),
    MaybeThinkParser(),
    MaybeThinkParser(extract_fn=extract_boxed_answer),
]
FRAGMENTS = ["<think>", "</think>", "<answer>", "</answer>", "<final>", "</final>", "<code>"]
FRAGMENTS += ["</code>", "\\boxed{", "{", "}", "\n", " ", "42", "<", ">", "/"]
tagged_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=12).map(
    "".join
)
any_text = st.one_of(st.text(), tagged_text)
content = st.one_of(
    any_text,
    st.none(),
    st.integers(),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": any_text})),
)
tool_call = st.fixed_dictionaries(
    {"id": st.text(max_size=3), "function": st.fixed_dictionaries({"name": st.text(max_size=5)})}
)
message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["assistant", "user", "system", "tool"]), "content": content},
        optional={"tool_calls": st.one_of(st.none(), st.lists(tool_call, max_size=2))},
    ),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    st.text(max_size=5),
    st.none(),
)
messages = st.lists(message, max_size=6)


@settings(max_examples=150, deadline=None)
@given(text=any_text)
def test_parsers_never_raise_on_arbitrary_text(text):
    for p in PARSERS:
        p.parse(text)
        p.parse_answer(text)
        score = p.get_format_reward_func()(completion=text)
        assert 0.0 <= score <= 1.0


@settings(max_examples=150, deadline=None)
@given(completion=messages)
def test_parsers_never_raise_on_arbitrary_message_lists(completion):
    for p in PARSERS:
        answer = p.parse_answer(completion)
        assert answer is None or isinstance(answer, str)
        score = p.get_format_reward_func()(completion=completion)
        assert 0.0 <= score <= 1.0
