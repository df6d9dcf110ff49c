"""Web actions in BrowserGym's text syntax, parsed from model output and run on a page.

An action is one Python-style call with literal arguments, e.g. ``click('12')`` or
``fill('7', 'blue shirt')``. Model output usually has more around it (a thought, a code fence,
several tries), so the parser takes the last well-formed call of a known action in the text (of its
last 64 mentions of an action, and at most 10,000 characters long).
Anything else is an :class:`ActionError` whose message says what was expected; the environment
turns it into the next observation, never into an exception.
"""

from __future__ import annotations

import ast
import asyncio
import re
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from playwright.async_api import CDPSession, Page

from posttrain.envs.web.observation import BID

# name -> the argument types it takes, in order
SIGNATURES: dict[str, tuple[type, ...]] = {
    "click": (str,),
    "fill": (str, str),
    "select_option": (str, str),
    "press": (str, str),
    "scroll": (float, float),
    "go_back": (),
    "goto": (str,),
    "send_msg_to_user": (str,),
    "noop": (),
}
USAGE = ("click('bid'), fill('bid', 'text'), select_option('bid', 'option'), press('bid', 'Enter'), "
         "scroll(dx, dy), go_back(), goto('url'), send_msg_to_user('answer'), noop()")
_CALL_START = re.compile(r"\b(" + "|".join(SIGNATURES) + r")\s*\(")
# Reading a reply holds the GIL, and each mention of an action scans for its closing parenthesis: a reply of n
# mentions that never close was n scans to its end (4,000 times "click(\'": 4.7 s). So only the last
# MAX_MENTIONS mentions are tried, and a call may be at most MAX_CALL_CHARS long.
MAX_MENTIONS = 64
MAX_CALL_CHARS = 10_000


class ActionError(ValueError):
    """An action that cannot be parsed or run; the message is shown to the agent."""


@dataclass(frozen=True)
class Action:
    name: str
    args: tuple


def _call_end(text: str, open_paren: int) -> int | None:
    """Index just past the parenthesis closing the one at ``open_paren`` (strings skipped), or None
    when there is none within MAX_CALL_CHARS."""
    depth, quote, i = 0, None, open_paren
    while i < min(len(text), open_paren + MAX_CALL_CHARS):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _literal_call(source: str) -> Action:
    try:
        call = ast.parse(source.strip(), mode="eval").body
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords
        args = tuple(ast.literal_eval(a) for a in call.args)
    except (SyntaxError, ValueError, AssertionError, TypeError):
        raise ActionError(f"{source.strip()!r} is not a call with literal arguments; expected one of: {USAGE}") from None
    name, expected = call.func.id, SIGNATURES[call.func.id]
    if len(args) != len(expected):
        raise ActionError(f"{name}() takes {len(expected)} argument(s), got {len(args)}; expected one of: {USAGE}")
    checked = []
    for arg, kind in zip(args, expected):
        if kind is float and isinstance(arg, (int, float)) and not isinstance(arg, bool):
            checked.append(float(arg))
        elif kind is str and isinstance(arg, (str, int)) and not isinstance(arg, bool):
            checked.append(str(arg))  # click(12) means click('12')
        else:
            raise ActionError(f"{name}(): argument {arg!r} should be a {'number' if kind is float else 'string'}")
    return Action(name, tuple(checked))


def parse_action(text: str) -> Action:
    """The last well-formed action call in ``text``; ActionError when there is none."""
    starts = list(_CALL_START.finditer(text))
    if not starts:
        raise ActionError(f"no action found; reply with one of: {USAGE}")
    error: ActionError | None = None
    for match in reversed(starts[-MAX_MENTIONS:]):
        end = _call_end(text, match.end() - 1)
        if end is None:
            where = repr(text[match.start():match.start() + 60])
            too_long = len(text) - match.end() >= MAX_CALL_CHARS
            error = error or ActionError(f"no closing parenthesis within {MAX_CALL_CHARS:,} characters of {where}"
                                         if too_long else f"unclosed parenthesis in {where}")
            continue
        try:
            return _literal_call(text[match.start():end])
        except ActionError as e:
            error = error or e
    raise error  # type: ignore[misc]


# Where a click lands, or why it would not reach the element, in one page call. Playwright's
# locator.click (even forced, without its actionability checks) costs about 40 ms, most of a step:
# it scrolls, measures and moves the mouse in separate round trips, then waits for navigations. This
# checks at one instant what its checks wait for (attached, visible, enabled, not covered), after
# scrolling the element to the centre as Playwright does, and returns the point to press; it also
# answers whether the element exists, which would be one more round trip. It runs as a page function
# on the selector (``locator.evaluate`` waits for an animation frame first: 14 ms against 2.5).
# Listeners it installs once per document record whether the click starts loading another page.
CLICK_TARGET_JS = """(selector) => {
  const el = document.querySelector(selector);
  if (!el) return 'missing';
  el.scrollIntoView({block: 'center', inline: 'center'});
  const style = getComputedStyle(el);
  const box = el.getBoundingClientRect();
  if (style.visibility !== 'visible' || box.width === 0 || box.height === 0) return 'element is not visible';
  if (el.disabled || el.closest('fieldset:disabled')) return 'element is disabled';
  const x = box.left + box.width / 2, y = box.top + box.height / 2;
  const hit = document.elementFromPoint(x, y);
  if (hit && hit !== el && !el.contains(hit) && hit.control !== el) {
    const what = hit.tagName.toLowerCase() + (hit.id ? '#' + hit.id : '');
    return 'another element covers it (' + what + ')';
  }
  if (!window.__posttrainLeaving) {
    const leaving = window.__posttrainLeaving = {now: false, submit: null};
    window.addEventListener('beforeunload', () => { leaving.now = true; });
    window.addEventListener('submit', (event) => { leaving.submit = event; }, true);
  }
  Object.assign(window.__posttrainLeaving, {now: false, submit: null});
  return [x, y];
}"""
# After the click: did it start leaving the page? A link navigates at once (`beforeunload` has run);
# a form submission is queued as a task, so its `submit` event (unless a handler cancelled it) says so.
_LEAVING_JS = """() => {
  const leaving = window.__posttrainLeaving;
  return leaving.now || (leaving.submit !== null && !leaving.submit.defaultPrevented);
}"""


class ClickRefused(Exception):
    """Why a click would not reach its element; run_action words it like Playwright's own failures."""


class MissingElement(Exception):
    """No element has the action's bid; run_action says so to the agent."""


async def click(page: Page, cdp: CDPSession, selector: str, load_ms: float) -> None:
    """Click like a person: refused when the element is hidden, disabled or covered; otherwise a
    trusted press and release of the left button at its centre (DevTools input events, as
    Playwright's mouse sends them). When the click starts loading another page, waits until that
    page has replaced this one (the caller then waits for it to load)."""
    target = await page.evaluate(CLICK_TARGET_JS, selector)
    if target == "missing":
        raise MissingElement()
    if isinstance(target, str):
        raise ClickRefused(target)
    x, y = target
    # Listening starts before the click: a fast navigation may replace the page before we ask.
    replaced = asyncio.ensure_future(page.wait_for_event("framenavigated", lambda frame: frame == page.main_frame,
                                                         timeout=load_ms))
    try:
        # Sent together: the session delivers them in order, and the press need not be answered first.
        await asyncio.gather(*(cdp.send("Input.dispatchMouseEvent",
                                        {"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1})
                               for kind in ("mousePressed", "mouseReleased")))
        try:
            leaving = await page.evaluate(_LEAVING_JS)
        except Exception:  # noqa: BLE001 - the page it asked is gone: the navigation has replaced it
            leaving = True
        if leaving:
            try:
                await replaced
            except Exception:  # noqa: BLE001 - a navigation that never commits (a download, a 204) leaves the page
                pass
    finally:
        replaced.cancel()


def bid_selector(bid: str) -> str:
    """The CSS selector of the element with ``bid``; the model's text stays inside the quoted value."""
    quoted = bid.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\a ")
    return f'[{BID}="{quoted}"]'


def same_site(url: str, site: str) -> bool:
    """Whether ``url`` stays on ``site`` (same scheme, host and port)."""
    a, b = urlsplit(url), urlsplit(site)
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


async def run_action(page: Page, action: Action, site: str, timeout_s: float = 1.0, load_timeout_s: float = 20.0,
                     cdp: CDPSession | None = None) -> None:
    """Perform ``action`` on ``page``; ActionError (for the agent) when it cannot be done.

    ``cdp`` is the page's DevTools session (one is opened when not given). ``send_msg_to_user``
    does nothing here: the environment reads the message.
    """
    ms = timeout_s * 1000
    name, args = action.name, action.args
    selector = bid_selector(args[0]) if name in ("click", "fill", "select_option", "press") else ""
    locator = page.locator(selector) if selector else None
    try:
        if name != "click" and locator is not None and await locator.count() == 0:
            raise MissingElement()
        if name == "click":
            await click(page, cdp or await page.context.new_cdp_session(page), selector, load_timeout_s * 1000)
        elif name == "fill":
            await locator.fill(args[1], timeout=ms)
        elif name == "select_option":
            await locator.select_option(args[1], timeout=ms)
        elif name == "press":
            await locator.press(args[1], timeout=ms)
        elif name == "scroll":
            await page.mouse.wheel(args[0], args[1])
        elif name == "go_back":
            await page.go_back(timeout=load_timeout_s * 1000)
        elif name == "goto":
            target = urljoin(page.url if page.url.startswith("http") else site, args[0])
            if not same_site(target, site):
                raise ActionError(f"goto: {args[0]!r} is outside the site ({site}); only its own pages can be opened")
            await page.goto(target, timeout=load_timeout_s * 1000)
    except ActionError:
        raise
    except MissingElement:
        raise ActionError(f"{name}: no element with bid '{args[0]}' on this page") from None
    except Exception as e:  # noqa: BLE001 - Playwright's errors (timeouts, wrong element kind) go to the agent
        raise ActionError(f"{name}({', '.join(map(repr, args))}) failed: {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # Playwright puts the reason first and a call log after; the log's last line says what blocked it.
    head = lines[0] if lines else type(error).__name__
    if len(lines) > 2 and "intercepts pointer events" in text:
        head += " (another element covers it)"
    return head[:300]
