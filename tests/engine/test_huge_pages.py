"""The KV pool's CPU tensors: zeroed like torch.zeros, their memory taken as it is first
written, on 2 MiB pages where the kernel allows them."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import psutil
import pytest
import torch

from surge.engine.runner import huge_pages
from surge.engine.runner.kv_cache import allocate_kv_cache, plan_kv_cache
from surge.models.formats.spec import ModelSpec

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


def populate_write_supported() -> bool:
    """MADV_POPULATE_WRITE: Linux 5.14 on."""
    if not sys.platform.startswith("linux"):
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 14)


def rss() -> int:
    return psutil.Process(os.getpid()).memory_info().rss


def pool(blocks: int = 600) -> list[torch.Tensor]:
    """Two pool tensors like a layer's K and V: [2 heads, blocks, 16, 64] bf16 (~2.4 MiB each
    at 600 blocks: a head's blocks are not a whole number of huge pages, as in the engine)."""
    return [
        huge_pages.zeros((2, blocks, 16, 64), torch.bfloat16, torch.device("cpu")) for _ in "kv"
    ]


def test_prefault_regions_cover_the_pool_in_block_order() -> None:
    k, v = pool()
    regions = huge_pages.prefault_regions([k, v])
    per_block, per_head = 16 * 64 * 2, 600 * 16 * 64 * 2
    covered = [set(), set()]
    for i, start, length in regions:
        assert start % huge_pages.SMALL_PAGE_BYTES == 0
        covered[i].update(range(start // per_block, -(-(start + length) // per_block)))
    assert all(c >= set(range(2 * 600)) for c in covered)  # every block of both heads
    # Block order first: all of the first huge page's blocks (every tensor, every head) come
    # before any later block.
    first = huge_pages.HUGE_PAGE_BYTES // per_block
    starts = [s % per_head // per_block for _, s, _ in regions[:4]]
    assert all(b < first for b in starts) and len(regions) == 2 * 2 * -(-600 // first)


@pytest.mark.skipif(not populate_write_supported(), reason="needs MADV_POPULATE_WRITE")
def test_prefault_builds_the_pages_and_keeps_what_was_written() -> None:
    k, v = pool(2400)  # ~9.4 MiB each
    k[0, 5].fill_(3.0)  # written before: the prefault must not zero it
    v[1, 2399].fill_(-2.0)
    before = rss()
    assert huge_pages.prefault([k, v])
    assert rss() - before > 0.8 * 2 * k.numel() * k.element_size()
    assert (k[0, 5] == 3.0).all() and (v[1, 2399] == -2.0).all()
    assert k.count_nonzero() == 16 * 64 and v.count_nonzero() == 16 * 64


@pytest.mark.skipif(not populate_write_supported(), reason="needs MADV_POPULATE_WRITE")
def test_the_background_prefault_runs_idle_and_stops_with_the_pool() -> None:
    policy: list[int] = []

    def probe() -> None:  # the thread's priority, as the prefault thread sets its own
        huge_pages._idle_priority()
        policy.append(os.sched_getscheduler(0))

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert policy == [os.SCHED_IDLE] and os.sched_getscheduler(0) != os.SCHED_IDLE
    k, v = pool(2400)
    thread = huge_pages.prefault_in_background([k, v])
    assert thread is not None and thread.daemon
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not k.any() and not v.any()
    # It holds no reference of its own: a pool freed while it runs ends it.
    k, v = pool(24000)  # ~94 MiB each
    thread = huge_pages.prefault_in_background([k, v])
    assert thread is not None
    del k, v
    thread.join(timeout=30)
    assert not thread.is_alive()
