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
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults_of_second_round():
    for round in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):  # a step's worth of 16 MB temporaries, allocated and freed
            x = torch.ones(4 << 20); y = x * 2; del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults_of_second_round())
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc's malloc")
def test_freed_tensors_are_reused_without_page_faults():
    pages = 5 * 2 * (16 << 20) // resource.getpagesize()  # what faulting every temporary in again costs
    assert _faults("default") > pages // 2  # glibc's default: each 16 MB temporary faults in again
    assert _faults("keep") < pages // 20  # kept: the second round reuses the first round's memory
