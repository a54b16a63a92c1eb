"""Keep freed host memory in the process instead of handing it back to the kernel (glibc only).

PyTorch's CPU tensors come from `malloc`. glibc serves large blocks (above a threshold that starts at
128 KiB) with fresh `mmap`s and returns them on `free`, so every new activation or gradient of a
CPU worker pays a page fault per 4 KiB on first touch. A full backward hides this: it frees saved
tensors as it goes and the next allocation reuses them. The B/W split cannot: B keeps the graph
for W (retain_graph), so B's gradients land on new, unfaulted pages, and B + W measured 1.2-1.3x one
full backward on the GPT example (docs/benchmarks.md). Raising the mmap threshold to its maximum and
never trimming keeps freed blocks in the heap, where the next micro-batch reuses them already
faulted in. Steady-state memory is unchanged (the same blocks are reused); the process just keeps
its high-water mark, which a training worker reaches on every iteration anyway.

This is what `jemalloc`/`tcmalloc` do by default and what PyTorch's CPU performance guide
recommends; `mallopt` gets it without preloading a library. GPU workers allocate through the CUDA
caching allocator and are unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's upper bound for M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2): larger blocks still mmap."""
_NEVER_TRIM = 2**31 - 1


def keep_freed_host_memory() -> bool:
    """Apply the settings above; True when they took effect, False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    return bool(mapped) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
