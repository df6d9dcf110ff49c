"""Scripted experts: policies that solve web tasks from the observation text alone.

They read what the agent reads (the goal and the ``[bid] role 'name'`` lines) and answer with
the same action strings, so a solved episode shows that the task can be solved through the
text interface. Used by the tests, the benchmark and as demonstrations for supervised warm-up.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

_LINE = re.compile(r"""^(?P<indent> *)(?:\[(?P<bid>[^\]]+)\] )?(?P<role>\S+) """
                   r"""(?P<name>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?P<rest>.*)$""")


@dataclass(frozen=True)
class Element:
    bid: str | None
    role: str
    name: str
    depth: int
    rest: str  # value='...', checked, selected, ...


def goal_of(observation: str) -> str:
    match = re.search(r"^Goal: (.*)$", observation, re.MULTILINE)
    return match.group(1) if match else ""


def elements(observation: str) -> list[Element]:
    """The accessibility-tree lines of an observation, parsed."""
    tree = observation.split("Accessibility tree:\n", 1)[-1]
    found = []
    for line in tree.splitlines():
        match = _LINE.match(line)
        if match:
            name = ast.literal_eval(match["name"])
            found.append(Element(match["bid"], match["role"], name, len(match["indent"]) // 2, match["rest"].strip()))
    return found


def find(observation: str, role: str, name: str | None = None, skip_goal: bool = True) -> list[Element]:
    """Elements with ``role`` (and exactly ``name``), in page order."""
    goal = goal_of(observation)
    return [e for e in elements(observation) if e.role == role and e.bid is not None
            and (name is None or e.name == name) and not (skip_goal and e.name == goal)]


def _quoted(goal: str) -> list[str]:
    return re.findall(r'"([^"]*)"', goal)


def _click(observation: str, role: str, name: str) -> list[str]:
    return [f"click('{find(observation, role, name)[0].bid}')"]


def _fill_and_submit(observation: str, texts: list[str], submit: str) -> list[str]:
    boxes = find(observation, "textbox")
    return [f"fill('{box.bid}', {text!r})" for box, text in zip(boxes, texts)] + _click(observation, "button", submit)


def _ordinal(goal: str) -> int:
    return int(re.search(r"(\d+)(?:st|nd|rd|th)", goal).group(1))


def _checkboxes(observation: str, goal: str) -> list[str]:
    wanted = re.match(r"Select (.*?) and click Submit", goal).group(1)
    names = [] if wanted.lower() == "nothing" else [n.strip() for n in re.split(r",", wanted) if n.strip()]
    return [a for n in names for a in _click(observation, "checkbox", n)] + _click(observation, "button", "Submit")


def _choose_list(observation: str, goal: str) -> list[str]:
    option = re.match(r"Select (.*) from the list", goal).group(1)
    box = find(observation, "combobox")[0]
    return [f"select_option('{box.bid}', {option!r})"] + _click(observation, "button", "Submit")


# task -> plan(observation, goal) -> actions; each plan is read off the first observation (bids
# are stable within an episode).
MINIWOB_PLANS: dict[str, Callable[[str, str], list[str]]] = {
    "click-test": lambda o, g: _click(o, "button", "Click Me!"),
    "click-test-2": lambda o, g: _click(o, "button", re.search(r"button (\S+?)\.", g).group(1)),
    "click-button": lambda o, g: _click(o, "button", _quoted(g)[0]),
    "unicode-test": lambda o, g: _click(o, "button", _quoted(g)[0]),
    "click-link": lambda o, g: _click(o, "StaticText", _quoted(g)[0]),
    "click-dialog": lambda o, g: _click(o, "button", "Close"),
    # The dialog's "x" is its close button, which the accessibility tree names 'Close'.
    "click-dialog-2": lambda o, g: _click(o, "button", {"x": "Close"}.get(_quoted(g)[0], _quoted(g)[0])),
    "enter-text": lambda o, g: _fill_and_submit(o, _quoted(g)[:1], "Submit"),
    "enter-text-2": lambda o, g: _fill_and_submit(
        o, [_quoted(g)[0].upper() if "upper" in g else _quoted(g)[0].lower()], "Submit"),
    "enter-password": lambda o, g: _fill_and_submit(o, _quoted(g)[:1] * 2, "Submit"),
    "login-user": lambda o, g: _fill_and_submit(o, _quoted(g)[:2], "Login"),
    "focus-text": lambda o, g: [f"click('{find(o, 'textbox')[0].bid}')"],
    "focus-text-2": lambda o, g: [f"click('{find(o, 'textbox')[_ordinal(g) - 1].bid}')"],
    "click-button-sequence": lambda o, g: _click(o, "button", "ONE") + _click(o, "button", "TWO"),
    "click-checkboxes": _checkboxes,
    "click-option": lambda o, g: _click(o, "radio", re.match(r"Select (.*) and click", g).group(1))
    + _click(o, "button", "Submit"),
    "choose-list": _choose_list,
    "click-tab": lambda o, g: _click(o, "link", re.search(r"(Tab #\d+)", g).group(1)),
}


class MiniWoBExpert:
    """Solves the MiniWoB++ tasks in :data:`MINIWOB_PLANS` from their first observation."""

    def __init__(self, task_name: str):
        if task_name not in MINIWOB_PLANS:
            raise ValueError(f"no scripted expert for {task_name!r}; have {', '.join(sorted(MINIWOB_PLANS))}")
        self.plan = MINIWOB_PLANS[task_name]
        self._actions: list[str] | None = None

    def act(self, observation: str) -> str:
        if self._actions is None:
            self._actions = self.plan(observation, goal_of(observation))
        return self._actions.pop(0) if self._actions else "noop()"


_SHOP_GOAL = re.compile(r"Buy (?:an? )?(?P<colour>\S+) (?P<material>\S+) (?P<category>\S+) in size (?P<size>\S+) "
                        r"for at most \$(?P<max_price>\d+)")


class ShopExpert:
    """Buys what a web_shop instruction asks for: search, scan the results (and their next pages),
    open a fitting product, choose colour and size, add to cart, check out."""

    def __init__(self):
        self._opened: set[str] = set()  # product titles already looked at
        self._queue: list[str] = []

    def act(self, observation: str) -> str:
        if self._queue:
            return self._queue.pop(0)
        goal = _SHOP_GOAL.search(goal_of(observation))
        if goal is None:
            return "send_msg_to_user('I cannot read the instruction')"
        want = goal.groupdict()
        title = re.search(r"^Title: (.*)$", observation, re.MULTILINE).group(1)
        found = elements(observation)
        if title.startswith("Order placed"):
            return "send_msg_to_user('done')"
        if title.startswith("Checkout"):
            return _click(observation, "button", "Place order")[0]
        if title.startswith("Cart"):
            return _click(observation, "link", "Proceed to checkout")[0]
        if title.startswith("Search results"):
            return self._pick_result(found, want)
        if "/product/" in re.search(r"^URL: (.*)$", observation, re.MULTILINE).group(1):
            return self._buy_here(found, want)
        box = next(e for e in found if e.role == "textbox")
        self._queue = [f"press('{box.bid}', 'Enter')"]
        return f"fill('{box.bid}', '{want['colour']} {want['material']} {want['category']}')"

    def _pick_result(self, found: list[Element], want: dict[str, str]) -> str:
        for link, detail in zip(found, found[1:]):
            if link.role != "link" or detail.role != "StaticText" or link.name in self._opened:
                continue
            price, colours = re.match(r"\$([\d.]+), colours: (.*)", detail.name).groups()
            words = link.name.split()
            if (words[-1] == want["category"] and words[-2] == want["material"]
                    and float(price) <= float(want["max_price"]) and want["colour"] in colours.split(", ")):
                self._opened.add(link.name)
                return f"click('{link.bid}')"
        next_page = [e for e in found if e.role == "link" and e.name == "Next page"]
        return f"click('{next_page[0].bid}')" if next_page else "send_msg_to_user('no fitting product')"

    def _buy_here(self, found: list[Element], want: dict[str, str]) -> str:
        options = [e.name for e in found if e.role == "option"]
        boxes = [e for e in found if e.role == "combobox"]
        if want["size"] not in options or want["colour"] not in options or len(boxes) != 2:
            return "go_back()"
        self._queue = [f"select_option('{boxes[1].bid}', '{want['size']}')",
                       _click_line(found, "button", "Add to cart")]
        return f"select_option('{boxes[0].bid}', '{want['colour']}')"


def _click_line(found: list[Element], role: str, name: str) -> str:
    return f"click('{next(e for e in found if e.role == role and e.name == name).bid}')"


class RandomPolicy:
    """A baseline that acts at random on the elements it sees (clicks, fills, options, keys, scrolls)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def act(self, observation: str) -> str:
        found = [e for e in elements(observation) if e.bid is not None]
        rng = self.rng
        kind = rng.choice(["click", "click", "click", "fill", "select_option", "press", "scroll"])
        if not found or kind == "scroll":
            return f"scroll(0, {rng.choice([-200, 200])})"
        target = rng.choice(found)
        if kind == "fill":
            return f"fill('{target.bid}', {rng.choice(['test', 'shirt', 'blue', 'M'])!r})"
        if kind == "select_option":
            options = [e.name for e in found if e.role == "option"] or ["M"]
            return f"select_option('{target.bid}', {rng.choice(options)!r})"
        if kind == "press":
            return f"press('{target.bid}', 'Enter')"
        return f"click('{target.bid}')"
