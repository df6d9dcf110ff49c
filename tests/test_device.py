"""One config from a laptop to a GPU: model.device, per-device precision, and where tensors live."""

import pytest
import torch

from posttrain.algorithms.objective import loss as algorithm_loss
from posttrain.algorithms.objective import token_advantages
from posttrain.config import ConfigError, ModelSection, load_config
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models import Policy
from posttrain.models.device import autocast_dtype, resolve_device, uses_packed_weights
from posttrain.rollout import EnvPool, SamplingParams, make_backend, run_episodes
from posttrain.types import Batch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_auto_is_cuda_exactly_when_torch_sees_a_gpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="model.device=cuda:1: this torch .* sees no CUDA GPU; use model.device=auto"):
        resolve_device("cuda:1")


def test_device_names_are_validated():
    with pytest.raises(ConfigError, match="'model.device': Value error, expected auto, cpu, cuda or cuda:N"):
        load_config(None, ["model.device=gpu"])
    assert load_config(None, ["model.device=cuda:3"]).model.device == "cuda:3"


def test_precision_defaults_follow_the_device():
    cfg = ModelSection()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert autocast_dtype(cfg, cpu) is None and autocast_dtype(cfg, cuda) is torch.bfloat16
    assert autocast_dtype(ModelSection(autocast="none"), cuda) is None
    assert autocast_dtype(ModelSection(autocast="bfloat16"), cpu) is torch.bfloat16
    assert autocast_dtype(ModelSection(dtype="bfloat16"), cuda) is None  # bf16 weights need no autocast
    assert uses_packed_weights(cfg, cpu) and not uses_packed_weights(cfg, cuda)


def _tensors(batch: Batch) -> dict[str, torch.Tensor]:
    return {name: t for name, t in vars(batch).items() if isinstance(t, torch.Tensor)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_batch_advantages_and_losses_live_on_the_policys_device(device, algorithm):
    cfg = load_config(None, ["model.name=tiny-random", f"model.device={device}", f"algorithm.name={algorithm}",
                             "algorithm.group_size=4"])
    policy = Policy.load(cfg.model)
    assert next(policy.model.parameters()).device.type == device
    backend = make_backend(cfg, policy)
    tasks = ArithmeticEnv().tasks("train")[:2]
    trajectories = run_episodes(EnvPool(ArithmeticEnv), backend, policy.tokenizer, tasks,
                                SamplingParams(max_new_tokens=8), num_samples=4)
    batch = Batch.from_trajectories(trajectories, policy.pad_id, policy.device)
    rewards = torch.tensor([float(i % 2) for i in range(len(trajectories))], device=policy.device)
    outputs = policy.forward(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
    if algorithm == "ppo":
        from posttrain.models.value import Critic

        critic = Critic(policy.model, "head")
        batch.old_values = critic.values(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
        outputs = policy.forward(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths,
                                 value_head=critic.head)
    batch.old_logprobs = outputs.logprobs.detach()
    batch.advantages, batch.returns = token_advantages(cfg.algorithm, rewards, batch.loss_mask,
                                                       values=batch.old_values)
    loss, stats = algorithm_loss(cfg.algorithm, outputs, batch, beta=0.0, total_tokens=float(batch.loss_mask.sum()),
                                 total_sequences=float(len(batch)), max_new_tokens=8)
    loss.backward()
    placed = {**_tensors(batch), "loss": loss, **stats, **{f"outputs.{k}": v for k, v in outputs._asdict().items()
                                                             if v is not None}}
    assert {name: t.device.type for name, t in placed.items()} == {name: device for name in placed}
    assert all(p.grad.device.type == device for p in policy.trainable_parameters() if p.grad is not None)

