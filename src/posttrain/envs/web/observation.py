"""What a web agent sees: the page's accessibility tree as text, one element per line.

BrowserGym's convention (Le Sellier De Chezelles et al. 2024): every element gets a ``bid``
attribute injected into the DOM, and the tree that Chromium computes for assistive technology
is printed as ``[bid] role 'name'`` lines indented by depth. The agent names elements by bid in
its actions, so bids must not move: an element keeps its bid for the whole episode and new
elements get fresh numbers (the counter lives with the episode, across page loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BID = "bid"

# Gives a bid to every element that has none, numbering from `start`; returns the next free one
# and the page's title (one round trip for both).
MARK_ELEMENTS_JS = """(start) => {
  let next = start;
  for (const el of document.querySelectorAll('*')) {
    if (!el.hasAttribute('%s')) el.setAttribute('%s', String(next++));
  }
  return [next, document.title];
}""" % (BID, BID)

# What a reused page must forget of the last episode: its bids, and the focus its last action left
# (MiniWoB restarts a task in place, keeping elements such as the Submit button it clicked).
FORGET_EPISODE_JS = """() => {
  for (const el of document.querySelectorAll('[%s]')) el.removeAttribute('%s');
  if (document.activeElement && document.activeElement !== document.body) document.activeElement.blur();
}""" % (BID, BID)

# Layout-only roles: not printed, their children are shown one level up.
_TRANSPARENT = {"generic", "none", "presentation", "InlineTextBox", "LineBreak", "LabelText", "Canvas", "Section",
                "group", "paragraph", "div", "ListMarker", "MenuListPopup", "listitem"}
# AX properties worth showing to an agent, printed as `name=value` (booleans only when true).
_SHOWN = ("checked", "selected", "expanded", "pressed", "disabled", "focused", "required")


def bids_by_backend_id(snapshot: Mapping[str, Any]) -> dict[int, str]:
    """Map each DOM node's backend id to its bid, from a CDP ``DOMSnapshot.captureSnapshot``.

    A text node takes the bid of the element around it, so that text shown in a plain ``<span>``
    with a click handler (MiniWoB's links) can be clicked.
    """
    strings = snapshot["strings"]
    found: dict[int, str] = {}
    for document in snapshot["documents"]:
        nodes = document["nodes"]
        own: list[str | None] = []
        for attributes in nodes["attributes"]:
            names = [strings[a] for a in attributes[::2]]
            own.append(strings[attributes[2 * names.index(BID) + 1]] if BID in names else None)
        for i, backend_id in enumerate(nodes["backendNodeId"]):
            parent = nodes["parentIndex"][i]
            bid = own[i] if own[i] is not None else (own[parent] if nodes["nodeType"][i] == 3 and parent >= 0 else None)
            if bid is not None:
                found[backend_id] = bid
    return found


def _value(field: Mapping[str, Any] | None) -> str:
    if not field:
        return ""
    value = field.get("value")
    return "" if value is None else str(value)


def _quote(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)  # Python's quoting: parseable with ast.literal_eval


def _properties(node: Mapping[str, Any]) -> list[str]:
    shown = []
    for prop in node.get("properties", []):
        name, value = prop["name"], prop.get("value", {}).get("value")
        if name not in _SHOWN or value in (None, False, "false", ""):
            continue
        shown.append(name if value is True or value == "true" else f"{name}={_quote(str(value), 40)}")
    return shown


def flatten_ax_tree(nodes: list[Mapping[str, Any]], bids: Mapping[int, str], max_name: int = 100) -> str:
    """The tree of a CDP ``Accessibility.getFullAXTree`` as ``[bid] role 'name'`` lines.

    Ignored and layout-only nodes are left out (their children move up a level); a text node
    that only repeats its parent's name is dropped, as in BrowserGym.
    """
    by_id = {n["nodeId"]: n for n in nodes}
    roots = [n for n in nodes if not n.get("parentId") or n["parentId"] not in by_id]
    lines: list[str] = []

    def visit(node: Mapping[str, Any], depth: int, parent_name: str, parent_bid: str | None) -> None:
        role = _value(node.get("role"))
        name = _value(node.get("name")).strip()
        shown = not node.get("ignored") and role not in _TRANSPARENT and role != "RootWebArea"
        if role == "StaticText":
            shown = bool(name) and name not in parent_name
        if role in ("generic", "group", "Section") and name:
            shown = not node.get("ignored")  # a named generic element (e.g. aria-label) is worth showing
        if shown:
            bid = bids.get(node.get("backendDOMNodeId", -1))
            # text gets a bid only when its element is not on a line of its own already
            parts = [f"[{bid}]"] if bid is not None and not (role == "StaticText" and bid == parent_bid) else []
            parts += [role, _quote(name, max_name)]
            value = _value(node.get("value"))
            if value and role in ("textbox", "searchbox", "combobox", "spinbutton", "slider"):
                parts.append(f"value={_quote(value, max_name)}")
            parts += _properties(node)
            lines.append("  " * depth + " ".join(parts))
        child_depth = depth + 1 if shown else depth
        own_bid = bids.get(node.get("backendDOMNodeId", -1)) if shown else parent_bid
        for child_id in node.get("childIds", []):
            if child_id in by_id:
                text = f"{name} {_value(node.get('value'))}"  # a textbox's text node repeats its value
                visit(by_id[child_id], child_depth, text if shown else parent_name, own_bid)

    for root in roots:
        visit(root, 0, "", None)
    return "\n".join(lines)


def render_observation(goal: str, url: str, title: str, tree: str, last_action_error: str = "",
                       extra: str = "") -> str:
    """The text an agent gets each turn."""
    parts = [f"Goal: {goal}", f"URL: {url}", f"Title: {title}"]
    if extra:
        parts.append(extra)
    parts += ["Accessibility tree:", tree or "(empty page)"]
    if last_action_error:
        parts.append(f"last_action_error: {last_action_error}")
    return "\n".join(parts)
