"""SamplingParams validation and normalisation."""

from __future__ import annotations

from typing import Any

import pytest

from surge.sampling_params import SamplingParams


def test_defaults_are_valid() -> None:
    p = SamplingParams()
    assert p.n == 1 and p.temperature == 1.0 and p.max_tokens == 16
    assert p.stop == () and p.stop_token_ids == ()
    assert not p.is_greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("n", 1.5),
        ("n", True),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_k", -2),
        ("top_k", 2.0),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("seed", 1.0),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.01),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("stop", ""),
        ("stop", ["ok", ""]),
        ("stop", [3]),
        ("stop", 5),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [1.5]),
        ("stop_token_ids", "12"),
        ("logprobs", -1),
        ("logprobs", 21),
        ("ignore_eos", 1),
    ],
)
def test_bad_field_raises_value_error_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_rejected() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4
    assert SamplingParams(max_tokens=None, min_tokens=1000).max_tokens is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": 0},
        {"top_k": -1},
        {"top_p": 1.0},
        {"min_p": 1.0},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"repetition_penalty": 0.01},
        {"logprobs": 0},
        {"logprobs": 20},
        {"seed": -7},
        {"temperature": 0.0},
    ],
)
def test_boundary_values_accepted(kwargs: dict[str, Any]) -> None:
    SamplingParams(**kwargs)


def test_stop_normalised_to_tuples() -> None:
    assert SamplingParams(stop="END").stop == ("END",)  # type: ignore[arg-type]
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")  # type: ignore[arg-type]
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # type: ignore[arg-type]


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert SamplingParams(temperature=1e-7).is_greedy  # too small to divide by safely
    assert not SamplingParams(temperature=0.7, top_k=2).is_greedy


def test_frozen() -> None:
    p = SamplingParams()
    with pytest.raises(AttributeError):
        p.n = 2  # type: ignore[misc]
