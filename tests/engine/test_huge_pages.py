"""The KV pool's CPU tensors: zeroed like torch.zeros, their memory taken as it is first
written, on 2 MiB pages where the kernel allows them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
import torch

from surge.engine import huge_pages
from surge.engine.kv_cache import allocate_kv_cache, plan_kv_cache
from surge.models.spec import ModelSpec

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_bytes_under(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings that overlap `t`'s memory (/proc/self/smaps; the advice
    splits the one that holds it at the 2 MiB boundaries)."""
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    inside, huge = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's address range
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1]) * 1024
    return huge


def test_zeros_are_zeros_of_the_shape_asked() -> None:
    t = huge_pages.zeros((3, 700, 16, 68), torch.int8, torch.device("cpu"))
    assert t.shape == (3, 700, 16, 68) and t.dtype == torch.int8
    assert t.is_contiguous() and not t.any()
    small = huge_pages.zeros((4, 4), torch.float32, torch.device("cpu"))
    assert not small.any()
    assert not huge_pages.advise_huge_pages(small)  # no whole 2 MiB page inside


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not THP.exists() or "[never]" in THP.read_text(),
    reason="transparent huge pages are off here",
)
def test_the_kv_pool_lies_on_huge_pages() -> None:
    spec = ModelSpec(
        architecture="llama", vocab_size=300, hidden_size=256, intermediate_size=640,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=10000.0, rope_scaling=None, max_position_embeddings=512,
        tie_word_embeddings=False, attention_bias=False,
    )  # fmt: skip
    plan = plan_kv_cache(spec, torch.bfloat16, 16, memory_gib=0.25)
    rss = psutil.Process(os.getpid()).memory_info().rss
    caches = allocate_kv_cache(spec, plan, torch.bfloat16, torch.device("cpu"))
    grown = psutil.Process(os.getpid()).memory_info().rss - rss
    assert grown < plan.total_bytes / 10  # nothing written yet, nothing taken
    for k, v in caches:  # 32 MiB each
        assert not k.any() and not v.any()
        k.fill_(1.0)
        v[:, : v.shape[1] // 2].fill_(1.0)
        # Some of the 16 (and 8) pages at least: where memory is fragmented the kernel may fall
        # back to small pages for a few.
        assert huge_bytes_under(k) >= 4 * huge_pages.HUGE_PAGE_BYTES
        assert huge_bytes_under(v) >= 2 * huge_pages.HUGE_PAGE_BYTES
        assert k.count_nonzero() == k.numel()
        assert v.count_nonzero() == v[:, : v.shape[1] // 2].numel()
