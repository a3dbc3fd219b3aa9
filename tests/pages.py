"""Arrays on the page size a test needs: single copy passes a message by reference only from huge pages."""

from __future__ import annotations

import mmap

import numpy as np
from hora import _native

HUGE_PAGE = 2 << 20


def on_pages(array: np.ndarray, huge: bool) -> np.ndarray:
    """A copy of ``array`` in fresh memory aligned to a huge page, advised onto huge pages or onto 4 KiB pages before
    its first touch (as numpy advises its large arrays, and torch's and TensorFlow's allocators do not)."""
    length = (max(array.nbytes, 1) + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE  # whole huge pages, the last one too
    mapping = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(mapping, np.uint8)
    skip = -base.ctypes.data % HUGE_PAGE
    mapping.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE, skip, length)
    copy = base[skip : skip + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def huge_pages_possible() -> bool:
    """Whether a buffer advised onto huge pages can pass by reference here: the system gives it huge pages, or the
    kernel cannot tell pages apart (before Linux 6.7), and then every large message may pass by reference."""
    return _native.on_huge_pages(on_pages(np.zeros(HUGE_PAGE, np.uint8), huge=True)) is not False
