"""``text.malloc``: glibc's malloc keeps freed memory in the process that asks, and only there."""

import json
import platform
import subprocess
import sys

import pytest

from text import malloc

ASK = "import json; from text import malloc; print(json.dumps(malloc.retain_freed_memory()))"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(3) is glibc's")
def test_the_settings_are_set_and_returned_in_a_process_of_its_own():
    out = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"M_TRIM_THRESHOLD": malloc.TRIM_THRESHOLD, "M_MMAP_MAX": 0, "M_ARENA_MAX": 1}


HEAP = """
import ctypes, sys
from text import malloc
if sys.argv[1] == "retain":
    malloc.retain_freed_memory()
c = ctypes.CDLL(None)
c.malloc.restype, c.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def mapped(what=""):  # address ranges of /proc/self/maps, those whose line ends with ``what``
    lines = open("/proc/self/maps").read().splitlines()
    return [range(*(int(x, 16) for x in m.split()[0].split("-"))) for m in lines if m.endswith(what)]
a = c.malloc(1 << 26)
in_heap = any(a in r for r in mapped("[heap]"))
c.free(a)
print(int(in_heap), int(any(a in r for r in mapped())))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(3) is glibc's")
@pytest.mark.parametrize("how, expected", [("retain", ["1", "1"]), ("default", ["0", "0"])])
def test_a_large_block_lives_in_the_heap_and_stays_mapped_when_freed(how, expected):
    """The point of the settings: 64 MiB taken from the heap and kept there when freed, for the next step to reuse;
    with glibc's defaults it is a mapping of its own, unmapped by ``free`` (its pages fault in again next time)."""
    out = subprocess.run([sys.executable, "-c", HEAP, how], capture_output=True, text=True, check=True).stdout
    assert out.split() == expected, out
