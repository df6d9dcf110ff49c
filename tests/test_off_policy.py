"""Sampler/trainer mismatch: the logprob_mismatch metric and truncated importance sampling (TIS)."""

import math

import pytest
import torch

from posttrain.algorithms import grpo_loss, gspo_loss, logprob_mismatch, truncated_importance_weights


def test_mismatch_is_the_mean_absolute_gap_on_sampled_tokens_only():
    sampler = torch.tensor([[0.0, -1.0, -2.0, -5.0], [0.0, -0.5, 0.0, 0.0]])
    trainer = torch.tensor([[0.0, -1.5, -1.0, 9.0], [0.0, -0.25, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    # |{-1 - -1.5}| + |{-2 - -1}| + |{-0.5 - -0.25}| over 3 tokens; the masked 14 never counts.
    assert math.isclose(float(logprob_mismatch(sampler, trainer, mask)), (0.5 + 1.0 + 0.25) / 3, rel_tol=1e-6)
    assert float(logprob_mismatch(sampler, sampler, mask)) == 0.0
    assert float(logprob_mismatch(sampler, trainer, torch.zeros_like(mask))) == 0.0


def test_tis_weights_are_the_capped_probability_ratio_without_gradient():
    trainer = torch.tensor([[-1.0, -1.0, -3.0]], requires_grad=True)
    sampler = torch.tensor([[-1.0, -2.0, -1.0]])
    w = truncated_importance_weights(trainer, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, math.exp(-2.0)]]))  # e^1 = 2.72 is capped at 2
    assert not w.requires_grad
    assert torch.equal(truncated_importance_weights(trainer, sampler, cap=0.0), torch.ones(1, 3))


def _loss_and_grad(loss_fn, weights, **kw):
    logprobs = torch.tensor([[0.0, -1.0, -0.7, -2.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.1, -0.6, -2.0]])
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    loss, _ = loss_fn(logprobs, old, adv, mask, token_weights=weights, **kw)
    loss.backward()
    return loss, logprobs.grad


def test_weights_scale_each_tokens_policy_gradient():
    ones = torch.ones(1, 4)
    w = torch.tensor([[1.0, 2.0, 0.5, 1.0]])
    base_loss, base_grad = _loss_and_grad(grpo_loss, None)
    same_loss, same_grad = _loss_and_grad(grpo_loss, ones)
    assert torch.equal(base_loss, same_loss) and torch.equal(base_grad, same_grad)
    _, grad = _loss_and_grad(grpo_loss, w)
    assert torch.allclose(grad, base_grad * w)
    _, gspo_base = _loss_and_grad(gspo_loss, None)
    _, gspo_weighted = _loss_and_grad(gspo_loss, w)
    assert torch.allclose(gspo_weighted, gspo_base * w)


def test_weights_leave_the_kl_term_alone():
    logprobs = torch.tensor([[0.0, -1.0, -0.7]])
    ref = torch.tensor([[0.0, -1.5, -0.2]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    zero_adv = torch.zeros(1, 3)  # no policy-gradient term: the loss is the KL alone
    plain, _ = grpo_loss(logprobs, logprobs, zero_adv, mask, beta=0.1, ref_logprobs=ref)
    weighted, _ = grpo_loss(logprobs, logprobs, zero_adv, mask, beta=0.1, ref_logprobs=ref,
                            token_weights=torch.tensor([[1.0, 2.0, 0.0]]))
    assert torch.equal(plain, weighted) and float(plain) > 0


def one_step_run(tmp_path, *overrides: str):
    """A Trainer for one GRPO step (beta 0, TIS cap 2) on tiny-random, rewards differing row by row."""
    from posttrain.config import load_config
    from posttrain.train import Trainer

    return Trainer(load_config(None, [
        "model.name=tiny-random", "env.id=user_envs:Capitals", "train.tasks_per_step=1", "train.steps=1",
        "rollout.max_new_tokens=8", "eval.num_tasks=1", "eval.max_new_tokens=8", "eval.before_training=false",
        "algorithm.beta=0", "algorithm.tis_cap=2.0",
        "reward.components=[{name: 'user_rewards:answer_length_bonus'}]",  # differs row by row
        f"output_dir={tmp_path / 'run'}", *overrides]))


def first_train_row(tmp_path) -> dict:
    import json

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == "train"][0]


def test_bf16_rollouts_train_with_the_gap_measured_in_the_training_pass(tmp_path):
    from posttrain.models.cpu_probe import has_bf16_units, narrow_decode_kernel
    from posttrain.models.decode_kernels import FP32_KERNELS

    # A group whose rows decode on a bf16 kernel: 4 rows with bf16 units; without them, narrow steps
    # only (1-2 rows), where a bf16 kernel measured fastest for them.
    group = 4 if has_bf16_units() else 2
    if group == 2 and narrow_decode_kernel(True) in FP32_KERNELS:
        pytest.skip("no bf16 kernel is the fastest for any step on this CPU")
    trainer = one_step_run(tmp_path, f"algorithm.group_size={group}", "rollout.decode_dtype=bfloat16")
    assert not trainer.ctx.backend.same_logprobs_as_trainer
    trainer.train()
    step = first_train_row(tmp_path)
    assert 0 < step["logprob_mismatch"] < 0.1 and 0 < step["tis_weight_mean"] <= 2.0


@pytest.mark.parametrize("minibatch", [0, 2])
def test_a_training_pass_under_autocast_does_not_take_float32_samples_logprobs_as_its_own(tmp_path, minibatch):
    """float32 decoding, bf16-autocast training: the sampler's log-probs are not the training pass's,
    so they are another engine's (gap logged, TIS) rather than the old policy's; when the batch serves
    two optimiser steps, the old log-probs come from a pass of the trainer's own."""
    trainer = one_step_run(tmp_path, "algorithm.group_size=4", f"train.minibatch_size={minibatch}",
                           "model.autocast=bfloat16", "rollout.decode_dtype=float32")
    assert trainer.ctx.backend.same_logprobs_as_trainer  # the sampler is the trainer's model in float32
    trainer.train()
    step = first_train_row(tmp_path)
    assert 0 < step["logprob_mismatch"] < 0.5 and 0 < step["tis_weight_mean"] <= 2.0
