"""The multi-agent envs: PettingZoo's parallel API test on each, and each game's rules and payoffs."""

import random
import string
import warnings

import pytest
from pettingzoo import AECEnv
from pettingzoo.test import parallel_api_test
from pettingzoo.utils.conversions import aec_to_parallel, turn_based_aec_to_parallel

from posttrain.envs import is_multi_agent, make_env, registered
from posttrain.envs.games.negotiation import Negotiation, fits, value_of
from posttrain.envs.games.textarena_env import TextArenaGame
from posttrain.rollout.multi_agent import as_aec

MULTI_AGENT = [s.id for s in registered() if s.multi_agent]


def as_parallel(env):
    if isinstance(env, AECEnv):
        return aec_to_parallel(env) if env.metadata.get("is_parallelizable") else turn_based_aec_to_parallel(env)
    return env


@pytest.mark.parametrize("env_id", MULTI_AGENT)
def test_every_multi_agent_env_passes_parallel_api_test(env_id):
    env = make_env(env_id)
    assert is_multi_agent(env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(as_parallel(env), num_cycles=60)
    for agent in env.possible_agents:
        assert env.observation_space(agent).character_set == frozenset(string.printable)
    train, held_out = env.tasks("train"), env.tasks("eval")
    assert train and held_out and not {t.id for t in train} & {t.id for t in held_out}


HOSTILE_REPLIES = ["", "\x00\ud800", "Answer: " + "9" * 5000, "1 2 " + "3" * 5000, "\\boxed{" * 500, "x" * 100_000,
                   "```python\nimport os\nos._exit(0)\n```", "assert " + "(" * 300]


@pytest.mark.parametrize("env_id", MULTI_AGENT)
def test_any_reply_is_a_move_never_an_error(env_id):
    """An unparsable or illegal reply loses its turn; none may raise (a raise ends the game as an error,
    which is not trained on). Before: a 5,000-digit number raised int()'s ValueError in tictactoe and
    negotiation."""
    for reply in HOSTILE_REPLIES:
        env = as_aec(make_env(env_id))
        env.reset(options={"task": env.unwrapped.tasks("train")[0]})
        for _ in range(8):
            if not env.agents:
                break
            done = env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
            env.step(None if done else reply)


def test_textarena_tictactoe_passes_the_api_test_and_keeps_global_random():
    env = TextArenaGame("TicTacToe-v0")
    random.seed(123)
    expected = random.random()
    random.seed(123)
    env.reset(seed=7)
    assert random.random() == expected  # TextArena reseeded only its own random state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(turn_based_aec_to_parallel(env), num_cycles=60)


def play(env, moves):
    for move in moves:
        env.step(move)


def test_tictactoe_win_draw_and_invalid_moves():
    env = make_env("tictactoe")
    env.reset(seed=0)
    assert "0|1|2" in env.observe("x")
    play(env, ["4", "0", "2", "1", "I pick 6"])  # X: 4, 2, 6 is a diagonal
    assert env.terminations == {"x": True, "o": True}
    assert env._cumulative_rewards == {"x": 1.0, "o": -1.0}
    assert env.infos["x"]["outcome"] == "win" and env.infos["o"]["outcome"] == "loss"

    env.reset(seed=0)
    play(env, ["4", "4"])  # O plays a taken cell: loses the turn, penalty, X moves again
    assert env.agent_selection == "x" and env.rewards["o"] == pytest.approx(-0.1)
    assert "not a legal move" in env.observe("o") and "lost the turn" in env.observe("x")
    play(env, ["0", "hello", "8"])
    assert env.terminations["x"] and env.infos["o"]["invalid_moves"] == 2

    env = make_env("tictactoe", {"max_invalid": 2})
    env.reset(seed=0)
    play(env, ["nine", "4", "??"])  # X's second invalid move loses the game
    assert env.infos["x"]["outcome"] == "loss" and env._cumulative_rewards["x"] == pytest.approx(-1.2)

    env.reset(seed=0)
    play(env, ["0", "1", "2", "4", "3", "5", "7", "6", "8"])
    assert env.infos["x"]["outcome"] == "draw" and env._cumulative_rewards == {"x": 0.0, "o": 0.0}


def test_tictactoe_scripted_player_wins_and_blocks():
    env = make_env("tictactoe")
    env.reset(seed=0)
    play(env, ["0", "4", "1"])  # X threatens 2; O must block
    assert env.unwrapped.scripted_move("o", random.Random(0)) == 2
    play(env, ["8"])
    assert env.unwrapped.scripted_move("x", random.Random(0)) == 2  # X wins at 2 rather than block


@pytest.mark.parametrize("moves,payoffs", [
    (["check", "check"], 1), (["bet", "call"], 2), (["check", "bet", "call"], 2),
    (["bet", "fold"], None), (["check", "bet", "fold"], None),
])
def test_kuhn_poker_moves_chips_on_bet_and_call(moves, payoffs):
    env = make_env("kuhn_poker")
    env.reset(seed=3)
    cards = dict(env.unwrapped.cards)
    start = sum(env.unwrapped.stacks.values()) + env.unwrapped.pot
    for move in moves:
        mover, pot = env.agent_selection, env.unwrapped.pot
        stack = env.unwrapped.stacks[mover]
        play(env, [f"I {move}"])
        if move in ("bet", "call") and not env.terminations[mover]:
            assert env.unwrapped.stacks[mover] == stack - 1 and env.unwrapped.pot == pot + 1
    assert sum(env.unwrapped.stacks.values()) == start  # every chip accounted for
    rewards = env._cumulative_rewards
    assert sum(rewards.values()) == 0
    if payoffs is None:  # the folder loses its ante (and a bet it made before)
        folder = env.possible_agents[(len(moves) - 1) % 2]
        assert rewards[folder] == -1 and env.infos[folder]["outcome"] == "loss"
    else:
        winner = max(cards, key=lambda a: "JQK".index(cards[a]))
        assert rewards[winner] == payoffs and env.infos[winner]["outcome"] == "win"


def test_kuhn_poker_invalid_move_checks_or_folds():
    env = make_env("kuhn_poker")
    env.reset(seed=1)
    play(env, ["bet", "raise!"])  # player 1 faces a bet and answers nonsense: a fold
    assert env._cumulative_rewards["player_0"] == 1 and env._cumulative_rewards["player_1"] == pytest.approx(-1.1)


def test_negotiation_deal_payoffs_are_the_bundle_values():
    env = Negotiation(max_rounds=2)
    env.reset(seed=5)
    pool, values = env.pool, env.values
    alice = tuple(pool)  # everything: does not fit with any nonempty claim of bob
    obs, rewards, done, _, infos = env.step({"alice": " ".join(map(str, alice)), "bob": "1 0 0"})
    assert not any(done.values()) and rewards == {"alice": 0.0, "bob": 0.0}
    assert "do not fit" in obs["alice"]
    claim_a, claim_b = (pool[0], 0, 0), (0, pool[1], pool[2])
    assert fits([claim_a, claim_b], pool)
    obs, rewards, done, _, infos = env.step({"alice": "%d %d %d" % claim_a, "bob": "%d %d %d" % claim_b})
    assert all(done.values()) and env.agents == []
    assert rewards["alice"] == pytest.approx(value_of(claim_a, values["alice"]) / 10)
    assert rewards["bob"] == pytest.approx(value_of(claim_b, values["bob"]) / 10)
    assert value_of(pool, values["alice"]) == value_of(pool, values["bob"]) == 10


def test_negotiation_deals_two_different_valuations_of_the_pool_on_every_seed():
    env = Negotiation()
    for seed in range(300):  # seed 95's first pool is (3, 3, 3), which no valuation adds up to 10 on
        env.reset(seed=seed)
        alice, bob = env.values["alice"], env.values["bob"]
        assert alice != bob and value_of(env.pool, alice) == value_of(env.pool, bob) == 10


def test_negotiation_without_a_deal_pays_nothing_and_penalises_invalid_claims():
    env = Negotiation(max_rounds=2)
    env.reset(seed=5)
    env.step({"alice": "a lot", "bob": "9 9 9"})
    _, rewards, done, _, infos = env.step({"alice": "0 0 0", "bob": "99 0 0"})
    assert all(done.values())
    assert rewards == {"alice": 0.0, "bob": pytest.approx(-0.1)}
    assert infos["alice"]["invalid_moves"] == 1 and infos["bob"]["invalid_moves"] == 2


def test_coder_tester_shares_the_hidden_test_reward():
    env = make_env("coder_tester")
    task = next(t for t in env.tasks("train") if t.metadata["entry_point"] == "sum_of_squares")
    env.reset(options={"task": task})
    assert "sum_of_squares" in env.observe("tester")
    play(env, ["```python\nassert sum_of_squares([1, 2]) == 5\nassert sum_of_squares([]) == 0\n```"])
    assert "assert sum_of_squares([1, 2]) == 5" in env.observe("coder")
    play(env, ["```python\ndef sum_of_squares(nums):\n    return sum(x * x for x in nums)\n```"])
    assert env._cumulative_rewards == {"tester": 1.0, "coder": 1.0}
    assert env.infos["coder"]["tester_tests_passed"] == 2

    env.reset(options={"task": task})
    play(env, ["no tests from me", "def sum_of_squares(nums):\n    return 0"])
    assert env._cumulative_rewards["coder"] < 1.0
    assert env._cumulative_rewards["tester"] == pytest.approx(env._cumulative_rewards["coder"] - 0.1)


def test_coder_tester_second_round_shows_the_tester_results():
    env = make_env("coder_tester", {"rounds": 2})
    task = next(t for t in env.tasks("train") if t.metadata["entry_point"] == "sum_of_squares")
    env.reset(options={"task": task})
    play(env, ["assert sum_of_squares([3]) == 9", "def sum_of_squares(nums):\n    return 1"])
    assert not any(env.terminations.values())
    assert "0 of 1 pass" in env.observe("coder") and "0 of 1 pass" in env.observe("tester")
    play(env, ["assert sum_of_squares([3]) == 9", "def sum_of_squares(nums):\n    return sum(x * x for x in nums)"])
    assert env._cumulative_rewards == {"tester": 1.0, "coder": 1.0}
