"""The Bradley-Terry reward-model loss agrees with TRL 1.16's RewardTrainer on the same model and inputs.

TRL computes the loss in ``RewardTrainer.compute_loss``; we call it on a minimal stand-in for the
trainer's state (its accelerator, metrics and args), with the batch built by TRL's own
``DataCollatorForPreference`` from the pairs' token ids, and the same tiny-random sequence
classification model that our loss runs.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.reward_trainer import DataCollatorForPreference, RewardTrainer

from posttrain.data.pairs import PreferencePair
from posttrain.rewards.reward_model import bradley_terry_loss, load_reward_model, pair_loss
from posttrain.types import Task, Trajectory


class _SingleProcess:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather


def _traj(prompt, completion, reward):
    return Trajectory(Task("t", "q"), prompt, completion, [1] * len(completion), [0.0] * len(completion),
                      reward=reward)


def _pairs(seed, n=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(3, 400, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 400, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(3, 400, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        out.append(PreferencePair(_traj(prompt, c + [2], 1.0), _traj(prompt, r + [2], 0.0)))
    return out


@pytest.fixture(scope="module")
def reward_model():
    torch.manual_seed(0)
    model, tokenizer = load_reward_model("tiny-random")
    torch.nn.init.normal_(model.score.weight, std=0.5)  # a non-trivial head, so scores differ
    return model.eval(), tokenizer


@pytest.mark.parametrize("center", [None, 0.01])
@pytest.mark.parametrize("seed", [0, 1])
def test_bradley_terry_loss_matches_trl(reward_model, seed, center):
    model, tok = reward_model
    pairs = _pairs(seed)
    examples = [{"chosen_ids": p.chosen.prompt_ids + p.chosen.completion_ids,
                 "rejected_ids": p.rejected.prompt_ids + p.rejected.completion_ids} for p in pairs]
    inputs = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(examples)
    state = SimpleNamespace(model=model, accelerator=_SingleProcess(), _tp_size=1, _total_train_tokens=0,
                            args=SimpleNamespace(center_rewards_coefficient=center),
                            _metrics=defaultdict(lambda: defaultdict(list)))
    with torch.no_grad():
        expected = RewardTrainer.compute_loss(state, model, inputs)
        ours, gaps = pair_loss(model, pairs, tok.pad_token_id, max_length=1024, center_coefficient=center or 0.0)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    assert state._metrics["eval"]["accuracy"][0] == pytest.approx(float((gaps > 0).float().mean()))


def test_bradley_terry_loss_values():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0])
    expected = -(torch.log(torch.sigmoid(torch.tensor(2.0))) + torch.log(torch.tensor(0.5))) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected.item())
    assert bradley_terry_loss(chosen, rejected, center_coefficient=1.0).item() == pytest.approx(expected.item() + 2.0)
    assert bradley_terry_loss(chosen, rejected, margin=torch.tensor([2.0, 0.0])).item() == pytest.approx(
        -torch.log(torch.tensor(0.5)).item())
