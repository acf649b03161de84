"""learner/rank.py hands a step's freed heap back to the OS: without it the CPU learner's
resident set grew with every step (glibc keeps freed memory for reuse) until Ray's OOM
killer took the generator beside it."""

import subprocess
import sys

import pytest

# Fill the heap with 64 KiB blocks (under glibc's mmap threshold, so they come from the heap),
# free all but the last (it pins the top, so glibc's own trim-at-free cannot shrink the heap),
# then read the resident set before and after the release.
PROBE = r"""
import sys
from learner.rank import _release_free_memory

def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024

blocks = [bytearray(64 * 1024) for _ in range(6000)]
pin = blocks[-1]
del blocks[:-1]
before = rss_mb()
_release_free_memory()
print(before, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_freed_heap_goes_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    before, after = map(float, out.stdout.split())
    assert before - after > 200, f"resident set {before:.0f} MB -> {after:.0f} MB: the freed ~375 MB stayed"
