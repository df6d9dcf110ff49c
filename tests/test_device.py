"""One config from a laptop to a GPU: model.device, per-device precision, and where tensors live."""

import pytest
import torch

from posttrain.algorithms import Normaliser
from posttrain.config import ConfigError, ModelSection, load_config
from posttrain.models.cpu_probe import bf16_training_pays, has_bf16_units
from posttrain.models.device import autocast_dtype, resolve_device, uses_packed_weights
from posttrain.rollout import sampler_dtype
from posttrain.train import Trainer
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


def test_cpu_autocast_auto_follows_a_bf16_sampler_where_bf16_training_pays():
    """A float32 sampler keeps training float32 (the sampler's log-probs stay the trainer's own); a bf16
    sampler takes bf16 training where this machine measured it clearly faster, and only there."""
    cfg, cpu = ModelSection(), torch.device("cpu")
    assert autocast_dtype(cfg, cpu, torch.float32) is None
    assert autocast_dtype(cfg, cpu, torch.bfloat16) is (torch.bfloat16 if bf16_training_pays() else None)
    assert autocast_dtype(ModelSection(autocast="none"), cpu, torch.bfloat16) is None
    assert autocast_dtype(ModelSection(dtype="bfloat16"), cpu, torch.bfloat16) is None
    if not has_bf16_units():  # emulated bf16 is slower than float32: never chosen
        assert not bf16_training_pays()



def test_the_sampler_precision_that_cpu_autocast_follows():
    """What the HF backend decodes in on this CPU: the configured decode_dtype where its fast step runs,
    float32 where it does not (plain weights, vLLM's own engine)."""
    def cfg(*overrides):
        return load_config(None, ["model.device=cpu", *overrides])

    assert sampler_dtype(cfg()) is torch.float32  # the field's default
    assert sampler_dtype(cfg("rollout.decode_dtype=bfloat16")) is torch.bfloat16
    assert sampler_dtype(cfg("rollout.decode_dtype=bfloat16", "model.pack_weights=false")) is torch.float32
    assert sampler_dtype(cfg("rollout.decode_dtype=bfloat16", "rollout.backend=vllm")) is torch.float32

def _tensors(batch: Batch) -> dict[str, torch.Tensor]:
    return {name: t for name, t in vars(batch).items() if isinstance(t, torch.Tensor)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "reinforce_pp"])
def test_batch_advantages_and_losses_live_on_the_policys_device(device, algorithm, tmp_path):
    """The trainer's own pieces, step by step: sample, batch, prepare (advantages, old logprobs,
    values, KL), loss and gradients; every tensor on the policy's device."""
    cfg = load_config(None, ["model.name=tiny-random", f"model.device={device}", f"algorithm.name={algorithm}",
                             "algorithm.group_size=4", "train.tasks_per_step=2", "rollout.max_new_tokens=8",
                             "algorithm.beta=0.04", f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    assert next(trainer.policy.model.parameters()).device.type == device
    trajectories, rewards, _ = trainer.sample()
    batch = trainer.batch(trajectories)
    rewards = rewards + torch.arange(len(rewards), device=rewards.device) % 2  # some signal in every group
    trainer.algorithm.prepare(batch, rewards, [t.step_rewards for t in trajectories], trainer,
                              trainer.behaviour_logprobs(batch, trajectories))
    with trainer._training_mode():
        outputs = trainer._forward(batch)
        result = trainer.algorithm.loss(outputs, batch, Normaliser(float(batch.loss_mask.sum()), float(len(batch))))
        result.loss.backward()
    placed = {"rewards": rewards, **_tensors(batch), "loss": result.loss,
              **{f"outputs.{k}": v for k, v in outputs._asdict().items() if v is not None}}
    assert {name: t.device.type for name, t in placed.items()} == {name: device for name in placed}
    assert batch.advantages.abs().sum() > 0 and batch.ref_logprobs is not None
    params = trainer.policy.trainable_parameters() + (list(trainer.critic.parameters()) if trainer.critic else [])
    assert all(p.grad.device.type == device for p in params if p.grad is not None)
