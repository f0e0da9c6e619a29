"""The weights' final layout kept on disk (surge/models/layout_cache.py): a start that maps it
runs the same weights, bit for bit, as one that converts the file, and so the same tokens; the
mapped weights are the cache file's pages, not copies; a stale or broken entry converts again."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.models.layout_cache import layout_dir

PROMPTS = ["The capital of France is", "def fib(n):"]


def _run(path: Path) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(path), kv_cache_memory_gib=0.05)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return llm, [list(o.outputs[0].token_ids) for o in outs]


def _tensors(llm: LLM) -> dict[str, torch.Tensor]:
    model = llm.engine.model
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if t is not None}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (equal floats and equal bits differ for -0.0 and NaN)."""
    return t.contiguous().view(torch.uint8) if t.is_floating_point() else t


def _mapped_from(entry: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of `entry`."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(entry)):
            lo, hi = line.split()[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def test_a_mapped_layout_runs_the_converted_weights_bit_for_bit(
    smollm2_gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    model = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_gguf_path, model)  # a copy: its mtime is changed below
    monkeypatch.setenv("SURGE_LAYOUT_DIR", "off")
    fresh, want = _run(model)
    fresh_tensors = _tensors(fresh)
    assert layout_dir() is None

    monkeypatch.setenv("SURGE_LAYOUT_DIR", str(tmp_path / "layouts"))
    with caplog.at_level(logging.INFO, logger="surge.models.layout_cache"):
        first, got_first = _run(model)  # converts, then writes the layout
        (entry,) = (tmp_path / "layouts").glob("*.pt")
        assert "wrote" in caplog.text
        caplog.clear()
        mapped, got = _run(model)  # maps it
        assert "from the layout cache" in caplog.text
    assert got_first == want and got == want
    tensors = _tensors(mapped)
    assert tensors.keys() == fresh_tensors.keys()
    for name, t in tensors.items():
        ref = fresh_tensors[name]
        assert t.dtype == ref.dtype and t.shape == ref.shape, name
        assert torch.equal(_bits(t), _bits(ref)), name
    # Views of the cache file's pages: the quantized weights were not copied into the heap.
    ranges = _mapped_from(entry)
    big = [t for t in tensors.values() if t.numel() * t.element_size() > 1 << 20]
    assert big and all(any(lo <= t.data_ptr() < hi for lo, hi in ranges) for t in big)
    del first, mapped

    # A broken entry is removed and the weights converted again (and stored anew).
    entry.write_bytes(b"not a layout")
    with caplog.at_level(logging.WARNING, logger="surge.models.layout_cache"):
        _, again = _run(model)
    assert "unreadable" in caplog.text and again == want
    assert entry.stat().st_size > 1 << 20
    # Another file at the same path (a new mtime) has another key: its entry replaces the old.
    os.utime(model, ns=(entry.stat().st_mtime_ns, entry.stat().st_mtime_ns + 10**9))
    _run(model)
    (newer,) = (tmp_path / "layouts").glob("*.pt")
    assert newer != entry
