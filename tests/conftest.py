import pytest
import torch

from posttrain.models import load_model, load_tokenizer


@pytest.fixture(scope="session")
def tiny_model():
    torch.manual_seed(0)
    return load_model("tiny-random").eval()


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("tiny-random")
