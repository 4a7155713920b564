"""Label syntax and the selector grammar (pure): tables, and properties of parse and print."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronman.errors import InvalidInput
from cronman.model.labels import Op, Requirement, Selector, key_error, labels_error, parse_selector, value_error


@pytest.mark.parametrize(
    "key", ["team", "a", "A1", "x_y.z-w", "example.com/team", "a.b-c.d/e", "1/2", "a" * 63, "b" * 253 + "/" + "c" * 63]
)
def test_good_keys(key: str) -> None:
    assert key_error(key) is None


@pytest.mark.parametrize(
    "key", ["", "-a", "a-", "a b", "a" * 64, "A.com/x", "a..b/x", "a/b/c", "/x", "x/", "é", "b" * 254 + "/c"]
)
def test_bad_keys(key: str) -> None:
    assert key_error(key)


@pytest.mark.parametrize("value", ["", "prod", "v1.2_3-x", "a" * 63])
def test_good_values(value: str) -> None:
    assert value_error(value) is None


@pytest.mark.parametrize("value", ["-a", "a b", "a/b", "a" * 64, "\x00"])
def test_bad_values(value: str) -> None:
    assert value_error(value)


def test_at_most_64_labels() -> None:
    assert labels_error({f"k{i}": "" for i in range(64)}) is None
    assert labels_error({f"k{i}": "" for i in range(65)}) == ("at most 64 labels (got 65)", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team=payments", [Requirement("team", Op.EQ, ("payments",))]),
        ("team==payments", [Requirement("team", Op.EQ, ("payments",))]),
        ("env!=dev", [Requirement("env", Op.NE, ("dev",))]),
        ("env=", [Requirement("env", Op.EQ, ("",))]),
        ("tier in (a, b ,a)", [Requirement("tier", Op.IN, ("a", "b"))]),
        ("tier notin (a)", [Requirement("tier", Op.NOT_IN, ("a",))]),
        ("tier in ()", [Requirement("tier", Op.IN, ("",))]),
        ("tier", [Requirement("tier", Op.EXISTS)]),
        ("! tier", [Requirement("tier", Op.NOT_EXISTS)]),
        (
            "a=1,b!=2, c in (3),!d,e",
            [
                Requirement("a", Op.EQ, ("1",)),
                Requirement("b", Op.NE, ("2",)),
                Requirement("c", Op.IN, ("3",)),
                Requirement("d", Op.NOT_EXISTS),
                Requirement("e", Op.EXISTS),
            ],
        ),
        ("   ", []),
    ],
)
def test_parse(text: str, expected: list[Requirement]) -> None:
    assert parse_selector(text) == Selector(tuple(expected))


@pytest.mark.parametrize("text", ["a=b=c", "a b", "a in b", "a in (b", "a in (b c)", ",", "a,", "!a=b", "(a)", "a=(b)"])
def test_parse_errors(text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_selector(text)
    assert err.value.code == "invalid_selector" and err.value.field == "selector"
    assert err.value.message.startswith("selector: ")


@pytest.mark.parametrize(
    ("requirement", "labels", "matches"),
    [
        (Requirement("a", Op.EQ, ("1",)), {"a": "1"}, True),
        (Requirement("a", Op.EQ, ("1",)), {}, False),
        (Requirement("a", Op.NE, ("1",)), {}, True),
        (Requirement("a", Op.NE, ("1",)), {"a": "1"}, False),
        (Requirement("a", Op.IN, ("1", "2")), {"a": "2"}, True),
        (Requirement("a", Op.NOT_IN, ("1", "2")), {"a": "3"}, True),
        (Requirement("a", Op.NOT_IN, ("1", "2")), {}, True),
        (Requirement("a", Op.EXISTS), {"a": ""}, True),
        (Requirement("a", Op.NOT_EXISTS), {"a": ""}, False),
    ],
)
def test_matches(requirement: Requirement, labels: dict[str, str], matches: bool) -> None:
    assert requirement.matches(labels) is matches


names = st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?\Z")
# a prefix is a DNS subdomain: every part between dots starts and ends with a letter or digit
prefixes = names.map(str.lower).filter(lambda n: key_error(f"{n}.io/x") is None)
keys = st.one_of(names, st.builds(lambda p, n: f"{p}.io/{n}", prefixes, names))
values = st.one_of(st.just(""), names)
requirements = st.one_of(
    st.builds(lambda k, v, op: Requirement(k, op, (v,)), keys, values, st.sampled_from([Op.EQ, Op.NE])),
    st.builds(
        lambda k, vs, op: Requirement(k, op, tuple(dict.fromkeys(vs))),
        keys,
        st.lists(values, min_size=1, max_size=4),
        st.sampled_from([Op.IN, Op.NOT_IN]),
    ),
    st.builds(lambda k, op: Requirement(k, op), keys, st.sampled_from([Op.EXISTS, Op.NOT_EXISTS])),
)


@given(st.lists(requirements, min_size=1, max_size=5).map(lambda rs: Selector(tuple(rs))))
def test_a_printed_selector_parses_back_to_itself(selector: Selector) -> None:
    assert parse_selector(str(selector)) == selector


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_with_a_message(text: str) -> None:
    try:
        parse_selector(text)
    except InvalidInput as exc:
        assert exc.code == "invalid_selector" and exc.message
