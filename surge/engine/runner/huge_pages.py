"""The KV pool's CPU memory (Linux): fresh anonymous pages on transparent huge pages, zeroed by
the kernel as each is first touched.

The pool is gigabytes, and after churn and prefix-cache reuse a request's blocks lie anywhere in
it: with 4 KiB pages nearly every block an attention pass reads is a TLB miss (and a software
prefetch that misses the TLB may be dropped). 2 MiB pages cut the misses 512-fold. Most kernels
default transparent huge pages to `madvise`, so memory gets them only when it asks.

Touching it all at start (torch.zeros) would make the kernel build every huge page then: 1-2 s
a GiB in a VM whose memory the host has not backed yet, against 0.17 s with small pages. A
fresh mapping is zero already, so nothing is touched here: a page is built when a block in it is
first written, and the pool's memory is taken as it fills.

Built while serving, though, those pages cost the steps that first write them: a fresh server's
prefill paid ~30 us a token (~150 ms stalls every ~5,000 prompt tokens here) until the pool had
been filled once (~90,000 tokens of SmolLM2 in the CPU's 2 GiB default). So `prefault` builds
them from a background thread at idle priority (SCHED_IDLE: it runs only on a core nothing else
wants), in the order the block manager hands blocks out, with MADV_POPULATE_WRITE, which faults
a page in without writing it: a block the engine has written already keeps its contents.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
SMALL_PAGE_BYTES = 4096
_MADV_HUGEPAGE = 14  # linux/mman.h
_MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14 on


@cache
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: Tensor) -> bool:
    """Ask for huge pages under the whole 2 MiB pages inside `t`'s memory (pages already
    touched stay small until khugepaged merges them). False where the platform or kernel does
    not take the advice; nothing else changes then."""
    fn = _madvise()
    if fn is None or t.device.type != "cpu":
        return False
    addr, size = t.data_ptr(), t.numel() * t.element_size()
    start = -(-addr // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (addr + size) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if end <= start:
        return False
    if fn(start, end - start, _MADV_HUGEPAGE) != 0:
        log.debug("madvise(MADV_HUGEPAGE) refused: errno %d", ctypes.get_errno())
        return False
    return True


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """torch.zeros; on a Linux CPU, for a tensor of at least one huge page, a fresh private
    anonymous mapping aligned to 2 MiB and advised onto huge pages, untouched (the kernel zeroes
    each page as it is first used). The tensor keeps the mapping alive."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if device.type != "cpu" or _madvise() is None or nbytes < HUGE_PAGE_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=flags)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # a view first, to learn the address
    offset = -raw.data_ptr() % HUGE_PAGE_BYTES
    del raw
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)
    advise_huge_pages(flat)
    return flat.view(dtype).view(shape)


def prefault_regions(tensors: Sequence[Tensor]) -> list[tuple[int, int, int]]:
    """(tensor index, start, length) byte ranges covering pool tensors [heads, blocks, ...] of
    one shape, in the order blocks are handed out (block 0 up, every tensor and head at each
    step), about a huge page of each head's blocks at a time; starts rounded down to a small
    page."""
    if not tensors:
        return []
    t0 = tensors[0]
    heads, blocks = t0.shape[0], t0.shape[1]
    block_bytes = t0.stride(1) * t0.element_size()
    head_bytes = t0.stride(0) * t0.element_size()
    step = max(1, HUGE_PAGE_BYTES // block_bytes)
    out = []
    for b0 in range(0, blocks, step):
        length = min(step, blocks - b0) * block_bytes
        for i in range(len(tensors)):
            for h in range(heads):
                start = h * head_bytes + b0 * block_bytes
                aligned = start // SMALL_PAGE_BYTES * SMALL_PAGE_BYTES
                out.append((i, aligned, length + start - aligned))
    return out


def prefault(tensors: Sequence[Tensor]) -> bool:
    """Builds the pages under the pool tensors (each [heads, blocks, ...], contiguous, of one
    shape) in block order without writing them. False where the kernel lacks
    MADV_POPULATE_WRITE (before 5.14) or the platform madvise."""
    if not _can_prefault(tensors):
        return False
    return _prefault([weakref.ref(t) for t in tensors], prefault_regions(tensors))


def _can_prefault(tensors: Sequence[Tensor]) -> bool:
    return _madvise() is not None and bool(tensors) and tensors[0].device.type == "cpu"


def _prefault(
    refs: Sequence[weakref.ReferenceType[Tensor]], regions: Sequence[tuple[int, int, int]]
) -> bool:
    """`prefault` holding only weak references between ranges: it stops (True) once the pool
    is freed elsewhere."""
    fn = _madvise()
    for i, start, length in regions:
        t = refs[i]()
        if t is None:
            return True  # the pool was freed: nothing left to build
        end = t.numel() * t.element_size()
        if start < end and fn(t.data_ptr() + start, min(length, end - start), _MADV_POPULATE_WRITE):
            log.debug("MADV_POPULATE_WRITE refused: errno %d", ctypes.get_errno())
            return False
        del t
    return True


def prefault_in_background(tensors: Sequence[Tensor]) -> threading.Thread | None:
    """`prefault` on a daemon thread at idle priority, which keeps no strong reference to the
    tensors; None where there is nothing to do."""
    if not _can_prefault(tensors):
        return None
    refs = [weakref.ref(t) for t in tensors]
    regions = prefault_regions(tensors)

    def run() -> None:
        _idle_priority()
        log.debug("KV pool pages prefaulted: %s", _prefault(refs, regions))

    thread = threading.Thread(target=run, name="surge-kv-prefault", daemon=True)
    thread.start()
    return thread


def _idle_priority() -> None:
    """This thread to SCHED_IDLE (Linux: a thread's own policy), else the lowest nice."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
