"""The seam between the trainer and the algorithm: modes, old log-probs, gradient clipping, row skipping."""

from pathlib import Path

import pytest
import torch

from posttrain.algorithms import Algorithm, Normaliser
from posttrain.config import AlgorithmSection, load_config
from posttrain.models.logprobs import TokenOutputs
from posttrain.train import Trainer
from posttrain.types import Batch

ROOT = Path(__file__).resolve().parents[1]


def trainer_for(tmp_path, *overrides):
    cfg = load_config(ROOT / "examples" / "tiny_smoke.yaml", [
        f"output_dir={tmp_path}", "env.id=user_envs:Capitals", "env.kwargs={}", "algorithm.beta=0",
        "rollout.max_new_tokens=8", "train.tasks_per_step=2", "algorithm.group_size=4", *overrides])
    return Trainer(cfg)


def test_policy_trains_in_train_mode_and_generates_in_eval_mode(tmp_path, monkeypatch):
    trainer = trainer_for(tmp_path, "model.lora.enabled=true", "model.lora.dropout=0.1", "model.lora.r=4")
    model, backend = trainer.policy.model, trainer.ctx.backend
    seen = []  # (grad enabled, training) of every forward of the first decoder layer
    model.get_decoder().layers[0].register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_grad_enabled(), module.training)))
    generating = []  # the model's mode as each batch of prompts is generated from
    chunk = backend._generate_chunk
    monkeypatch.setattr(backend, "_generate_chunk", lambda *a: generating.append(model.training) or chunk(*a))
    metrics = trainer.train_step()
    assert metrics["optimizer_steps"] >= 1
    with_grad = {training for grad, training in seen if grad}
    without_grad = {training for grad, training in seen if not grad}
    assert with_grad == {True}, "the update must run in train mode (LoRA dropout, activation checkpointing)"
    # generation runs the model's layers or our decode path on its weights, LoRA folded in, in eval mode
    assert generating and set(generating) == {False}, "generation must run in eval mode"
    assert without_grad <= {False}, "no-grad passes must run in eval mode"
    assert not model.training


def test_gradient_checkpointing_recomputes_activations_in_the_update(tmp_path):
    counts = {}
    for checkpointing in (False, True):
        trainer = trainer_for(tmp_path / str(checkpointing), f"model.gradient_checkpointing={checkpointing}",
                              "train.microbatch_size=8")
        trajectories, rewards, _ = trainer.sample()
        batch = trainer.batch(trajectories)
        trainer.algorithm.prepare(batch, rewards, [t.step_rewards for t in trajectories], trainer)
        calls = []
        # A sub-module of the layer: transformers keeps the layer's own hooks outside the checkpoint.
        trainer.policy.model.get_decoder().layers[0].mlp.register_forward_pre_hook(lambda m, a: calls.append(1))
        # Full-sequence forwards in both cases, so that only recomputation can make a difference.
        batch.prompt_lengths = torch.zeros_like(batch.prompt_lengths)
        trainer.update(batch)
        counts[checkpointing] = len(calls)
    assert counts[False] >= 1
    assert counts[True] == 2 * counts[False], counts  # each checkpointed layer runs again in backward


def test_minibatches_after_the_first_keep_the_sampling_policys_logprobs(tmp_path):
    # Four minibatches from one sampled batch, one pass: the policy moves after the first, so later
    # minibatches must see a ratio different from 1 (before the fix, old log-probs were replaced by
    # the current ones and the ratio was exactly 1, clipping off).
    trainer = trainer_for(tmp_path, "train.minibatch_size=2", "train.microbatch_size=2", "train.learning_rate=1e-2",
                          "rollout.temperature=0.7")
    assert trainer.algorithm.needs_old_logprobs()
    metrics = trainer.train_step()
    assert metrics["optimizer_steps"] >= 2
    assert metrics["ratio_max"] - metrics["ratio_min"] > 1e-4, metrics


def test_a_loss_that_needs_old_logprobs_and_gets_none_raises():
    algo = Algorithm(AlgorithmSection(group_size=2), max_new_tokens=4, optimizer_steps_per_batch=2)
    mask = torch.ones(2, 3)
    batch = Batch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), mask, torch.ones(2, 3),
                  torch.zeros(2, dtype=torch.long))
    outputs = TokenOutputs(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3), None)
    with pytest.raises(ValueError, match="old log-probs"):
        algo.loss(outputs, batch, Normaliser(6.0, 2.0))
    # A batch used for one optimiser step is on-policy: no old log-probs needed.
    Algorithm(AlgorithmSection(group_size=2), max_new_tokens=4).loss(outputs, batch, Normaliser(6.0, 2.0))


def test_critic_gradients_do_not_shrink_policy_steps(tmp_path):
    """With a separate critic, the policy's update is the same whatever the value loss's weight:
    the policy and the critic are clipped each on their own."""
    weights = {}
    for value_coef in (0.5, 1000.0):
        trainer = trainer_for(tmp_path / str(value_coef), "algorithm.name=ppo", "algorithm.value_model=separate",
                              "algorithm.kl_in_reward=false", f"algorithm.value_coef={value_coef}",
                              "train.learning_rate=1e-3", "train.max_grad_norm=0.1")
        metrics = trainer.train_step()
        assert metrics["optimizer_steps"] >= 1 and "critic_grad_norm" in metrics
        weights[value_coef] = torch.cat([p.detach().flatten() for p in trainer.policy.trainable_parameters()])
    torch.testing.assert_close(weights[0.5], weights[1000.0])


def test_skipping_zero_advantage_rows_leaves_the_gradient_unchanged():
    algo = Algorithm(AlgorithmSection(group_size=2), max_new_tokens=4)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    batch = Batch(torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), mask, advantages,
                  torch.zeros(4, dtype=torch.long), old_logprobs=torch.full((4, 3), -1.0))
    keep = algo.trained_rows(batch)
    assert keep.tolist() == [0, 2]
    norm = Normaliser(tokens=float(mask.sum()), sequences=4.0)

    def grad_of(rows: Batch, logprobs: torch.Tensor) -> torch.Tensor:
        leaf = logprobs.clone().requires_grad_(True)
        algo.loss(TokenOutputs(leaf, torch.zeros_like(leaf), None), rows, norm).loss.backward()
        return leaf.grad

    logprobs = torch.full((4, 3), -0.9)
    full = grad_of(batch, logprobs)
    skipped = grad_of(batch.select(keep), logprobs[keep])
    torch.testing.assert_close(full[keep], skipped)
    assert full[[1, 3]].abs().sum() == 0
    # With a KL term every row has a gradient, so none is skipped.
    assert Algorithm(AlgorithmSection(group_size=2, beta=0.1), max_new_tokens=4).trained_rows(batch).tolist() == [0, 1, 2, 3]


def test_selecting_no_rows_gives_an_empty_batch():
    # A data-parallel rank whose groups all have equal rewards trains no row but still takes part in
    # the gradient all-reduce: its empty selection must not fail (it did: max() of nothing).
    from posttrain.types import Batch

    ones = torch.ones(2, 5, dtype=torch.long)
    batch = Batch(input_ids=ones, attention_mask=ones, loss_mask=ones.float(), advantages=torch.zeros(2, 5),
                  prompt_lengths=torch.tensor([2, 2]))
    empty = batch.select(torch.tensor([], dtype=torch.long))
    assert len(empty) == 0 and empty.input_ids.shape == (0, 1)
    assert len(empty.select(torch.tensor([], dtype=torch.long))) == 0
