"""Multi-agent episodes token in / token out, and the self-play advantage estimators."""

import pytest
import torch

from posttrain.algorithms import group_relative_advantages, keyed_group_advantages, role_conditioned_advantages
from posttrain.envs import make_env
from posttrain.envs.games.tictactoe import TicTacToe
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, encode_prompt, observation_delta
from posttrain.rollout.multi_agent import FixedPlayer, LLMPlayer, run_games


def segments(traj):
    """The trajectory's completion as runs of (mask bit, ids)."""
    runs = []
    for tok, bit in zip(traj.completion_ids, traj.loss_mask):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(tok)
        else:
            runs.append((bit, [tok]))
    return runs


@pytest.fixture
def backend(tiny_model, tokenizer):
    return HFBackend(tiny_model, tokenizer, seed=0)


def test_self_play_gives_each_seat_its_own_token_exact_trajectory(backend, tokenizer):
    pool = EnvPool(lambda: make_env("tictactoe"))
    me = LLMPlayer("policy", backend)
    task = pool.tasks("train")[0]
    (game,) = run_games(pool, [task], [{"x": me, "o": me}], tokenizer, SamplingParams(max_new_tokens=4))
    assert game.error is None and set(game.trajectories) == {"x", "o"}
    first_x = TicTacToe()
    first_x.reset(seed=task.metadata["seed"])
    x = game.trajectories["x"]
    assert x.prompt_ids == encode_prompt(tokenizer, first_x.observe("x"))
    for role, traj in game.trajectories.items():
        runs = segments(traj)
        sampled = [ids for bit, ids in runs if bit == 1]
        observed = [ids for bit, ids in runs if bit == 0]
        assert len(sampled) == len(traj.steps) == game.outcomes[role].turns
        # Every observation after a move is the chat-template delta of what the env said next.
        for ids, step, turn in zip(observed, traj.steps, sampled):
            eos = turn[-1] == tokenizer.eos_token_id
            assert ids == observation_delta(tokenizer, step.observation, eos)
        assert traj.num_sampled_tokens == sum(len(s) for s in sampled)
        assert len(traj.behaviour_logprobs) == len(traj.completion_ids)
        assert traj.reward == pytest.approx(sum(traj.step_rewards)) == pytest.approx(game.outcomes[role].reward)
        assert traj.metadata["role"] == role and traj.metadata["player"] == "policy"
    outcomes = {o.outcome for o in game.outcomes.values()}
    assert outcomes in ({"win", "loss"}, {"draw"})


def test_fixed_opponents_and_groups_of_games_per_seed(backend, tokenizer):
    pool = EnvPool(lambda: make_env("kuhn_poker"))
    me = LLMPlayer("policy", backend)
    task = pool.tasks("train")[4]
    lineups = [{"player_0": me, "player_1": FixedPlayer("scripted")},
               {"player_0": FixedPlayer("random"), "player_1": me}] * 2
    games = run_games(pool, [task] * 4, lineups, tokenizer, SamplingParams(max_new_tokens=4))
    for game, lineup in zip(games, lineups):
        llm_role = next(r for r, p in lineup.items() if isinstance(p, LLMPlayer))
        assert set(game.trajectories) == {llm_role}
        assert game.outcomes["player_0"].player in ("policy", "random")
        payoffs = [o.payoff for o in game.outcomes.values()]
        assert sum(payoffs) == 0 and all(o.outcome in ("win", "loss") for o in game.outcomes.values())
        # The same seed deals the same cards in each game of the group.
        assert game.task.id == task.id


def test_parallel_env_rounds_and_unparsable_moves_are_data(backend, tokenizer):
    pool = EnvPool(lambda: make_env("negotiation", {"max_rounds": 2}))
    me = LLMPlayer("policy", backend)
    games = run_games(pool, pool.tasks("train")[:2], [{"alice": me, "bob": FixedPlayer("scripted")}] * 2, tokenizer,
                      SamplingParams(max_new_tokens=3))
    for game in games:
        assert game.error is None
        alice = game.outcomes["alice"]
        assert alice.turns in (1, 2)
        assert alice.reward == pytest.approx(alice.payoff - 0.1 * alice.invalid_moves)


class BrokenTicTacToe(TicTacToe):
    def _play(self, agent, move):
        raise RuntimeError("the env broke")


def test_an_env_that_raises_ends_its_game_with_an_error(backend, tokenizer):
    pool = EnvPool(lambda: BrokenTicTacToe(max_invalid=9))
    me = LLMPlayer("policy", backend)
    (game,) = run_games(pool, pool.tasks("train")[:1], [{"x": FixedPlayer("random"), "o": me}], tokenizer,
                        SamplingParams(max_new_tokens=2))
    assert "the env broke" in game.error
    assert all(t.error == game.error and t.reward == 0.0 for t in game.trajectories.values())


def test_role_conditioned_advantages_follow_the_moving_average():
    rewards = torch.tensor([1.0, -1.0, 1.0, 0.0])
    keys = [("ttt", "x"), ("ttt", "o"), ("ttt", "x"), ("ttt", "o")]
    adv, baselines = role_conditioned_advantages(rewards, keys, {("ttt", "x"): 0.5})
    bx1 = 0.95 * 0.5 + 0.05 * 1.0
    bo1 = 0.05 * -1.0
    bx2 = 0.95 * bx1 + 0.05 * 1.0
    bo2 = 0.95 * bo1
    assert adv.tolist() == pytest.approx([1 - bx1, -1 - bo1, 1 - bx2, 0 - bo2])
    assert baselines == pytest.approx({("ttt", "x"): bx2, ("ttt", "o"): bo2})
    with pytest.raises(ValueError):
        role_conditioned_advantages(rewards, keys[:3], {})


def test_keyed_groups_equal_grpo_on_contiguous_groups_and_separate_roles():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0])
    contiguous = keyed_group_advantages(rewards, ["a", "a", "a", "b", "b", "b"])
    assert torch.allclose(contiguous, group_relative_advantages(rewards, 3))
    # X always wins, O always loses: per-role groups see no signal, pooled ones credit the seat.
    seat = torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert keyed_group_advantages(seat, [("s", "x"), ("s", "o")] * 2).abs().sum() == 0
    assert keyed_group_advantages(seat, ["s"] * 4).abs().sum() > 0
