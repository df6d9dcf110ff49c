import pytest
import torch

from posttrain.models import load_model, load_tokenizer, native


@pytest.fixture(scope="session")
def tiny_model():
    torch.manual_seed(0)
    return load_model("tiny-random").eval()


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture
def buildable_kernels():
    """Skips, with the reason, where our C kernels cannot be built here (:func:`native.cannot_build`): a test
    that asks for it fails a broken build on a machine that could build them."""
    reason = native.cannot_build()
    if reason:
        pytest.skip(reason)
