"""Prompts: exact token lengths with the real SmolLM2 tokenizer, shared prefixes, mixes, files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from surge.bench.client import build_request
from surge.bench.config import BenchConfig, LengthDist, WorkloadConfig, parse_tenants
from surge.bench.workload import Prompt, load_trace, prompts, sample_lengths


@pytest.fixture(scope="module")
def tokenizer_path(tiny_model_dir: Path) -> str:
    return str(tiny_model_dir / "tokenizer.json")


def take(config: WorkloadConfig, n: int, seed: int = 0) -> list[Prompt]:
    return list(itertools.islice(prompts(config, seed), n))


def count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    assert sample_lengths(LengthDist("fixed", 7), rng, 3) == [7, 7, 7]
    u = np.array(sample_lengths(LengthDist("uniform", 10, 20), rng, 20_000))
    assert u.min() == 10 and u.max() == 20 and u.mean() == pytest.approx(15, rel=0.01)
    n = np.array(sample_lengths(LengthDist("normal", 200, 30), rng, 20_000))
    assert n.mean() == pytest.approx(200, rel=0.01) and n.std() == pytest.approx(30, rel=0.03)
    ln = np.array(sample_lengths(LengthDist("lognormal", 100, 0.5), rng, 50_000))
    assert ln.mean() == pytest.approx(100, rel=0.02) and ln.min() >= 1


def test_exact_token_lengths_with_the_tokenizer(tokenizer_path: str) -> None:
    tok = Tokenizer.from_file(tokenizer_path)
    config = WorkloadConfig(
        input_len=LengthDist("uniform", 1, 300), output_len=LengthDist("uniform", 4, 9),
        tokenizer_path=tokenizer_path,
    )  # fmt: skip
    ps = take(config, 60)
    assert len({p.input_len for p in ps}) > 30
    for p in ps:
        assert count(tok, p.full_text) == p.input_len == p.num_prompt_tokens
        assert 4 <= p.max_tokens <= 9


def test_without_a_tokenizer_a_word_is_a_token() -> None:
    ps = take(WorkloadConfig(input_len=LengthDist("fixed", 50)), 5)
    assert all(len(p.full_text.split()) == 50 and p.num_prompt_tokens is None for p in ps)


def test_shared_prefix_groups_share_their_prefix(tokenizer_path: str) -> None:
    tok = Tokenizer.from_file(tokenizer_path)
    config = WorkloadConfig(
        input_len=LengthDist("uniform", 5, 40), num_prefix_groups=3, prefix_len=64,
        tokenizer_path=tokenizer_path,
    )  # fmt: skip
    ps = take(config, 60)
    groups: dict[int, list[Prompt]] = {}
    for p in ps:
        assert p.group is not None
        groups.setdefault(p.group, []).append(p)
    assert sorted(groups) == [0, 1, 2]
    heads = {}
    for g, members in groups.items():
        ids = [tok.encode(p.full_text, add_special_tokens=False).ids for p in members]
        assert all(i[:64] == ids[0][:64] for i in ids)  # the same first 64 tokens
        assert len({tuple(i[64:]) for i in ids}) == len(ids)  # and a unique rest
        assert all(len(i) == p.input_len for i, p in zip(ids, members, strict=True))
        assert all(count(tok, p.system or "") == 64 for p in members)
        heads[g] = tuple(ids[0][:16])
    assert len(set(heads.values())) == 3  # groups differ from their first block on


def test_same_seed_same_prompts() -> None:
    config = WorkloadConfig(input_len=LengthDist("normal", 30, 10), tenants=parse_tenants("a,b"))
    assert take(config, 20, seed=3) == take(config, 20, seed=3)
    assert take(config, 20, seed=3) != take(config, 20, seed=4)


def test_tenant_mix_and_priorities() -> None:
    config = WorkloadConfig(
        input_len=LengthDist("fixed", 4), tenants=parse_tenants("a:3:0,b:1:7,c:1"), priority=2
    )
    ps = take(config, 5000)
    share = {t: sum(p.tenant == t for p in ps) / len(ps) for t in "abc"}
    assert share["a"] == pytest.approx(0.6, abs=0.025)
    assert share["b"] == pytest.approx(0.2, abs=0.02)
    prio = {p.tenant: p.priority for p in ps}
    assert prio == {"a": 0, "b": 7, "c": 2}  # c has none of its own: the default


def test_dataset_rows_all_come_before_any_repeats(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": f"question {i}", "max_tokens": i + 1} for i in range(7)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ps = take(WorkloadConfig(dataset_path=str(path)), 14)
    assert sorted(p.text for p in ps[:7]) == sorted(r["prompt"] for r in rows)
    assert all(p.max_tokens == int(p.text.split()[1]) + 1 for p in ps)


def test_trace_rows(tmp_path: Path, tokenizer_path: str) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"t": 1.5, "prompt_tokens": 33, "max_tokens": 4, "tenant": "x", "priority": 1},
        {"t": 0.0, "prompt": "hello there", "max_tokens": 2},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    assert [e.t_s for e in load_trace(str(path))] == [0.0, 1.5]
    config = WorkloadConfig(trace_path=str(path), tokenizer_path=tokenizer_path)
    first, second = take(config, 10)
    assert (first.text, first.max_tokens, first.tenant) == ("hello there", 2, None)
    assert (second.num_prompt_tokens, second.max_tokens, second.tenant, second.priority) == (
        33, 4, "x", 1,
    )  # fmt: skip
    path.write_text(json.dumps({"t": 0, "prompt": "a", "prompt_tokens": 3}))
    with pytest.raises(ValueError, match="exactly one"):
        load_trace(str(path))


def test_request_bodies() -> None:
    p = Prompt(0, " rest", 8, system="shared", tenant="a", priority=3)
    base = BenchConfig("http://x", "m", num_requests=1, workload=WorkloadConfig())
    req = build_request(p, base)
    assert req.path == "/v1/completions"
    assert req.body["prompt"] == "shared rest" and req.body["max_tokens"] == 8
    assert req.body["ignore_eos"] is True and req.body["stream"] is True
    assert req.body["stream_options"] == {"include_usage": True}
    assert (req.body["user"], req.body["priority"]) == ("a", 3)
    assert dict(req.headers) == {"x-surge-tenant": "a", "x-surge-priority": "3"}
    chat = BenchConfig("http://x", "m", api="chat", num_requests=1, ignore_eos=False,
                       api_key="k", extra_body=(("top_k", 5),))  # fmt: skip
    body = build_request(Prompt(0, "hi", 4), chat).body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in body and "priority" not in body and body["top_k"] == 5
    assert dict(build_request(Prompt(0, "hi", 4), chat).headers) == {"authorization": "Bearer k"}
