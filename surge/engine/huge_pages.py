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
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
from functools import cache
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h


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
