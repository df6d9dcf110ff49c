"""A process reward model (PRM): the probability that a solution is still on track after each step.

Steps are delimited in the token sequence itself: a step ends at the sampled token whose text holds
the delimiter (a newline by default; blank lines start no step), and at the last sampled token of
each agent turn. The model is the policy's backbone with a one-output token-classification head
(``AutoModelForTokenClassification``), read only at step ends and trained with binary
cross-entropy against each step's label: soft labels (a probability) stay soft targets.

Labels come from Math-Shepherd's Monte Carlo estimate (Wang et al. 2024, "Math-Shepherd",
arXiv:2312.08935, section 3.3): from the prefix ending at step k, sample N continuations with the
policy and score each with the environment; the soft label is the share that reach a right
answer, the hard label 1 when any does. The last step's label is the solution's own outcome.
Or, where the environment marks its steps (``info["step_correct"]``), from those marks.

As a reward, the PRM's step probabilities are dense rewards at the step ends (Math-Shepherd's
step-by-step PPO; DeepSeekMath's process supervision, Shao et al. 2024, section 4.1.3), or, not
dense, their minimum as one outcome score (Lightman et al. 2023, "Let's Verify Step by Step").
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

from posttrain.models.loading import (
    ModelLoadError,
    copy_out_of_file,
    describe_error,
    resolve_model_path,
    where_from,
)
from posttrain.rewards.reward_model import padded
from posttrain.types import Trajectory


def step_ends(tokenizer, completion_ids: list[int], loss_mask: list[int], delimiter: str = "\n") -> list[int]:
    """Completion indices of the tokens that end each step of the agent's text.

    A step ends at a sampled token containing ``delimiter`` once the step has some text (so blank
    lines make no empty steps), and at the last sampled token of each turn when text is pending.
    """
    ends, pending = [], False
    special = set(tokenizer.all_special_ids)
    for i, (token, sampled) in enumerate(zip(completion_ids, loss_mask)):
        if not sampled:
            continue
        text = "" if token in special else tokenizer.decode([token])
        if delimiter in text:
            if pending or text.split(delimiter)[0].strip():
                ends.append(i)
            pending = bool(text.rpartition(delimiter)[2].strip())
        else:
            pending = pending or bool(text.strip())
        turn_ends = i + 1 == len(completion_ids) or not loss_mask[i + 1]
        if turn_ends and pending:
            ends.append(i)
            pending = False
    return ends


def load_prm(name: str):
    """(model, tokenizer): ``name`` with a one-output token-classification head (no dropout)."""
    path = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(path, num_labels=1, classifier_dropout=0.0)
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
        copy_out_of_file(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - a damaged file raises any of a dozen types (see load_model)
        raise ModelLoadError(f"cannot load process reward model {name!r}{where_from(name, path)}: "
                             f"{describe_error(e)}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def step_logits(model, rows: list[list[int]], positions: list[list[int]], pad_id: int) -> list[torch.Tensor]:
    """Per row, the PRM's logits at ``positions`` (indices into the row), gradients flowing if enabled."""
    ids, mask = padded(rows, pad_id)
    logits = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1).float()
    return [logits[b, torch.tensor(p, dtype=torch.long)] for b, p in enumerate(positions)]


def prm_loss(logits: list[torch.Tensor], labels: list[list[float]]) -> torch.Tensor:
    """Binary cross-entropy at every step end, averaged over steps; soft labels are probability targets."""
    flat = torch.cat(logits)
    target = torch.tensor([y for row in labels for y in row], dtype=flat.dtype)
    return F.binary_cross_entropy_with_logits(flat, target)


class ProcessRewardScorer:
    """``reward.components: [{name: prm, kwargs: {path: DIR, dense: true}}]``.

    ``dense``: each step's probability is a reward at its end token; otherwise the minimum over the
    steps is one score for the trajectory.
    """

    def __init__(self, path: str, dense: bool = True, delimiter: str = "\n", batch_size: int = 16):
        if not (Path(path) / "config.json").is_file():
            raise ModelLoadError(f"process reward model {path!r}: no config.json "
                                 "(train one with `posttrain prm train`)")
        self.model, self.tokenizer = load_prm(path)
        self.model.eval().requires_grad_(False)
        self.is_dense, self.delimiter, self.batch_size = dense, delimiter, batch_size

    @torch.no_grad()
    def step_probabilities(self, trajectories: list[Trajectory]) -> list[list[tuple[int, float]]]:
        """Per trajectory, ``(completion index of the step end, probability the solution is on track)``."""
        out: list[list[tuple[int, float]]] = []
        pad = int(self.tokenizer.pad_token_id)
        for s in range(0, len(trajectories), self.batch_size):
            chunk = trajectories[s : s + self.batch_size]
            ends = [step_ends(self.tokenizer, t.completion_ids, t.loss_mask, self.delimiter) or
                    [len(t.completion_ids) - 1] for t in chunk]
            rows = [t.prompt_ids + t.completion_ids for t in chunk]
            positions = [[len(t.prompt_ids) + e for e in e_list] for t, e_list in zip(chunk, ends)]
            logits = step_logits(self.model, rows, positions, pad)
            out += [list(zip(e_list, torch.sigmoid(lg).tolist())) for e_list, lg in zip(ends, logits)]
        return out

    def dense(self, trajectories: list[Trajectory]) -> list[list[tuple[int, float]]]:
        return self.step_probabilities(trajectories)

    def score(self, trajectories: list[Trajectory], group_size: int = 1) -> list[float]:
        return [min(p for _, p in steps) if steps else 0.0 for steps in self.step_probabilities(trajectories)]
