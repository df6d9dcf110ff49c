"""The web_shop env in real Chromium: the expert buys exactly, partial purchases get partial
credit, progress is rewarded once per milestone, random play buys nothing right."""

import pytest
from gymnasium.utils.env_checker import check_env

from posttrain.envs import make_env
from posttrain.envs.web import WebShopEnv
from posttrain.envs.web.experts import RandomPolicy, ShopExpert
from posttrain.envs.web.shop.catalog import Goal, generate_catalog, item_score


@pytest.fixture(scope="module")
def shop():
    env = make_env("web_shop", {"num_products": 300, "num_eval": 20})
    yield env
    env.close()


def play(env, task, policy, max_steps=20):
    obs, _ = env.reset(options={"task": task})
    rewards, info = [], {}
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        rewards.append(reward)
        if terminated or truncated:
            break
    return rewards, info


def test_catalog_and_splits_are_seeded_and_disjoint(shop):
    assert generate_catalog(300, seed=0) == generate_catalog(300, seed=0) != generate_catalog(300, seed=1)
    train, held_out = shop.tasks("train"), shop.tasks("eval")
    assert len(held_out) == 20 and len(train) == 500
    assert not {t.answer for t in train} & {t.answer for t in held_out}
    assert held_out[0].prompt.startswith("Buy ") and "in size" in held_out[0].prompt


@pytest.mark.parametrize("index", range(5))
def test_expert_buys_exactly(shop, index):
    rewards, info = play(shop, shop.tasks("eval")[index * 3], ShopExpert())
    assert info["correct"] and info["purchase_score"] == 1.0
    assert sum(rewards) == pytest.approx(1.0)  # progress rewards are paid back at the purchase
    assert info["progress"] == ["category", "options", "product"]
    assert [r for r in rewards if r > 0][:3] == pytest.approx([0.1, 0.1, 0.1])


def test_wrong_size_gets_partial_credit(shop):
    task = shop.tasks("eval")[1]
    goal: Goal = task.answer
    product = next(p for p in shop._site.products.values()
                   if p.category == goal.category and p.material == goal.material and goal.colour in p.colours
                   and any(s != goal.size for s in p.sizes) and p.price <= goal.max_price)
    other = next(s for s in product.sizes if s != goal.size)
    assert item_score(goal, product, goal.colour, other) == 0.8
    obs, _ = shop.reset(options={"task": task})
    obs, total, *_ = shop.step(f"goto('/product/{product.id}')")
    assert total == pytest.approx(0.2)  # the right type and a fitting product, at once
    boxes = [line.split("]")[0].strip()[1:] for line in obs.splitlines() if "combobox" in line]
    add = next(line.split("]")[0].strip()[1:] for line in obs.splitlines() if "button 'Add to cart'" in line)
    for action in [f"select_option('{boxes[0]}', '{goal.colour}')", f"select_option('{boxes[1]}', '{other}')",
                   f"click('{add}')", "goto('/checkout')"]:
        obs, reward, terminated, _, info = shop.step(action)
        assert not info["last_action_error"] and not terminated
        total += reward
    place = next(line.split("]")[0].strip()[1:] for line in obs.splitlines() if "button 'Place order'" in line)
    obs, reward, terminated, _, info = shop.step(f"click('{place}')")
    assert terminated and not info["correct"] and info["purchase_score"] == 0.8
    assert total + reward == pytest.approx(0.8)
    assert "Thank you" in obs


def test_random_policy_buys_nothing_right(shop):
    policy = RandomPolicy(seed=1)
    outcomes = [play(shop, task, policy, max_steps=12)[1] for task in shop.tasks("eval")[:5]]
    assert sum(info.get("correct", False) for info in outcomes) <= 1


def test_goto_stays_on_the_site(shop):
    shop.reset(options={"task": shop.tasks("eval")[0]})
    _, _, _, _, info = shop.step("goto('http://127.0.0.2:9/')")
    assert "outside the site" in info["last_action_error"]
    obs, _, _, _, info = shop.step("goto('/search?q=wool+socks')")
    assert not info["last_action_error"] and "Search results" in obs


def test_check_env():
    env = WebShopEnv(num_products=40, num_train=20, num_eval=5)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()
