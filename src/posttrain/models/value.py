"""The critic for PPO: V(s_t) for every sampled token.

Two shapes, chosen by ``algorithm.value_model``:
- ``head``: a linear head on the policy's own trunk. Values come out of the policy's forward
  pass for free, and the value loss also trains the shared trunk (as in the original PPO for
  Atari with a shared network).
- ``separate``: a copy of the policy's trunk with its own head, initialised from the policy
  (Ouyang et al. 2022 initialise the critic from a pretrained model); twice the compute and
  memory, but the value loss cannot disturb the policy's features.

The head is zero-initialised, so every value starts at 0 and the first advantages are the
plain returns.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import nn

from posttrain.models.logprobs import predictor_states


class Critic(nn.Module):
    def __init__(self, policy_model: nn.Module, mode: Literal["head", "separate"]):
        super().__init__()
        decoder = policy_model.get_decoder()
        self.mode = mode
        self.head = nn.Linear(decoder.config.hidden_size, 1, device=next(decoder.parameters()).device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.trunk = None
        if mode == "separate":
            self.trunk = copy.deepcopy(decoder)
            self.trunk.requires_grad_(True)
        # The policy's trunk, kept outside nn.Module's registry so that the critic's
        # parameters() (its optimiser group) never include the policy's weights.
        object.__setattr__(self, "_policy_trunk", decoder)

    def values(self, input_ids, attention_mask, positions=None, prompt_lengths=None) -> torch.Tensor:
        """``[B, T]`` values of the states in which the ``positions`` tokens were chosen.

        A values-only pass (no LM head). During the policy update of a head-mode critic the values
        come from :func:`posttrain.models.logprobs.policy_forward` with ``value_head=critic.head``
        instead, sharing the policy's forward pass.
        """
        trunk = self.trunk if self.trunk is not None else self._policy_trunk
        rows, want = predictor_states(trunk, input_ids, attention_mask, positions, prompt_lengths)
        out = torch.zeros(want.shape, dtype=torch.float32, device=want.device)
        return out.masked_scatter(want, self.head(rows).squeeze(-1).float())
