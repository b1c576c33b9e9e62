"""glibc's malloc set to keep freed memory for reuse (``mallopt(3)``): the command line's ``train --malloc retain``.

XLA's CPU runtime (jax, TensorFlow) allocates a program's buffers at every call, hundreds of MB for a training step
(jax from its worker threads), and PyTorch's autograd frees and allocates its large temporaries every step. With
glibc's defaults a block that large is mapped and unmapped each time (``mmap``), or lives in a heap of a thread's own
arena that is created and released, so each step faults its pages in again, zeroed by the kernel. With nothing mapped,
no heap trimmed below ``TRIM_THRESHOLD`` and every thread on the main arena, a step reuses the last one's pages.
The measurements: docs/text.md, "Process settings".
"""

from __future__ import annotations

import ctypes
import platform

TRIM_THRESHOLD = (1 << 31) - 1  # bytes: free memory at the top of the heap kept (mallopt takes an int)
# mallopt(3) parameters (glibc's malloc.h) and the values set.
SETTINGS = {"M_TRIM_THRESHOLD": (-1, TRIM_THRESHOLD), "M_MMAP_MAX": (-4, 0), "M_ARENA_MAX": (-8, 1)}


def retain_freed_memory() -> dict[str, int]:
    """Sets ``SETTINGS`` in this process's malloc and returns them as {name: value}; {} where the C library is not
    glibc (nothing set). Call it before the frameworks start their threads: a thread keeps the arena it has.

    Raises:
        OSError: if glibc refuses a setting.
    """
    if platform.libc_ver()[0] != "glibc":
        return {}
    mallopt = ctypes.CDLL(None).mallopt
    for name, (param, value) in SETTINGS.items():
        if mallopt(param, value) != 1:
            raise OSError(f"mallopt({name}, {value}) refused")
    return {name: value for name, (_, value) in SETTINGS.items()}
