"""Chromium browsers, each owned by one thread, shared by the web environments of a process.

Playwright's objects belong to the thread (and event loop) that created them, while posttrain's
rollout resets and steps environments from short-lived worker threads. So a :class:`BrowserHost`
runs Playwright's async API on an event loop in a thread of its own; environments submit
coroutines to it and wait with a timeout (:meth:`BrowserHost.run`). Several environments then
drive pages of the same browser concurrently, each episode in a fresh browser context. A process
runs a few hosts (by default one per CPU core, :func:`acquire_host`), its envs spread over them.

Chromium is Debian's (``apt-get install chromium``), launched through ``executable_path``:
Playwright's own browser download does not work on machines without internet access. The flags
keep it off the network and out of the GPU. Every ``recycle_every`` episodes the browser is
replaced (the old one closes once its last episode ends, or at the next recycle at the latest),
which keeps memory bounded. Nothing survives the process: hosts close at exit, and when the
process is killed Playwright's driver sees its pipe close and kills the browser.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import shutil
import threading
from collections.abc import Coroutine
from typing import Any

import psutil
from playwright.async_api import Browser, BrowserContext, Playwright, async_playwright

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
)
# The binary behind Debian's /usr/bin/chromium wrapper script starts faster than the wrapper.
_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


class BrowserError(RuntimeError):
    """The browser cannot be started or stopped answering; the message says why."""


def find_chromium(executable: str | None = None) -> str:
    """Path of the Chromium binary: ``executable``, ``$POSTTRAIN_CHROMIUM``, or Debian's."""
    for candidate in ([executable] if executable else [os.environ.get("POSTTRAIN_CHROMIUM"), *_CANDIDATES]):
        if not candidate:
            continue
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    raise BrowserError(f"no Chromium found (tried {executable or ', '.join(_CANDIDATES)}); install it with "
                       "'apt-get install chromium' (scripts/setup.sh does) or set POSTTRAIN_CHROMIUM")


def browser_processes(root: int | None = None) -> list[psutil.Process]:
    """The live Chromium processes descending from process ``root`` (default: this one)."""
    found = []
    for proc in psutil.Process(root or os.getpid()).children(recursive=True):
        try:
            if "chrom" in proc.name() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def browser_memory_mb(root: int | None = None) -> tuple[float, float]:
    """(RSS, PSS) of this process's Chromium processes summed, in MB: RSS counts a page shared by
    several processes in each of them, PSS splits it between them."""
    rss = pss = 0
    for proc in browser_processes(root):
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss / 2**20, pss / 2**20


class BrowserHost:
    """A Chromium and the thread that owns it; hands out one browser context per episode."""

    def __init__(self, executable: str | None = None, recycle_every: int = 50, launch_timeout: float = 30.0,
                 max_opening: int = 4):
        if recycle_every < 1:
            raise ValueError(f"recycle_every must be at least 1, got {recycle_every}")
        self.executable = find_chromium(executable)
        self.recycle_every = recycle_every
        self.launch_timeout = launch_timeout
        self.launches = 0
        # Touched only on the loop thread:
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._episodes = 0  # episodes started on the current browser (new contexts and reused pages)
        self._open: dict[Browser, set[BrowserContext]] = {}
        self._switching = asyncio.Lock()
        # Episodes opening their first page at once (a rollout resets all its envs together) share
        # the CPU: a few at a time, so that each page load finishes within its own timeout.
        self.opening = asyncio.Semaphore(max_opening)
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="posttrain-browser", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def run(self, coro: Coroutine, timeout: float) -> Any:
        """Run ``coro`` on the browser's thread; its result, or TimeoutError after ``timeout`` s."""
        if self._closed:
            coro.close()
            raise BrowserError("the browser host is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the browser did not answer within {timeout:g} s") from None

    async def new_context(self, **options: Any) -> BrowserContext:
        """A fresh context (cookies, storage, pages of its own) on a live, not-yet-due browser."""
        async with self._switching:  # concurrent resets must not each launch a browser
            if self._browser is None or not self._browser.is_connected() or self._episodes >= self.recycle_every:
                await self._retire()
                self._browser = await self._launch()
                self._episodes = 0
            self._episodes += 1
            browser = self._browser
        context = await browser.new_context(**options)
        if browser in self._open:
            self._open[browser].add(context)
        return context

    def claim_episode(self) -> bool:
        """Count an episode that reuses an open page (loop thread only); False when the browser is gone
        or due for recycling, and the caller should open a new context instead (which recycles it)."""
        if self._browser is None or not self._browser.is_connected() or self._episodes >= self.recycle_every:
            return False
        self._episodes += 1
        return True

    async def close_context(self, context: BrowserContext) -> None:
        """Close an episode's context; a retired browser whose last context this was closes too."""
        browser = context.browser
        try:
            await asyncio.wait_for(context.close(), 5.0)
        except Exception:  # noqa: BLE001 - the browser may already be gone; nothing left to close
            pass
        if browser in self._open:
            self._open[browser].discard(context)
            if browser is not self._browser and not self._open[browser]:
                await self._close_browser(browser)

    async def _launch(self) -> Browser:
        if self._playwright is None:
            self._playwright = await async_playwright().start()
        try:
            browser = await self._playwright.chromium.launch(
                executable_path=self.executable, args=list(CHROMIUM_FLAGS), headless=True,
                timeout=self.launch_timeout * 1000)
        except Exception as e:  # noqa: BLE001 - reported as one clear error
            raise BrowserError(f"Chromium ({self.executable}) failed to start: {str(e).splitlines()[0]}") from None
        self.launches += 1
        self._open[browser] = set()
        return browser

    async def _retire(self) -> None:
        """Stop using the current browser; close it now if idle. Older retired ones close regardless,
        so at most two browsers are ever alive (a context leaked by an abandoned env cannot pin one)."""
        for browser in [b for b in self._open if b is not self._browser]:
            await self._close_browser(browser)
        if self._browser is not None and not self._open.get(self._browser):
            await self._close_browser(self._browser)
        self._browser = None

    async def _close_browser(self, browser: Browser) -> None:
        self._open.pop(browser, None)
        try:
            await asyncio.wait_for(browser.close(), 10.0)
        except Exception:  # noqa: BLE001 - a crashed browser has nothing left to close
            pass

    async def _shutdown(self) -> None:
        self._browser = None
        for browser in list(self._open):
            await self._close_browser(browser)
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None

    def close(self) -> None:
        """Close every browser and stop the thread; safe to call twice."""
        if self._closed:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30.0)
        except Exception:  # noqa: BLE001 - closing must not raise; the driver dies with the process anyway
            pass
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        atexit.unregister(self.close)


# Per settings, the process's hosts and how many envs use each.
_shared: dict[tuple[str | None, int], list[list]] = {}
_shared_lock = threading.Lock()


def acquire_host(executable: str | None = None, recycle_every: int = 50, browsers: int = 1) -> BrowserHost:
    """A host shared by this process's envs of these settings; pair with :func:`release_host`. Up to
    ``browsers`` hosts (each a Chromium, its Playwright driver and a thread) run at once, the envs
    spread over them: a new host while fewer run, else the least used. Envs of one host queue on its
    thread and driver, so two env workers on two cores ran 1.2-1.5x faster with a browser each."""
    key = (executable, recycle_every)
    with _shared_lock:
        hosts = [entry for entry in _shared.get(key, []) if not entry[0]._closed]
        entry = [BrowserHost(executable, recycle_every), 0] if len(hosts) < browsers else min(hosts, key=lambda e: e[1])
        if entry not in hosts:
            hosts.append(entry)
        entry[1] += 1
        _shared[key] = hosts
        return entry[0]


def release_host(host: BrowserHost) -> None:
    """One user fewer; the last one closes the host and its browsers."""
    with _shared_lock:
        for key, hosts in list(_shared.items()):
            for entry in hosts:
                if entry[0] is host:
                    entry[1] -= 1
                    if entry[1] > 0:
                        return
                    hosts.remove(entry)
                    if not hosts:
                        del _shared[key]
    host.close()
