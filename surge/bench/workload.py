"""Prompts and their lengths: synthetic, from a JSONL dataset, or from a trace file.

Synthetic prompts are random common English words. With a tokenizer (a HF tokenizer.json) each
prompt has exactly the asked number of tokens, counted without special tokens (the server may add
a BOS token or a chat template; its reported usage is recorded too). Without one, a word is about
one token.

Randomness comes from numpy streams derived from the seed (stream 1: lengths and words, 2: the
shared prefixes, 3: tenants), so a seed fixes the prompts, and the prefixes do not shift when the
request count changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surge.bench.config import LengthDist, Tenant, WorkloadConfig
from surge.bench.words import WORDS


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's content, before it is shaped into an API body."""

    index: int
    text: str
    max_tokens: int
    system: str | None = None  # the shared prefix, sent as a system message on the chat API
    input_len: int | None = None  # tokens asked for (synthetic) or given by a trace
    num_prompt_tokens: int | None = None  # tokens counted with the tokenizer, when there is one
    tenant: str | None = None
    priority: int | None = None
    group: int | None = None  # shared-prefix group

    @property
    def full_text(self) -> str:
        """The whole prompt as the completions API gets it: shared prefix, then the rest."""
        return (self.system or "") + self.text


@dataclass(frozen=True, slots=True)
class TraceEntry:
    t_s: float
    prompt: str | None
    prompt_tokens: int | None
    max_tokens: int | None
    tenant: str | None
    priority: int | None


def sample_lengths(dist: LengthDist, rng: np.random.Generator, size: int) -> list[int]:
    if dist.kind == "fixed":
        raw = np.full(size, dist.a)
    elif dist.kind == "uniform":
        raw = rng.integers(int(dist.a), int(dist.b), size=size, endpoint=True).astype(float)
    elif dist.kind == "normal":
        raw = rng.normal(dist.a, dist.b, size=size)
    else:
        mu = np.log(dist.a) - dist.b**2 / 2
        raw = rng.lognormal(mu, dist.b, size=size)
    return [max(1, round(float(x))) for x in raw]


class TextMaker:
    """Random-word texts of a given token length; exact when it has a tokenizer."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer = None
        words: Sequence[str] = WORDS
        if tokenizer_path is not None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(tokenizer_path)
            words = [w for w in WORDS if self.count(" " + w) == 1] or WORDS
        self.words = np.asarray(words)

    def count(self, text: str) -> int:
        assert self.tokenizer is not None
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def make(self, num_tokens: int, rng: np.random.Generator, after: str = "") -> tuple[str, int]:
        """A text of `num_tokens` tokens when appended to `after` (which it then starts with a
        space to keep token boundaries apart); returns the text and its counted length (the
        asked length when there is no tokenizer)."""
        words = [str(w) for w in rng.choice(self.words, size=num_tokens)]
        if self.tokenizer is None:
            return self._join(words, after), num_tokens
        base = self.count(after) if after else 0
        # One-token words usually sum exactly; where the tokenizer merges across a boundary,
        # trim or pad a word at a time until the count in context is right.
        for _ in range(4 * num_tokens + 16):
            n = self.count(after + self._join(words, after)) - base
            if n == num_tokens:
                break
            if n > num_tokens:
                words.pop()
            else:
                words.append(str(rng.choice(self.words)))
        text = self._join(words, after)
        return text, self.count(after + text) - base

    @staticmethod
    def _join(words: list[str], after: str) -> str:
        text = "".join(" " + w for w in words)
        return text if after else text.lstrip()


def load_jsonl(path: str) -> list[dict[str, object]]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object")
        rows.append(row)
    return rows


def _opt_int(row: dict[str, object], key: str, where: str) -> int | None:
    v = row.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: {key} must be an integer")
    return v


def load_trace(path: str) -> list[TraceEntry]:
    """Rows `{"t": s, "prompt": str | "prompt_tokens": int, "max_tokens": int, "tenant"?: str,
    "priority"?: int}`, sorted by t (stably, so equal times keep the file's order)."""
    entries = []
    for n, row in enumerate(load_jsonl(path), 1):
        where = f"{path} row {n}"
        t = row.get("t")
        prompt = row.get("prompt")
        if not isinstance(t, int | float) or t < 0:
            raise ValueError(f"{where}: t must be a number >= 0")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"{where}: prompt must be a string")
        prompt_tokens = _opt_int(row, "prompt_tokens", where)
        if (prompt is None) == (prompt_tokens is None):
            raise ValueError(f"{where}: give exactly one of prompt and prompt_tokens")
        tenant = row.get("tenant")
        entries.append(
            TraceEntry(
                t_s=float(t),
                prompt=prompt,
                prompt_tokens=prompt_tokens,
                max_tokens=_opt_int(row, "max_tokens", where),
                tenant=None if tenant is None else str(tenant),
                priority=_opt_int(row, "priority", where),
            )
        )
    return sorted(entries, key=lambda e: e.t_s)


class _Tenants:
    def __init__(self, tenants: Sequence[Tenant], default_priority: int | None, seed: int) -> None:
        self.tenants = list(tenants)
        self.default_priority = default_priority
        weights = np.array([t.weight for t in tenants], dtype=float)
        self.p = weights / weights.sum() if len(tenants) else weights
        self.rng = np.random.default_rng([seed, 3])

    def pick(self) -> tuple[str | None, int | None]:
        if not self.tenants:
            return None, self.default_priority
        t = self.tenants[int(self.rng.choice(len(self.tenants), p=self.p))]
        return t.name, t.priority if t.priority is not None else self.default_priority


def prompts(config: WorkloadConfig, seed: int) -> Iterator[Prompt]:
    """The run's prompts in send order; infinite except for a trace."""
    if config.trace_path is not None:
        return _trace_prompts(config, load_trace(config.trace_path), seed)
    if config.dataset_path is not None:
        return _dataset_prompts(config, seed)
    return _synthetic_prompts(config, seed)


def _synthetic_prompts(config: WorkloadConfig, seed: int) -> Iterator[Prompt]:
    rng = np.random.default_rng([seed, 1])
    maker = TextMaker(config.tokenizer_path)
    prefix_rng = np.random.default_rng([seed, 2])
    prefixes = [
        maker.make(config.prefix_len, prefix_rng)[0] for _ in range(config.num_prefix_groups)
    ]
    tenants = _Tenants(config.tenants, config.priority, seed)
    i = 0
    while True:
        for in_len, out_len in zip(
            sample_lengths(config.input_len, rng, 256),
            sample_lengths(config.output_len, rng, 256),
            strict=True,
        ):
            group = int(rng.integers(len(prefixes))) if prefixes else None
            prefix = prefixes[group] if group is not None else ""
            text, n = maker.make(in_len, rng, after=prefix)
            tenant, priority = tenants.pick()
            yield Prompt(
                index=i,
                text=text,
                max_tokens=out_len,
                system=prefix or None,
                input_len=in_len + config.prefix_len,
                num_prompt_tokens=None if maker.tokenizer is None else n + config.prefix_len,
                tenant=tenant,
                priority=priority,
                group=group,
            )
            i += 1


def _dataset_prompts(config: WorkloadConfig, seed: int) -> Iterator[Prompt]:
    assert config.dataset_path is not None
    rows = load_jsonl(config.dataset_path)
    if not rows:
        raise ValueError(f"{config.dataset_path}: no rows")
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt"), str):
            raise ValueError(f"{config.dataset_path} row {n}: prompt must be a string")
    rng = np.random.default_rng([seed, 1])
    tenants = _Tenants(config.tenants, config.priority, seed)
    i = 0
    while True:
        # Each pass is a fresh permutation: no row repeats before all have been sent.
        for j in rng.permutation(len(rows)):
            row = rows[int(j)]
            where = f"{config.dataset_path} row {int(j) + 1}"
            out = _opt_int(row, "max_tokens", where) or _opt_int(row, "output_tokens", where)
            if out is None:
                out = sample_lengths(config.output_len, rng, 1)[0]
            tenant, priority = tenants.pick()
            yield Prompt(i, str(row["prompt"]), out, tenant=tenant, priority=priority)
            i += 1


def _trace_prompts(
    config: WorkloadConfig, entries: Sequence[TraceEntry], seed: int
) -> Iterator[Prompt]:
    rng = np.random.default_rng([seed, 1])
    maker = TextMaker(config.tokenizer_path)
    tenants = _Tenants(config.tenants, config.priority, seed)
    for i, e in enumerate(entries):
        num_prompt_tokens = None
        if e.prompt is not None:
            text = e.prompt
        else:
            assert e.prompt_tokens is not None
            text, n = maker.make(e.prompt_tokens, rng)
            num_prompt_tokens = n if maker.tokenizer is not None else None
        out = e.max_tokens or sample_lengths(config.output_len, rng, 1)[0]
        tenant, priority = tenants.pick()
        yield Prompt(
            index=i,
            text=text,
            max_tokens=out,
            input_len=e.prompt_tokens,
            num_prompt_tokens=num_prompt_tokens,
            tenant=e.tenant or tenant,
            priority=e.priority if e.priority is not None else priority,
        )


def trace_times(path: str) -> list[float]:
    return [e.t_s for e in load_trace(path)]
