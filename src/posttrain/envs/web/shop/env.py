"""``web_shop``: buy what the instruction asks for on a generated shop website, in Chromium.

Reward (WebShop-style, Yao et al. 2022): when an order is placed, the share of the instruction's
five attributes (type, material, colour, size, price limit) the purchased item matches, 1.0 for
an exact match; an order of several items scores its best item divided by the number of items.
Progress along the way earns ``progress_reward`` once per milestone: a result page listing the
right type, the page of a product that fits, and a fitting item (colour and size) in the cart.
Shaping is potential-based: the purchase step pays the score minus what progress already paid,
so an episode's return is the purchase score (or the progress reached, when nothing was bought).
"""

from __future__ import annotations

import random
from typing import Any

from playwright.async_api import Page

from posttrain.envs.web.actions import Action
from posttrain.envs.web.env import WebEnv
from posttrain.envs.web.server import LocalServer
from posttrain.envs.web.shop.catalog import Goal, generate_catalog, goal_for, item_score, matches_product
from posttrain.envs.web.shop.site import ShopSite
from posttrain.types import Task

MILESTONES = ("category", "product", "options")


class WebShopEnv(WebEnv):
    """A shop of ``num_products`` generated products on 127.0.0.1; one instruction per task."""

    def __init__(self, num_products: int = 300, seed: int = 0, num_train: int = 500, num_eval: int = 50,
                 progress_reward: float = 0.1, max_steps: int = 15, **web: Any):
        super().__init__(max_steps=max_steps, **web)
        if num_products < 20:
            raise ValueError(f"env.kwargs.num_products must be at least 20, got {num_products}")
        if not 0 <= progress_reward * len(MILESTONES) <= 1:
            raise ValueError(f"env.kwargs.progress_reward must be in [0, {1 / len(MILESTONES):.3f}], got {progress_reward}")
        if num_train < 1 or num_eval < 1:
            raise ValueError(f"env.kwargs.num_train and num_eval must be >= 1, got {num_train}, {num_eval}")
        self.progress_reward = progress_reward
        products = generate_catalog(num_products, seed)
        self._splits = self._make_tasks(products, seed, num_train, num_eval)
        self._site = ShopSite(products)
        self._server = LocalServer(self._site.handler())
        self._reached: set[str] = set()
        self._paid = 0.0

    @staticmethod
    def _make_tasks(products, seed: int, num_train: int, num_eval: int) -> dict[str, list[Task]]:
        """Eval instructions come from a held-out sixth of the products; train from the rest, minus any
        instruction that equals an eval one."""
        rng = random.Random(f"shop-tasks-{seed}")
        order = list(products)
        rng.shuffle(order)
        held_out = order[: max(1, len(order) // 6)]
        splits: dict[str, list[Task]] = {}
        seen: set[Goal] = set()
        for split, pool, count in (("eval", held_out, num_eval), ("train", order[len(held_out):], num_train)):
            tasks: list[Task] = []
            for attempt in range(count * 20):
                if len(tasks) == count:
                    break
                goal = goal_for(pool[attempt % len(pool)] if attempt < len(pool) else rng.choice(pool), rng)
                if goal in seen:
                    continue
                seen.add(goal)
                tasks.append(Task(f"shop/{seed}/{split}/{len(tasks)}", goal.instruction(), answer=goal))
            splits[split] = tasks
        return splits

    async def _start(self, page: Page, task: Task) -> str:
        self._site.reset()
        self._reached, self._paid = set(), 0.0
        await page.goto(self.site, wait_until="domcontentloaded")
        return task.prompt

    def _progress(self, goal: Goal) -> set[str]:
        state = self._site.state
        reached = set()
        if goal.category in state.result_categories or any(
                self._site.products[p].category == goal.category for p in state.viewed):
            reached.add("category")
        if any(matches_product(goal, self._site.products[p]) for p in state.viewed):
            reached.add("product")
        items = state.cart + [i for order in state.orders for i in order]
        if any(item_score(goal, i.product, i.colour, i.size) == 1.0 for i in items):
            reached.add("options")
        return reached

    async def _outcome(self, page: Page, action: Action | None) -> tuple[float, bool, dict[str, Any]]:
        goal: Goal = self.task.answer
        new = self._progress(goal) - self._reached
        self._reached |= new
        reward = self.progress_reward * len(new)
        self._paid += reward
        info: dict[str, Any] = {"progress": sorted(self._reached), "correct": False}
        orders = self._site.state.orders
        if orders:
            order = orders[0]
            score = max(item_score(goal, i.product, i.colour, i.size) for i in order) / len(order)
            info.update(correct=score == 1.0, purchase_score=score,
                        purchased=[f"{i.product.title} ({i.colour}, {i.size}, ${i.product.price:.2f})" for i in order])
            return reward + score - self._paid, True, info
        if action is not None and action.name == "send_msg_to_user":
            info["purchase_score"] = 0.0
            return reward, True, info
        return reward, False, info

    def close(self) -> None:
        super().close()
        self._server.close()
