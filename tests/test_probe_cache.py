"""The CPU measurements that choose kernels are taken once per machine, so every process chooses alike."""

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from posttrain.models import native, panel_linear
from posttrain.models.probe_cache import ISA_CEILINGS, cpu_flags, hardware_flags

CHOICES = """
import json
from posttrain.models import cpu_probe
print(json.dumps([cpu_probe.onednn_training_pays(), cpu_probe.narrow_decode_kernel(False),
                  cpu_probe.narrow_decode_kernel(True)]))
"""


def choices(cache_dir) -> list:
    env = {**os.environ, "POSTTRAIN_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", CHOICES], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_first_process_measures_and_later_ones_choose_from_its_file(tmp_path):
    first = choices(tmp_path)
    [stored] = tmp_path.glob("cpu-probe-*.json")
    data = json.loads(stored.read_text())
    assert {key.split()[0] for key in data} == {"onednn_training_speedup", "narrow_decode_seconds"}
    assert choices(tmp_path) == first

    # The file decides, not a new measurement: make the slowest float32 kernel the fastest on record.
    [narrow] = [key for key in data if key.startswith("narrow_decode_seconds")]
    [training] = [key for key in data if key.startswith("onednn_training_speedup")]
    slowest = max(["packed fp32", "plain fp32"], key=data[narrow].__getitem__)
    data[narrow] = {name: (0.0 if name == slowest else 1.0) for name in data[narrow]}
    data[training] = 0.0 if first[0] else 100.0
    stored.write_text(json.dumps(data))
    assert choices(tmp_path) == [not first[0], slowest, slowest]


def test_a_damaged_file_is_measured_again_and_an_unwritable_place_measures_in_process(tmp_path):
    choices(tmp_path)
    [stored] = tmp_path.glob("cpu-probe-*.json")
    stored.write_text('{"onednn_training_spe')  # cut short
    choices(tmp_path)
    assert {key.split()[0] for key in json.loads(stored.read_text())} == \
        {"onednn_training_speedup", "narrow_decode_seconds"}

    blocked = tmp_path / "file"
    blocked.write_text("")  # a directory cannot be made under a file
    assert len(choices(blocked / "cache")) == 3


def test_a_measurement_is_taken_again_when_the_code_it_measures_changes(tmp_path, monkeypatch):
    """The decode kernels' timings depend on decode_kernels.py and panel_gemm.c, not only on the
    probe function's own source: a new kernel must be timed, not missed for a stale record."""
    from posttrain.models.probe_cache import stored_per_machine

    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))
    calls = []

    def measure() -> int:
        calls.append(1)
        return len(calls)

    first = stored_per_machine(depends_on="kernels a")(measure)
    another_process = stored_per_machine(depends_on="kernels a")(measure)
    changed = stored_per_machine(depends_on="kernels a, b")(measure)
    assert (first(), another_process(), changed()) == (1, 1, 2)


def test_a_value_of_the_wrong_type_in_the_file_is_measured_again(tmp_path, monkeypatch):
    """A hand-edited or damaged file whose JSON parses but holds a string where a number was kept, or a
    list where timings by kernel were, must not reach the code that chooses kernels: measured again."""
    from posttrain.models.probe_cache import probe_file, stored_per_machine

    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))
    calls = []

    def speedup() -> float:
        calls.append("speedup")
        return 1.5

    def seconds() -> dict[str, float]:
        calls.append("seconds")
        return {"ours": 0.1, "theirs": 0.2}

    assert (stored_per_machine(speedup)(), stored_per_machine(seconds)()) == (1.5, {"ours": 0.1, "theirs": 0.2})
    data = json.loads(probe_file().read_text())
    for key, broken in zip(sorted(data), ({"ours": "fast"}, "1.5")):  # seconds' key sorts first
        data[key] = broken
    probe_file().write_text(json.dumps(data))
    # another process: reads the file, finds neither value usable, measures both again and keeps them
    assert (stored_per_machine(speedup)(), stored_per_machine(seconds)()) == (1.5, {"ours": 0.1, "theirs": 0.2})
    assert calls == ["speedup", "seconds", "speedup", "seconds"]
    assert sorted(json.loads(probe_file().read_text()).values(), key=str) == [1.5, {"ours": 0.1, "theirs": 0.2}]
    assert (stored_per_machine(speedup)(), stored_per_machine(seconds)()) == (1.5, {"ours": 0.1, "theirs": 0.2})
    assert len(calls) == 4  # kept well-formed this time


def test_a_measurement_that_takes_another_keeps_both(tmp_path, monkeypatch):
    """A probe may call another while it measures (the oneDNN training probe's layers consult the
    weight-gradient probe): the process must not wait on its own lock, and both values are kept."""
    from posttrain.models.probe_cache import probe_file, stored_per_machine

    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))

    def inner() -> float:
        return 2.0

    inner_probe = stored_per_machine(inner)

    def outer() -> float:
        return inner_probe() + 1.0

    results = []
    worker = threading.Thread(target=lambda: results.append(stored_per_machine(outer)()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert results == [3.0], "the nested measurement waited on this process's own lock"
    assert {key.split()[0]: value for key, value in json.loads(probe_file().read_text()).items()} == \
        {"inner": 2.0, "outer": 3.0}


CEILING = """
import json
from posttrain.models import panel_linear, probe_cache
print(json.dumps([sorted(probe_cache.cpu_flags()), panel_linear.AVX512.unavailable_reason(),
                  str(probe_cache.probe_file())]))
"""


def test_pytorchs_instruction_ceiling_keeps_our_kernels_under_it_and_is_measured_apart(tmp_path):
    """``ATEN_CPU_CAPABILITY=avx2`` runs the whole stack as on a CPU without AVX-512: our AVX-512 kernels
    say why they do not run, and the probes keep their timings in another file (those taken with
    AVX-512 would not hold)."""
    def run(**ceiling) -> list:
        env = {name: value for name, value in os.environ.items() if name not in ISA_CEILINGS}
        env |= {"POSTTRAIN_CACHE_DIR": str(tmp_path), **ceiling}
        proc = subprocess.run([sys.executable, "-c", CEILING], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    flags, _, uncapped_file = run()
    if not {"avx2", "avx512f"} <= set(flags):
        pytest.skip("needs a CPU with AVX-512")
    capped_flags, reason, capped_file = run(ATEN_CPU_CAPABILITY="avx2")
    assert "avx2" in capped_flags and not [flag for flag in capped_flags if flag.startswith(("avx512", "amx"))]
    assert set(capped_flags) < set(flags)
    assert reason == "avx512f above PyTorch's instruction set here (AVX2; ATEN_CPU_CAPABILITY sets it)"
    assert capped_file != uncapped_file


KERNEL_CHOICES = """
import json
from posttrain.models import cpu_probe, probe_cache
print(json.dumps([cpu_probe.narrow_decode_kernel(False), cpu_probe.wide_decode_kernel(False),
                  str(probe_cache.probe_file())]))
"""


def test_a_process_that_cannot_build_our_kernels_measures_apart(tmp_path):
    """Timings taken with our kernels would have a process without a working compiler choose a kernel it
    cannot load (its decoding stopped with 'cannot run here'), and timings taken without them would keep
    later processes off them: each keeps its own file."""
    if native.kernels_unavailable():
        pytest.skip(native.kernels_unavailable())

    def run(**env) -> list:
        env = {**os.environ, "POSTTRAIN_CACHE_DIR": str(tmp_path), **env}
        proc = subprocess.run([sys.executable, "-c", KERNEL_CHOICES], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    ours = ("panel fp32", "panel512 fp32")
    with_kernels = run()
    without = run(CC=str(tmp_path / "no-such-cc"))
    assert without[2] != with_kernels[2]
    assert not set(without[:2]) & set(ours)
    assert run() == with_kernels  # its own file again, not the one measured without
    assert run(CC=str(tmp_path / "no-such-cc")) == without


def test_an_avx512_build_refused_where_pytorch_itself_stops_at_avx2_says_so(monkeypatch):
    """Where no variable caps it but PyTorch runs AVX2 kernels on a CPU that has avx512f (a CPU with
    only part of the AVX-512 PyTorch asks for), the reason blames PyTorch's choice, not a variable."""
    if "avx512f" not in hardware_flags():
        pytest.skip("needs a CPU with AVX-512")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    cpu_flags.cache_clear()
    try:
        reason = native.load(panel_linear.SOURCE, needs=("avx512f",), flags=("-mavx512f",))
    finally:
        monkeypatch.undo()
        cpu_flags.cache_clear()
    assert reason == "avx512f above PyTorch's instruction set here (AVX2; PyTorch's choice for this CPU)"
