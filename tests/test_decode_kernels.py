"""Every decode kernel computes the same matmul, and each decode step runs on the kernel chosen for it."""

import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

from posttrain.models import panel_linear
from posttrain.models.cpu_probe import narrow_decode_kernel, narrow_decode_seconds, wide_decode_kernel
from posttrain.models.decode_kernels import FP32_KERNELS, KERNELS
from posttrain.models.probe_cache import cpuinfo
from posttrain.rollout.fast_decode import NARROW_ROWS, DecodeWeights, StaticCache, decode_step


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("rows", [1, 2, 16])
def test_every_kernel_computes_the_linear_layer(name, rows):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64) / 8, torch.randn(96), torch.randn(rows, 64)
    kernel = KERNELS[name]
    try:
        copy = kernel.prepare(weight, rows)
    except RuntimeError:  # oneDNN packs bf16 only on CPUs with bf16 units
        pytest.skip(f"{name} cannot run on this CPU")
    out = kernel.linear(copy, bias.to(kernel.dtype), x).float()
    tolerance = 1e-5 if kernel.dtype == torch.float32 else 0.05  # bf16 keeps 8 bits of mantissa
    assert torch.allclose(out, F.linear(x, weight, bias), atol=tolerance, rtol=tolerance)


def test_narrow_steps_take_the_fastest_kernel_measured_here_and_float32_stays_float32():
    seconds = narrow_decode_seconds()
    assert {"packed fp32", "plain fp32", "plain bf16"} <= set(seconds)  # these run on every x86 CPU
    assert narrow_decode_kernel(False) in FP32_KERNELS  # float32 decoding never rounds to bf16
    assert seconds[narrow_decode_kernel(True)] == min(seconds.values())
    assert seconds[narrow_decode_kernel(False)] == min(seconds[k] for k in FP32_KERNELS)


@pytest.mark.parametrize("name", FP32_KERNELS)
def test_float32_kernels_give_the_models_own_logits_at_one_row(tiny_model, tokenizer, name):
    ids = torch.tensor([tokenizer.encode("What is 2 + 3?")])
    with torch.no_grad():
        out = tiny_model(input_ids=ids, use_cache=True)
    weights = DecodeWeights(tiny_model, rows=1)
    cache = StaticCache([layer.keys for layer in out.past_key_values.layers],
                        [layer.values for layer in out.past_key_values.layers], torch.ones_like(ids), ids.shape[1] + 1)
    cos, signed_sin = weights.rotary_tables(ids.shape[1] + 1)
    token = out.logits[:, -1].argmax(-1)
    logits = decode_step(weights, cache, token, cos[-1:], signed_sin[-1:], weights.copy(name, 1))
    with torch.no_grad():
        expected = tiny_model(input_ids=torch.cat([ids, token[:, None]], 1)).logits[:, -1]
    assert torch.allclose(logits, expected, atol=1e-4)
    assert weights.kernel(1) == narrow_decode_kernel(False)
    assert weights.kernel(NARROW_ROWS + 1) == wide_decode_kernel(False)


def _can_build_panel_kernel() -> bool:
    return (platform.machine() == "x86_64" and {"avx2", "fma"} <= set(cpuinfo().get("flags", "").split())
            and shutil.which("cc") is not None)


def test_panel_kernel_builds_wherever_it_can_run():
    """Not a silent fallback: on an x86-64 CPU with AVX2 and a C compiler, a broken build fails here."""
    if not _can_build_panel_kernel():
        pytest.skip("the panel kernel needs x86-64 with AVX2/FMA and a C compiler")
    assert panel_linear.unavailable_reason() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("outputs,inputs", [(1, 1), (17, 37), (50, 64)])
@pytest.mark.parametrize("rows", [1, 6, 7, 13])
def test_panel_kernel_computes_any_shape_with_and_without_bias(outputs, inputs, rows, dtype):
    if panel_linear.unavailable_reason():
        pytest.skip(panel_linear.unavailable_reason())
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, inputs)
    packed = panel_linear.pack(weight, dtype)
    weight = weight.to(dtype).float()  # bf16 weights: the products of the rounded weights, summed in float32
    assert torch.allclose(panel_linear.linear(packed, bias, x), F.linear(x, weight, bias), atol=1e-5)
    assert torch.allclose(panel_linear.linear(packed, None, x), F.linear(x, weight), atol=1e-5)
    with pytest.raises(ValueError, match=rf"\[rows, {inputs}\]"):
        panel_linear.linear(packed, None, torch.randn(rows, inputs + 1))


def test_a_failed_panel_build_says_why_and_the_other_kernels_serve(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))
    panel_linear._library.cache_clear()
    try:
        reason = panel_linear.unavailable_reason()
        if not _can_build_panel_kernel():
            assert reason
            return
        assert reason.startswith("false could not build panel_gemm.c")
        with pytest.raises(RuntimeError, match="panel matmul kernel is not available: false could not build"):
            KERNELS["panel fp32"].prepare(torch.randn(16, 16), 1)
    finally:
        panel_linear._library.cache_clear()
