"""Every decode kernel computes the same matmul, and each decode step runs on the kernel chosen for it."""

import re
import shutil

import pytest
import torch
import torch.nn.functional as F

from posttrain.models import decode_layer, native, panel_dot, panel_linear, transpose
from posttrain.models.cpu_probe import narrow_decode_kernel, narrow_decode_seconds, wide_decode_kernel
from posttrain.models.decode_kernels import FP32_KERNELS, KERNELS
from posttrain.models.probe_cache import cpu_flags, hardware_flags
from posttrain.rollout.fast_decode import (
    NARROW_ROWS,
    DecodeWeights,
    StaticCache,
    attend,
    decode_step,
    prefill,
    rms_norm,
    rotate,
)


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
    assert seconds[narrow_decode_kernel(False)] == min(seconds[k] for k in FP32_KERNELS if k in seconds)


@pytest.mark.parametrize("native_layer", [True, False])
@pytest.mark.parametrize("name", FP32_KERNELS)
def test_float32_kernels_prefill_and_decode_the_models_own_logits_at_one_row(tiny_model, tokenizer, name, native_layer):
    try:
        KERNELS[name].prepare(torch.zeros(16, 16), 1)
    except RuntimeError as e:  # an AVX-512 build on a CPU without AVX-512
        pytest.skip(str(e))
    ids = torch.tensor([tokenizer.encode("What is 2 + 3?")])
    weights = DecodeWeights(tiny_model, rows=1)
    if native_layer and not weights.native_layer:
        pytest.skip("our decode layer kernels do not run (or are not the faster) here")
    weights.native_layer = native_layer  # both paths, where both run
    width = ids.shape[1]
    cache = StaticCache(weights.layers, 1, weights.kv_heads, weights.head_dim, width + 1)
    cos, signed_sin = weights.rotary_tables(width + 1)
    matmuls = weights.copy(name, 1)
    logits = prefill(weights, cache, ids, torch.ones_like(ids), cos[None, :width], signed_sin[None, :width], matmuls)
    with torch.no_grad():
        expected = tiny_model(input_ids=ids).logits[:, -1]
    assert torch.allclose(logits, expected, atol=1e-4)
    token = logits.argmax(-1)
    logits = decode_step(weights, cache, token, cos[-1:], signed_sin[-1:], matmuls)
    with torch.no_grad():
        expected = tiny_model(input_ids=torch.cat([ids, token[:, None]], 1)).logits[:, -1]
    assert torch.allclose(logits, expected, atol=1e-4)
    assert weights.kernel(1) == narrow_decode_kernel(False)
    assert weights.kernel(NARROW_ROWS + 1) == wide_decode_kernel(False)


def test_panel_kernel_builds_wherever_it_can_run(buildable_kernels):
    """Not a silent fallback: on an x86-64 CPU with AVX2 and a C compiler, a broken build fails here."""
    assert panel_linear.unavailable_reason() is None


# why an AVX-512 kernel cannot run: the CPU lacks the instructions, or ATEN_CPU_CAPABILITY caps them
NO_AVX512 = r"(the CPU has no avx512|avx512[\w, ]* above PyTorch's instruction set here \(AVX2)"
NO_AVX512F = (r"(the CPU has no avx512f"
              r"|avx512f above PyTorch's instruction set here \(AVX2; (ATEN_CPU_CAPABILITY sets it"
              r"|PyTorch's choice for this CPU)\))")


def test_panel_kernels_avx512_build_builds_wherever_the_cpu_has_avx512(buildable_kernels):
    """Not a silent fallback: where the CPU reports AVX-512, a broken build of it fails here."""
    if "avx512f" in cpu_flags():
        assert panel_linear.AVX512.unavailable_reason() is None
    else:
        assert re.fullmatch(NO_AVX512F, panel_linear.AVX512.unavailable_reason())
        with pytest.raises(RuntimeError, match=f"AVX-512 build.*cannot run here: {NO_AVX512F}"):
            KERNELS["panel512 fp32"].prepare(torch.randn(16, 16), 16)


BUILDS = {"avx2": panel_linear.AVX2, "avx512": panel_linear.AVX512}


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("outputs,inputs", [(1, 1), (17, 37), (40, 9), (50, 64)])
@pytest.mark.parametrize("rows", [1, 6, 7, 8, 9, 13, 17, 31])
def test_panel_kernel_computes_any_shape_with_and_without_bias(outputs, inputs, rows, dtype, build):
    """Either build, an odd or even count of panels, row counts around each build's blocks (6 and 8)."""
    if BUILDS[build].unavailable_reason():
        pytest.skip(BUILDS[build].unavailable_reason())
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, inputs)
    packed = panel_linear.pack(weight, dtype, BUILDS[build])
    weight = weight.to(dtype).float()  # bf16 weights: the products of the rounded weights, summed in float32
    assert torch.allclose(panel_linear.linear(packed, bias, x), F.linear(x, weight, bias), atol=1e-5)
    assert torch.allclose(panel_linear.linear(packed, None, x), F.linear(x, weight), atol=1e-5)
    with pytest.raises(ValueError, match=rf"\[rows, {inputs}\]"):
        panel_linear.linear(packed, None, torch.randn(rows, inputs + 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_panel_kernels_two_builds_give_the_same_bits(dtype):
    """Both add each output's products in the order of the inputs, so a probe's choice between them
    never changes what is sampled."""
    if panel_linear.AVX512.unavailable_reason() or panel_linear.unavailable_reason():
        pytest.skip("needs both builds of the panel kernel")
    torch.manual_seed(0)
    weight, bias, x = torch.randn(100, 130), torch.randn(100), torch.randn(19, 130)
    results = [panel_linear.linear(panel_linear.pack(weight, dtype, build), bias, x) for build in BUILDS.values()]
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("build", list(BUILDS))
def test_panel_kernel_gives_a_row_the_same_bits_in_a_batch_of_any_size(build):
    """However a batch splits into blocks of rows, each output is summed in the order of the inputs:
    a row's result, so the log-probability of its sampled token, does not depend on how many rows
    decode beside it."""
    if BUILDS[build].unavailable_reason():
        pytest.skip(BUILDS[build].unavailable_reason())
    torch.manual_seed(0)
    packed = panel_linear.pack(torch.randn(40, 70), torch.float32, BUILDS[build])
    x = torch.randn(32, 70)
    whole = panel_linear.linear(packed, None, x)
    for rows in (1, 5, 7, 13, 26, 31):
        assert torch.equal(panel_linear.linear(packed, None, x[:rows]), whole[:rows]), rows


def _ties(shape) -> torch.Tensor:
    """Random float32 values, a third of them exactly halfway between two bf16 values (odd and even)."""
    bits = torch.randn(shape).view(torch.int32)
    halfway = (bits & ~0xFFFF) | 0x8000
    return torch.where(torch.rand(shape) < 0.33, halfway, bits).view(torch.float32)


@pytest.mark.parametrize("inputs", [37, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("build", list(BUILDS))
def test_panel_packing_lays_out_pytorchs_rounding_and_packs_parts_as_their_concatenation(build, dtype, inputs):
    """The panels hold W[16p + j][k] at [p, k, j] (zero past the outputs), rounded to bf16 exactly as
    PyTorch rounds, ties included; a weight given as parts (q, k and v) packs as their concatenation."""
    if BUILDS[build].unavailable_reason():
        pytest.skip(BUILDS[build].unavailable_reason())
    torch.manual_seed(inputs)
    parts = [_ties((rows, inputs)) for rows in (7, 25, 40)]
    whole = torch.cat(parts)
    expected = F.pad(whole.to(dtype), (0, 0, 0, -len(whole) % 16)).view(-1, 16, inputs).transpose(1, 2)
    for weight in (whole, parts):
        assert torch.equal(panel_linear.pack(weight, dtype, BUILDS[build]).panels.view(torch.int16),
                           expected.contiguous().view(torch.int16))


@pytest.mark.parametrize("inputs", [37, 64])
def test_dot_packing_lays_out_pytorchs_rounding_and_packs_parts_as_their_concatenation(inputs):
    """Pair i of panel p holds W[16p + j][2i], W[16p + j][2i + 1] for j = 0..15 (an odd last input and
    the outputs past the weight's zero), rounded to bf16 as PyTorch rounds."""
    if panel_dot.unavailable_reason():
        pytest.skip(panel_dot.unavailable_reason())
    torch.manual_seed(inputs)
    parts = [_ties((rows, inputs)) for rows in (7, 25, 40)]
    whole = torch.cat(parts)
    padded = F.pad(whole.bfloat16(), (0, inputs % 2, 0, -len(whole) % 16))
    expected = padded.view(-1, 16, padded.shape[1] // 2, 2).transpose(1, 2).contiguous()
    for weight in (whole, parts):
        panels = panel_dot.pack(weight).panels
        assert torch.equal(panels.view(torch.int16), expected.view(panels.shape).view(torch.int16))


def test_dot_kernel_builds_wherever_the_cpu_has_avx512_bf16(buildable_kernels):
    """Not a silent fallback: where the CPU reports the instructions it uses, a broken build fails here."""
    if {"avx512f", "avx512bw", "avx512_bf16"} <= cpu_flags():
        assert panel_dot.unavailable_reason() is None
    else:
        assert re.match(NO_AVX512, panel_dot.unavailable_reason())
        with pytest.raises(RuntimeError, match=f"cannot run here: {NO_AVX512}"):
            KERNELS["dot bf16"].prepare(torch.randn(16, 16), 16)


def test_a_kernel_that_needs_cpu_flags_is_not_loaded_where_they_are_missing(monkeypatch):
    """Its instructions would stop the process: a CPU without them gets the reason, never the library."""
    monkeypatch.setattr(native, "hardware_flags", lambda: hardware_flags() - {"avx512_bf16"})
    kernels = native.Kernels(panel_dot.SOURCE, "bf16 dot-product matmul kernel", {}, needs=("avx512_bf16",))
    reason = kernels.unavailable_reason()
    assert reason is not None and ("avx512_bf16" in reason or native.cannot_build())


@pytest.mark.parametrize("outputs,inputs", [(1, 1), (17, 37), (50, 64), (33, 575)])
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33])
def test_dot_kernel_computes_any_shape_with_and_without_bias(outputs, inputs, rows):
    if panel_dot.unavailable_reason():
        pytest.skip(panel_dot.unavailable_reason())
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, inputs)
    packed = panel_dot.pack(weight)
    # the products of bf16-rounded inputs and weights, summed in float32
    rounded_x, rounded_w = x.bfloat16().float(), weight.bfloat16().float()
    assert torch.allclose(panel_dot.linear(packed, bias, x), F.linear(rounded_x, rounded_w, bias), atol=1e-4)
    assert torch.allclose(panel_dot.linear(packed, None, x), F.linear(rounded_x, rounded_w), atol=1e-4)
    with pytest.raises(ValueError, match=rf"\[rows, {inputs}\]"):
        panel_dot.linear(packed, None, torch.randn(rows, inputs + 1))


def test_dot_kernel_rounds_its_inputs_to_bf16_as_pytorch_does():
    if panel_dot.unavailable_reason():
        pytest.skip(panel_dot.unavailable_reason())
    x = torch.randn(7, 45) * torch.logspace(-30, 30, 45)  # ties, tiny and huge values; an odd width
    x[0, :3] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)])  # exact ties: to the even neighbour
    identity = panel_dot.pack(torch.eye(45))
    assert torch.equal(panel_dot.linear(identity, None, x), x.bfloat16().float())


def test_a_failed_panel_build_says_why_and_the_other_kernels_serve(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))
    panel_linear.AVX2.forget()
    try:
        reason = panel_linear.unavailable_reason()
        if native.cannot_build():
            assert reason
            return
        assert reason.startswith("false could not build panel_gemm.c")
        with pytest.raises(RuntimeError, match=r"panel matmul kernel \(panel_gemm.c\) cannot run here: false "):
            KERNELS["panel fp32"].prepare(torch.randn(16, 16), 1)
    finally:
        panel_linear.AVX2.forget()


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_on_a_cpu_that_is_not_x86_nothing_is_built_and_each_kernel_says_why(monkeypatch, tmp_path, machine):
    """An ARM server or laptop: no compiler runs, and PyTorch's paths serve with the reason at hand."""
    monkeypatch.setattr(native.platform, "machine", lambda: machine)
    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path))
    kernels = native.Kernels(panel_linear.AVX2.source, "panel matmul kernel", {})
    assert native.cannot_build() == kernels.unavailable_reason() == f"not an x86-64 CPU ({machine})"
    with pytest.raises(RuntimeError, match=r"panel matmul kernel \(panel_gemm.c\) cannot run here: not an x86-64"):
        kernels.loaded()
    assert list(tmp_path.iterdir()) == []  # nothing compiled


def _tools_dir(tmp_path, names) -> str:
    """A directory holding links to these programs only, for a PATH without the others."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in names:
        (tools / name).symlink_to(shutil.which(name))
    return str(tools)


def test_the_compiler_is_cc_or_gcc_or_CC_and_without_one_the_kernels_say_so(buildable_kernels, monkeypatch,
                                                                             tmp_path):
    """The checks that fail a broken build (the tests above) count the compiler a build would use."""
    if not all(shutil.which(tool) for tool in ("gcc", "as", "ld")):
        pytest.skip("needs gcc and binutils on PATH")
    gcc_only = _tools_dir(tmp_path, ("gcc", "as", "ld"))  # gcc and its assembler and linker, no cc
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("POSTTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert native.cannot_build() == "no C compiler (cc, gcc or $CC)"
    monkeypatch.setenv("PATH", gcc_only)
    assert native.cannot_build() is None
    assert native.Kernels(transpose.SOURCE, "transpose kernel", {}).unavailable_reason() is None
    monkeypatch.setenv("CC", "false")
    assert native.cannot_build() is None  # $CC is what a build uses, and a failing one is a fault (test above)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    reason = native.Kernels(transpose.SOURCE, "transpose kernel", {}).unavailable_reason()
    assert reason == f"the C compiler {tmp_path / 'no-such-cc'} could not be run: No such file or directory"


def test_decode_layer_kernels_build_wherever_they_can_run(buildable_kernels):
    """Not a silent fallback: on an x86-64 CPU with AVX2 and a C compiler, a broken build fails here."""
    assert decode_layer.unavailable_reason() is None


needs_decode_layer = pytest.mark.skipif(decode_layer.unavailable_reason() is not None,
                                        reason=f"no decode layer kernels: {decode_layer.unavailable_reason()}")


def _pytorch_attention(qkv, cos, signed_sin, keys, values, col, bias, heads):
    """PyTorch's operations, attending over the cache as stored (a bf16 cache's new column rounded)."""
    kv_heads = keys.shape[1]
    qk = rotate(qkv[:, : heads + kv_heads].float(), cos.unsqueeze(1), signed_sin.unsqueeze(1))
    keys[:, :, col], values[:, :, col] = qk[:, heads:], qkv[:, heads + kv_heads :]
    return attend(qk[:, :heads], keys[:, :, : col + 1].float(), values[:, :, : col + 1].float(),
                  bias[..., : col + 1])


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-2  # bf16 keeps 8 bits; a different sum order can flip a rounding


@needs_decode_layer
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qkv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,heads,kv_heads,dim,col", [(1, 9, 3, 64, 0), (3, 4, 2, 16, 5), (5, 4, 4, 24, 7),
                                                         (2, 8, 1, 128, 40), (4, 6, 2, 80, 12), (33, 9, 3, 64, 97),
                                                         (3, 14, 2, 64, 300), (2, 5, 1, 40, 130)])
def test_attention_kernel_computes_what_pytorchs_operations_compute(rows, heads, kv_heads, dim, col, qkv_dtype,
                                                                     cache_dtype):
    """Rotary embedding, the cache write (the same bits as PyTorch writes) and grouped-query
    attention over the columns so far, with left padding masked, for any row count and head shape;
    the result in the activations' dtype."""
    torch.manual_seed(col)
    capacity = col + 3
    qkv = torch.randn(rows, heads + 2 * kv_heads, dim).to(qkv_dtype)
    cos, signed_sin = torch.randn(rows, dim), torch.randn(rows, dim)
    keys, values = (torch.randn(rows, kv_heads, capacity, dim).to(cache_dtype) for _ in range(2))
    bias = torch.zeros(rows, 1, 1, capacity)
    bias[0, ..., : col // 2] = float("-inf")  # the first row's prompt is left-padded
    expected_keys, expected_values = keys.clone(), values.clone()
    expected = _pytorch_attention(qkv, cos, signed_sin, expected_keys, expected_values, col, bias, heads)
    out = decode_layer.append_and_attend(qkv, cos, signed_sin, keys, values, col, bias, heads)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
    assert out.dtype == qkv_dtype  # the activations' dtype: what the output projection reads
    tolerance = _tolerance(qkv_dtype)
    assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance)


@needs_decode_layer
def test_attention_kernel_rejects_a_cache_that_does_not_fit():
    qkv, cos = torch.randn(2, 8, 16), torch.randn(2, 16)
    keys = torch.zeros(2, 2, 4, 16)
    with pytest.raises(ValueError, match="do not fit 6 query heads"):
        decode_layer.append_and_attend(qkv, cos, cos, keys, keys.clone(), 0, torch.zeros(2, 1, 1, 4), 6)
    with pytest.raises(ValueError, match="column 4 is outside the cache"):
        decode_layer.append_and_attend(qkv, cos, cos, keys, keys.clone(), 4, torch.zeros(2, 1, 1, 4), 4)


@needs_decode_layer
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 576), (3, 20), (64, 576)])
def test_add_rms_norm_kernel_adds_the_residual_and_normalises_as_pytorch_does(rows, hidden, dtype):
    torch.manual_seed(rows)
    x, delta, weight = torch.randn(rows, hidden), torch.randn(rows, hidden).to(dtype), torch.rand(hidden) + 0.5
    expected_x = x + delta
    expected = rms_norm(expected_x, weight, 1e-5).to(dtype)
    out = decode_layer.add_rms_norm(x, delta, weight, 1e-5, dtype)
    assert torch.equal(x, expected_x)  # the residual stream, updated in place
    assert out.dtype == dtype
    tolerance = _tolerance(dtype)
    assert torch.allclose(out.float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert torch.allclose(decode_layer.add_rms_norm(x, None, weight, 1e-5, dtype).float(), expected.float(),
                          atol=tolerance, rtol=tolerance)


@needs_decode_layer
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 13), (64, 1536)])
def test_swiglu_kernel_gates_as_pytorch_does(rows, inter, dtype):
    torch.manual_seed(inter)
    gate_up = (torch.randn(rows, 2 * inter) * 4).to(dtype)  # SiLU's far tails included
    gate, up = gate_up.float().chunk(2, dim=-1)
    expected = F.silu(gate) * up
    out = decode_layer.swiglu(gate_up)
    assert out.dtype == dtype and out.shape == (rows, inter)
    tolerance = _tolerance(dtype)
    assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance)


@needs_decode_layer
def test_decode_layer_kernels_reject_mixed_activations():
    with pytest.raises(ValueError, match="all float32 or all bf16"):
        decode_layer.add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 8), torch.ones(8), 1e-5, torch.bfloat16)
