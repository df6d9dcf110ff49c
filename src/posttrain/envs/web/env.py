"""The web environment: a gymnasium.Env whose agent reads a page as text and acts on it by bid.

Each episode runs in a fresh browser context of the process's shared Chromium
(:mod:`posttrain.envs.web.browser`). ``reset`` opens the task's page and returns the
instructions, the goal and the page; each ``step`` parses one action from the model's text,
performs it, and returns the page as it is now, with ``last_action_error`` saying what went
wrong if anything did. The context is closed when the episode ends, when the next one starts,
when a call fails, and at ``close()``.

With ``reuse_page`` (MiniWoB's default, as MiniWoB++'s own environment does), an episode that
ended normally leaves its page open, and the next episode starts in it (:meth:`WebEnv._restart`:
MiniWoB restarts a task page in place, or loads the next task's page in the same tab) instead of
in a new context with a new renderer. With ``pages_kept`` above 1, the context keeps that many
pages, each serving one kind of task (:meth:`WebEnv._page_key`; MiniWoB: one page per task
name), so that an episode of a task seen before restarts in its page without loading it again:
the tasks of a run alternate episode by episode, and loading a task page was most of a reset.
Any failure still closes the context with its pages, and every episode, reused pages included,
counts towards the browser's recycling (``recycle_every``).

Subclasses (MiniWoB++, the shop) say how an episode starts (:meth:`WebEnv._start`) and what an
action earned (:meth:`WebEnv._outcome`).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from gymnasium.spaces import Text
from playwright.async_api import BrowserContext, CDPSession, Page

from posttrain.envs.base import CHARSET, MAX_TEXT, Split, task_for_reset
from posttrain.envs.web.actions import USAGE, Action, ActionError, parse_action, run_action
from posttrain.envs.web.browser import BrowserHost, acquire_host, release_host
from posttrain.envs.web.observation import (
    FORGET_EPISODE_JS,
    MARK_ELEMENTS_JS,
    bids_by_backend_id,
    flatten_ax_tree,
    render_observation,
)
from posttrain.types import Task

# Pages are Unicode (MiniWoB's unicode-test, accented names): observations may hold any character
# of the Basic Multilingual Plane but the surrogates. Actions stay printable ASCII, like every env's.
PAGE_CHARSET = frozenset(CHARSET) | frozenset(chr(c) for c in range(0xA0, 0x10000) if not 0xD800 <= c < 0xE000)
INSTRUCTIONS = ("You operate a web browser to reach a goal. Each turn you see the page's accessibility tree, one "
                "element per line as [bid] role 'name'. Reply with exactly one action, naming elements by bid: "
                f"{USAGE}. For example: click('12')")


class WebEnv(gym.Env):
    """Base class of the browser environments; subclasses give tasks and a site, ``_start`` and ``_outcome``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, max_steps: int = 10, action_timeout: float = 1.0, load_timeout: float = 20.0,
                 call_timeout: float = 120.0,
                 screenshot_dir: str | None = None, recycle_every: int = 50, chromium: str | None = None,
                 max_tree_chars: int = 8000, viewport: tuple[int, int] = (800, 600), reuse_page: bool = False,
                 pages_kept: int = 1, browsers: int | None = None):
        if max_steps < 1:
            raise ValueError(f"env.kwargs.max_steps must be at least 1, got {max_steps}")
        if pages_kept < 1:
            raise ValueError(f"env.kwargs.pages_kept must be at least 1, got {pages_kept}")
        if browsers is not None and browsers < 1:
            raise ValueError(f"env.kwargs.browsers must be at least 1 (or null: one per CPU core), got {browsers}")
        if not 0 < action_timeout <= call_timeout:
            raise ValueError(f"env.kwargs.action_timeout must be in (0, call_timeout={call_timeout}], got {action_timeout}")
        self.observation_space = Text(max_length=MAX_TEXT, min_length=0, charset=PAGE_CHARSET)
        self.action_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.max_steps = max_steps
        self.action_timeout = action_timeout
        self.load_timeout = load_timeout  # page loads: generous, a busy machine takes seconds
        self.call_timeout = call_timeout
        self.screenshot_dir = screenshot_dir
        self.recycle_every = recycle_every
        self.chromium = chromium
        self.max_tree_chars = max_tree_chars
        self.viewport = {"width": int(viewport[0]), "height": int(viewport[1])}
        self.reuse_page = reuse_page
        self.pages_kept = pages_kept
        self.browsers = browsers or os.cpu_count() or 1  # Chromiums the process's envs spread over
        self._live = False  # an episode is running (its page may outlive it, parked for the next one)
        self.task: Task | None = None
        self.goal = ""
        self.steps = 0
        self._host: BrowserHost | None = None
        self._context: BrowserContext | None = None
        self._page: Page | None = None
        self._cdp: CDPSession | None = None  # the page's DevTools session, kept while the page lives
        self._page_key_now: str | None = None  # the _page_key of the task the page last served
        self._parked: dict[str | None, tuple[Page, CDPSession]] = {}  # other pages of the context, oldest first
        self._next_bid = 0
        self._episode_id = ""

    # ------------------------------------------------------------ for subclasses

    # A subclass sets ``_splits`` (split name -> its tasks) and ``_server`` (the LocalServer of its site).
    _splits: dict[str, Sequence[Task]]
    _server: Any

    def tasks(self, split: Split) -> Sequence[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'eval'")
        return self._splits[split]

    @property
    def site(self) -> str:
        """The site's origin (``http://127.0.0.1:PORT/``): ``goto`` may not leave it."""
        return self._server.url

    async def _start(self, page: Page, task: Task) -> str:
        """Open the task's page in ``page`` and return the goal, in words."""
        raise NotImplementedError

    async def _restart(self, page: Page, task: Task) -> str | None:
        """Start ``task`` in ``page``, which served the previous episode, and return its goal; None when
        it cannot be (another task page): the env then opens a fresh context. By default never."""
        return None

    async def _outcome(self, page: Page, action: Action | None) -> tuple[float, bool, dict[str, Any]]:
        """(step reward, terminated, info) after ``action`` (None: it could not be parsed or run)."""
        raise NotImplementedError

    def _page_key(self, task: Task) -> str | None:
        """Which kept page serves ``task`` (with ``pages_kept`` > 1): tasks of one key share a page.
        By default every task has the same key."""
        return None

    def _extra(self) -> str:
        """A line of state to show beside the page (e.g. the shop's cart); empty by default."""
        return ""

    # ------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = task_for_reset(self, options)
        reuse = self._live is False and self._page is not None
        if not reuse:
            self._end_episode()
        self.task, self.steps, self._next_bid = task, 0, 0
        self._episode_id = re.sub(r"[^A-Za-z0-9_.-]+", "_", task.id) + "-" + uuid.uuid4().hex[:8]
        if self._host is None:
            self._host = acquire_host(self.chromium, self.recycle_every, self.browsers)
        try:
            page_text, info = self._host.run(self._begin(task, reuse), self.call_timeout)
        except BaseException:
            self._end_episode()
            raise
        self._live = True
        return f"{INSTRUCTIONS}\n\n{page_text}", {"task_id": task.id, **info}

    def step(self, action: str):
        if not self._live or self.task is None:
            raise RuntimeError("step() called before reset() or after the episode ended")
        self.steps += 1
        try:
            parsed, error = parse_action(str(action)), ""
        except ActionError as e:
            parsed, error = None, str(e)
        try:
            text, reward, terminated, info = self._host.run(self._act(parsed, error), self.call_timeout)
        except BaseException:
            self._end_episode()
            raise
        truncated = not terminated and self.steps >= self.max_steps
        page_error = info.pop("error", "")
        error = error or page_error
        info = {"action": None if parsed is None else parsed.name, "last_action_error": error, "steps": self.steps,
                "metrics": {"web_actions": 1.0, "web_action_errors": float(bool(error))}, **info}
        if terminated or truncated:
            self._live = False
            if not self.reuse_page:
                self._end_episode()
        return text, float(reward), bool(terminated), bool(truncated), info

    def close(self) -> None:
        self._end_episode()
        if self._host is not None:
            release_host(self._host)
            self._host = None

    # ------------------------------------------------------------ on the browser's thread

    async def _begin(self, task: Task, reuse: bool) -> tuple[str, dict[str, Any]]:
        goal = None
        if reuse:
            if self._host.claim_episode():  # else the browser is due for recycling: a new one serves
                try:
                    await self._switch_page(task)
                    await self._page.evaluate(FORGET_EPISODE_JS)  # bids restart at 0, nothing has focus
                    goal = await self._restart(self._page, task)
                except Exception:  # noqa: BLE001 - a page that cannot restart is replaced by a fresh one
                    goal = None
            if goal is None:
                await self._host.close_context(self._context)
                self._context = self._page = self._cdp = None
                self._parked.clear()
        if goal is None:
            goal = await self._open(task)
        self.goal = goal
        info: dict[str, Any] = {"goal": self.goal}
        await self._shoot(info)
        return await self._observe(""), info

    async def _open(self, task: Task) -> str:
        """A fresh context and page with ``task`` started in it; the goal."""
        async with self._host.opening:
            self._context = await self._host.new_context(viewport=self.viewport)
            self._context.set_default_timeout(self.action_timeout * 1000)
            self._context.set_default_navigation_timeout(self.load_timeout * 1000)
            self._page = await self._context.new_page()
            self._cdp = await self._context.new_cdp_session(self._page)
            self._page_key_now = self._page_key(task)
            return await self._start(self._page, task)

    async def _switch_page(self, task: Task) -> None:
        """Bring out the kept page that last served a task of ``task``'s key, parking the current
        one; while fewer than ``pages_kept`` are open a new page joins them, else the page parked
        longest serves (``_restart`` then loads the task into it)."""
        key = self._page_key(task)
        if self.pages_kept == 1 or key == self._page_key_now:
            return
        self._parked[self._page_key_now] = (self._page, self._cdp)
        if key in self._parked:
            self._page, self._cdp = self._parked.pop(key)
        elif len(self._parked) < self.pages_kept:
            self._page = await self._context.new_page()
            self._cdp = await self._context.new_cdp_session(self._page)
        else:
            self._page, self._cdp = self._parked.pop(next(iter(self._parked)))
        self._page_key_now = key

    async def _act(self, action: Action | None, error: str) -> tuple[str, float, bool, dict[str, Any]]:
        page = self._page
        if action is not None and action.name != "send_msg_to_user":
            try:
                await run_action(page, action, self.site, self.action_timeout, self.load_timeout, self._cdp)
            except ActionError as e:
                error = str(e)
            try:
                await page.wait_for_load_state("domcontentloaded", timeout=self.load_timeout * 1000)
            except Exception:  # noqa: BLE001 - a slow page is observed as it is
                pass
        # What the action earned and what the page shows now are independent reads: sent together,
        # they cost one round trip to the browser instead of two.
        (reward, terminated, info), text = await asyncio.gather(self._outcome(page, None if error else action),
                                                               self._observe(error))
        info["error"] = error
        await self._shoot(info)
        return text, reward, terminated, info

    async def _observe(self, error: str) -> str:
        page = self._page
        for attempt in range(3):
            try:
                self._next_bid, title = await page.evaluate(MARK_ELEMENTS_JS, self._next_bid)
                # One DevTools session answers in order: both reads go out at once, after the marking.
                snapshot, ax = await asyncio.gather(
                    self._cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []}),
                    self._cdp.send("Accessibility.getFullAXTree"))
                tree = flatten_ax_tree(ax["nodes"], bids_by_backend_id(snapshot))
                break
            except Exception:  # noqa: BLE001 - a navigation in flight destroys the context: wait and retry
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2)
        if len(tree) > self.max_tree_chars:
            cut = tree[: self.max_tree_chars].rsplit("\n", 1)[0]
            tree = f"{cut}\n... ({tree.count(chr(10)) - cut.count(chr(10))} more lines)"
        return render_observation(self.goal, page.url, title, tree, error, self._extra())

    async def _shoot(self, info: dict[str, Any]) -> None:
        if not self.screenshot_dir:
            return
        path = os.path.join(self.screenshot_dir, self._episode_id, f"step{self.steps:02d}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        await self._page.screenshot(path=path)
        info["screenshot"] = path

    def _end_episode(self) -> None:
        """Close the episode's context (best effort: a dead browser has nothing left to close)."""
        context, self._context, self._page, self._cdp, self._live = self._context, None, None, None, False
        self._parked.clear()  # its pages close with the context
        if context is not None and self._host is not None:
            try:
                self._host.run(self._host.close_context(context), 15.0)
            except Exception:  # noqa: BLE001 - the host retires an unclosable browser at its next recycle
                pass
