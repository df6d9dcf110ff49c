"""MiniWoB++ (Shi et al. 2017; Liu et al. 2018): small web tasks, each one seeded page.

The task pages ship inside the ``miniwob`` wheel (``miniwob/html``, with ``core/core.js``); the
env serves them from 127.0.0.1 and opens one per episode. An episode is seeded with
``Math.seedrandom(seed)`` before ``core.startEpisodeReal()``, so a (task, seed) pair is the same
problem every time. The page scores itself: when ``WOB_DONE_GLOBAL`` turns true,
``WOB_RAW_REWARD_GLOBAL`` is 1 for success and -1 (or a partial score) otherwise; the env's
reward is ``max(raw, 0)``, the convention of BrowserGym's MiniWoB tasks. MiniWoB's 10-second
episode timer is lifted: a language model on a CPU thinks slower than that, and time is not
what is being measured here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from playwright.async_api import Page

from posttrain.envs.web.actions import Action
from posttrain.envs.web.env import WebEnv
from posttrain.envs.web.server import LocalServer
from posttrain.types import Task

# Tiers by how much a text-only agent must do: one or two actions on named elements (easy);
# several actions, reading values or following a list (medium); longer or widget-heavy tasks
# that still work through the accessibility tree (hard). Tasks that need drawing, dragging or
# pixel coordinates are left out.
TIERS: dict[str, tuple[str, ...]] = {
    "easy": ("click-test", "click-test-2", "click-button", "click-link", "click-dialog", "click-dialog-2",
             "enter-text", "enter-password", "focus-text", "focus-text-2", "login-user", "click-button-sequence",
             "unicode-test"),
    "medium": ("click-checkboxes", "click-checkboxes-soft", "click-checkboxes-large", "click-option", "choose-list",
               "click-tab", "click-collapsible-nodelay", "click-widget", "enter-text-2", "enter-text-dynamic",
               "login-user-popup", "multi-orderings", "multi-layouts", "simple-arithmetic", "odd-or-even",
               "read-table", "text-transform", "find-word", "click-menu-2", "use-spinner"),
    "hard": ("click-checkboxes-transfer", "click-collapsible-2-nodelay", "click-tab-2", "click-tab-2-hard",
             "click-scroll-list", "enter-date", "enter-time", "form-sequence", "form-sequence-2", "form-sequence-3",
             "read-table-2", "simple-algebra", "navigate-tree", "social-media", "social-media-all",
             "social-media-some", "search-engine", "email-inbox", "email-inbox-delete", "email-inbox-forward",
             "email-inbox-reply", "email-inbox-star-reply", "email-inbox-important", "phone-book",
             "use-autocomplete-nodelay", "book-flight-nodelay", "choose-date-nodelay", "terminal", "guess-number",
             "copy-paste", "copy-paste-2", "click-menu", "stock-market", "sign-agreement"),
}
EVAL_SEED_OFFSET = 1_000_000  # eval seeds start here, so no train seed is ever an eval seed

# Starts a seeded episode in a loaded task page and returns its utterance, in one page call (a
# style tag, a wait for the task and the start as three Playwright calls cost three round trips and
# an animation frame: about half of a reset). The timer and reward overlays are hidden; a task that
# loads data first says so with WOB_TASK_READY, polled here until true or `waitMs` has passed.
_START_JS = """async ([seed, waitMs]) => {
  if (!document.getElementById('posttrain-hide')) {
    const style = document.createElement('style');
    style.id = 'posttrain-hide';
    style.textContent = '#reward-display, #sync-task-cover, #timer-countdown { display: none !important; }';
    (document.head || document.documentElement).appendChild(style);
  }
  const until = Date.now() + waitMs;
  while (typeof WOB_TASK_READY !== 'undefined' && WOB_TASK_READY !== true) {
    if (Date.now() > until) throw new Error('the task page did not get ready within ' + waitMs + ' ms');
    await new Promise((done) => setTimeout(done, 10));
  }
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = 2000000000;
  core.startEpisodeReal();
  return core.getUtterance();
}"""
_RESULT_JS = "() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]"


def miniwob_html_dir() -> str:
    """The task pages inside the installed ``miniwob`` wheel."""
    try:
        import miniwob
    except ImportError:
        raise ValueError("the miniwob env needs the 'miniwob' package: pip install 'posttrain[web]'") from None
    return os.path.join(os.path.dirname(miniwob.__file__), "html")


class MiniWoBEnv(WebEnv):
    """MiniWoB++ task pages in Chromium; a task is a (page, seed) pair."""

    def __init__(self, tasks: Sequence[str] | None = None, tier: str = "easy", train_seeds: int = 500,
                 eval_seeds: int = 20, reuse_page: bool = True, pages_kept: int = 16, **web: Any):
        super().__init__(reuse_page=reuse_page, pages_kept=pages_kept, **web)
        if tasks is None:
            if tier not in TIERS and tier != "all":
                raise ValueError(f"env.kwargs.tier must be one of {', '.join([*TIERS, 'all'])}, got {tier!r}")
            tasks = [t for name, names in TIERS.items() if tier in (name, "all") for t in names]
        html = miniwob_html_dir()
        missing = [t for t in tasks if not os.path.exists(os.path.join(html, "miniwob", f"{t}.html"))]
        if missing or not tasks:
            raise ValueError(f"env.kwargs.tasks: unknown MiniWoB task(s) {missing or '(none given)'}; "
                             f"the pages are in {os.path.join(html, 'miniwob')}")
        if train_seeds < 1 or eval_seeds < 1:
            raise ValueError(f"env.kwargs.train_seeds and eval_seeds must be >= 1, got {train_seeds}, {eval_seeds}")
        self.task_names = list(tasks)
        self._splits = {
            "train": [self._task(name, seed) for seed in range(train_seeds) for name in self.task_names],
            "eval": [self._task(name, EVAL_SEED_OFFSET + seed) for seed in range(eval_seeds) for name in self.task_names],
        }
        self._server = LocalServer.static(html)

    @staticmethod
    def _task(name: str, seed: int) -> Task:
        return Task(f"miniwob/{name}/{seed}", f"MiniWoB++ {name}, seed {seed}", metadata={"task": name, "seed": seed})

    async def _start(self, page: Page, task: Task) -> str:
        await page.goto(f"{self.site}miniwob/{task.metadata['task']}.html", wait_until="load")
        return await self._start_episode(page, task)

    def _page_key(self, task: Task) -> str:
        return task.metadata["task"]

    async def _restart(self, page: Page, task: Task) -> str | None:
        """The next episode in the page of the last one: in the same task page, reseed and restart it
        (as MiniWoB++'s own env does); another task's page loads in the same tab."""
        if not page.url.endswith(f"/miniwob/{task.metadata['task']}.html"):
            return await self._start(page, task)
        return await self._start_episode(page, task)

    async def _start_episode(self, page: Page, task: Task) -> str:
        return await page.evaluate(_START_JS, [int(task.metadata["seed"]), self.load_timeout * 1000])

    async def _outcome(self, page: Page, action: Action | None) -> tuple[float, bool, dict[str, Any]]:
        done, raw, reason = await page.evaluate(_RESULT_JS)
        if done:
            reward = max(float(raw), 0.0)
            return reward, True, {"correct": reward >= 1.0, "raw_reward": float(raw), "reason": reason}
        if action is not None and action.name == "send_msg_to_user":
            return 0.0, True, {"correct": False, "raw_reward": 0.0, "reason": "ended by a message before the task"}
        return 0.0, False, {"correct": False}

    def close(self) -> None:
        super().close()
        self._server.close()
