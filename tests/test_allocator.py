"""Freed host memory stays in the process: a step's large tensors do not page-fault anew every step."""

import ctypes.util
import os
import resource
import subprocess
import sys

import pytest

CHILD = r"""
import resource, sys, torch
from posttrain.models.allocator import keep_freed_memory
assert keep_freed_memory() == (sys.argv[1] == "keep")
def faults_after_the_first_rounds():
    for round in range(int(sys.argv[2])):
        if round == 2:  # the first rounds lay out the heap
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):  # a step's worth of temporaries, allocated and freed
            x = torch.ones(int(sys.argv[3]) << 18); y = x * 2; del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults_after_the_first_rounds())
"""
ROUNDS = 10


def _pages(megabytes: int) -> int:
    """What faulting every temporary in again costs over the measured rounds."""
    return (ROUNDS - 2) * 5 * 2 * (megabytes << 20) // resource.getpagesize()


def _faults(mode: str, megabytes: int, **malloc_env: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | malloc_env
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROUNDS), str(megabytes)], capture_output=True, text=True,
                         check=True, env=env)
    return int(out.stdout.split()[-1])


glibc = pytest.mark.skipif(sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc's malloc")


@glibc
@pytest.mark.parametrize("megabytes", [16, 96])  # 96 MB: over glibc's 32 MB ceiling for serving blocks from the heap
def test_freed_tensors_are_reused_without_page_faults(megabytes):
    # The heap is reused; it may still grow now and then, as free blocks split differently each round.
    assert _faults("keep", megabytes) < _pages(megabytes) // 10


@glibc
def test_the_users_own_malloc_settings_are_left_alone():
    # A fixed mmap threshold (glibc's starting value, which it otherwise raises as blocks are freed)
    # chosen by the user: we change nothing, so every 16 MB temporary is mapped and faulted in anew.
    assert _faults("user", 16, MALLOC_MMAP_THRESHOLD_="131072") > _pages(16) // 2
