"""An outcome reward model: a scalar head on the policy's backbone, trained Bradley-Terry on preference pairs.

Bradley & Terry (1952) model P(chosen > rejected) = sigmoid(r(chosen) - r(rejected)); a reward model
fits r by minimising -log sigmoid(r_c - r_r) over preference pairs (Ouyang et al. 2022, section
3.5), here the success/failure pairs of a trajectory store (:mod:`posttrain.data.pairs`). The model
is ``AutoModelForSequenceClassification`` with one label: the backbone's last hidden state at the
sequence's last token, through a fresh linear head. Scores read the exact token ids of a
trajectory (prompt and completion), so the reward model must share the policy's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from posttrain.data.pairs import PreferencePair
from posttrain.models.loading import (
    ModelLoadError,
    copy_out_of_file,
    describe_error,
    resolve_model_path,
    where_from,
)
from posttrain.types import Trajectory


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coefficient: float = 0.0) -> torch.Tensor:
    """Mean of -log sigmoid(r_c - r_r - margin), plus ``center_coefficient`` x mean((r_c + r_r)^2).

    The margin (Touvron et al. 2023, Llama 2, section 3.2.2) asks for a larger gap on pairs that
    differ more; the centring term (Eisenstein et al. 2023) keeps the scores near 0, which the
    Bradley-Terry likelihood alone leaves free (it depends only on differences).
    """
    gap = chosen - rejected if margin is None else chosen - rejected - margin
    loss = -F.logsigmoid(gap).mean()
    if center_coefficient:
        loss = loss + center_coefficient * ((chosen + rejected) ** 2).mean()
    return loss


def load_reward_model(name: str):
    """(model, tokenizer): ``name`` (preset, directory or hub id) with a one-label sequence-classification head."""
    path = resolve_model_path(name)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        copy_out_of_file(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - a damaged file raises any of a dozen types (see load_model)
        raise ModelLoadError(f"cannot load reward model {name!r}{where_from(name, path)}: "
                             f"{describe_error(e)}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The head reads the last token that is not padding; it must know which id pads.
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def sequence_ids(trajectory: Trajectory, max_length: int) -> list[int]:
    """Prompt and completion ids, cut to the last ``max_length`` (the answer is at the end)."""
    return (trajectory.prompt_ids + trajectory.completion_ids)[-max_length:]


def padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def scores(model, rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """``[N]`` scalar rewards of token-id sequences (gradients flow when enabled)."""
    ids, mask = padded(rows, pad_id)
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits.squeeze(-1).float()


def pair_rows(pairs: list[PreferencePair], max_length: int) -> list[list[int]]:
    """The chosen sequences, then the rejected ones (the layout of TRL's preference collator)."""
    return ([sequence_ids(p.chosen, max_length) for p in pairs]
            + [sequence_ids(p.rejected, max_length) for p in pairs])


def pair_loss(model, pairs: list[PreferencePair], pad_id: int, max_length: int,
              center_coefficient: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(Bradley-Terry loss, ``[P]`` chosen-minus-rejected score gaps) of a batch of pairs."""
    r = scores(model, pair_rows(pairs, max_length), pad_id)
    chosen, rejected = r.chunk(2)
    return bradley_terry_loss(chosen, rejected, center_coefficient=center_coefficient), (chosen - rejected).detach()


@torch.no_grad()
def pairwise_accuracy(model, pairs: list[PreferencePair], pad_id: int, max_length: int, batch: int = 8) -> float:
    """Share of pairs whose chosen trajectory scores strictly higher than the rejected one."""
    if not pairs:
        return float("nan")
    model.eval()
    right = 0
    for s in range(0, len(pairs), batch):
        _, gap = pair_loss(model, pairs[s : s + batch], pad_id, max_length)
        right += int((gap > 0).sum())
    return right / len(pairs)


class RewardModelScorer:
    """``reward.components: [{name: reward_model, kwargs: {path: DIR}}]``: a trained reward model's score."""

    def __init__(self, path: str, batch_size: int = 16, max_length: int = 1024):
        if not (Path(path) / "config.json").is_file():
            raise ModelLoadError(f"reward model {path!r}: no config.json (train one with `posttrain rm train`)")
        self.model, tokenizer = load_reward_model(path)
        self.model.eval().requires_grad_(False)
        self.pad_id = int(tokenizer.pad_token_id)
        self.batch_size, self.max_length = batch_size, max_length

    @torch.no_grad()
    def score(self, trajectories: list[Trajectory], group_size: int = 1) -> list[float]:
        rows = [sequence_ids(t, self.max_length) for t in trajectories]
        out: list[float] = []
        for s in range(0, len(rows), self.batch_size):
            out += scores(self.model, rows[s : s + self.batch_size], self.pad_id).tolist()
        return out
