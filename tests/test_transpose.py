"""Our transpose kernel gives exactly ``x.T``, whatever the shape, and for views whose rows are spaced apart."""

import pytest
import torch

from posttrain.models import transpose
from posttrain.models.transpose import transposed

needs_kernel = pytest.mark.skipif(transpose.unavailable_reason() is not None,
                                  reason=f"no transpose kernel: {transpose.unavailable_reason()}")


@needs_kernel
# 16 x 16 blocks, bands of 64 columns: whole blocks, ragged rows and columns, one row, one column, a wide head
# slice (both threads), a matrix too small for a block
@pytest.mark.parametrize("shape", [(64, 128), (1094, 576), (37, 45), (1, 70), (70, 1), (512, 2000), (5, 3)])
def test_transposed_is_exactly_the_transpose(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0] * shape[1]))
    out = transposed(x)
    assert out.is_contiguous() and torch.equal(out, x.t())


@needs_kernel
def test_transposed_reads_a_view_of_some_columns_or_every_other_row():
    x = torch.randn(40, 100, generator=torch.Generator().manual_seed(0))
    for view in (x[:, 10:77], x[::2], x[3:30, :16]):
        assert torch.equal(transposed(view), view.t())


def test_other_tensors_take_pytorchs_copy():
    """Not float32, not 2-D, or a column-strided view: PyTorch's copy, the same result."""
    x = torch.arange(12.0).view(3, 4)
    for view in (x.double(), x.t(), x[:, ::2]):
        assert torch.equal(transposed(view), view.t())
    with pytest.raises(RuntimeError):
        transposed(torch.zeros(2, 2, 2))


@needs_kernel
def test_scratch_results_share_one_buffer_grown_to_the_largest():
    """Weight gradients transpose into one reused buffer: each result exact, the buffer grown only when needed."""
    g = torch.Generator().manual_seed(1)
    big, small = torch.randn(300, 70, generator=g), torch.randn(40, 33, generator=g)
    first = transposed(big, scratch=True)
    assert torch.equal(first, big.t())
    second = transposed(small, scratch=True)
    assert torch.equal(second, small.t()) and second.data_ptr() == first.data_ptr()
