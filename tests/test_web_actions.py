"""Parsing web actions out of model text (BrowserGym's syntax), and clicks that cannot land, in Chromium."""

import socket
import time

import pytest

from posttrain.envs.web.actions import Action, ActionError, parse_action, run_action, same_site
from posttrain.envs.web.browser import BrowserHost
from posttrain.envs.web.observation import BID
from posttrain.envs.web.server import LocalServer


def test_takes_the_last_well_formed_call():
    text = "I should click the button.\n```python\nclick('12')\n```\nNo wait: fill('7', \"blue shirt\")"
    assert parse_action(text) == Action("fill", ("7", "blue shirt"))


def test_skips_a_broken_last_call_for_an_earlier_good_one():
    assert parse_action("click('3') then click(") == Action("click", ("3",))


def test_arguments_are_checked():
    assert parse_action("click(12)") == Action("click", ("12",))
    assert parse_action("scroll(0, 200)") == Action("scroll", (0.0, 200.0))
    assert parse_action("fill('4', 'it\\'s (fine)')") == Action("fill", ("4", "it's (fine)"))
    assert parse_action("go_back()") == Action("go_back", ())


@pytest.mark.parametrize("text, says", [
    ("the answer is 42", "no action found"),
    ("click()", "takes 1 argument"),
    ("fill('3')", "takes 2 argument"),
    ("click(bid)", "literal arguments"),
    ("scroll('up', 'down')", "should be a number"),
    ("click('3'", "unclosed parenthesis"),
    ("fill('3', '" + "x" * 20_000 + "')", "no closing parenthesis within 10,000 characters"),
])
def test_bad_actions_say_what_was_expected(text, says):
    with pytest.raises(ActionError, match=says):
        parse_action(text)


def test_same_site():
    assert same_site("http://127.0.0.1:8000/cart", "http://127.0.0.1:8000/")
    assert not same_site("http://127.0.0.1:8001/", "http://127.0.0.1:8000/")
    assert not same_site("https://example.com/", "http://127.0.0.1:8000/")


def test_a_request_the_browser_drops_is_not_a_traceback(tmp_path, capfd):
    (tmp_path / "big.html").write_bytes(b"x" * 20_000_000)  # more than the socket buffers hold
    server = LocalServer.static(str(tmp_path))
    try:
        port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
            sock.sendall(b"GET /big.html HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(1024)  # the server is sending; the page goes away mid-transfer
        time.sleep(0.5)
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err


CLICK_PAGE = """
<button {BID}="ok" onclick="document.title='clicked ok'">OK</button>
<button {BID}="off" disabled onclick="document.title='clicked off'">Off</button>
<button {BID}="hidden" style="visibility: hidden" onclick="document.title='clicked hidden'">Hidden</button>
<div style="position: relative; height: 40px">
  <button {BID}="under" onclick="document.title='clicked under'">Under</button>
  <div id="veil" style="position: absolute; inset: 0; background: white"></div>
</div>
<label {BID}="label"><input {BID}="box" type="checkbox" onchange="document.title='clicked label'"> <span>Agree</span></label>
<div style="height: 3000px"></div>
<button {BID}="far" onclick="document.title='clicked far'">Far below</button>
"""


@pytest.fixture(scope="module")
def host():
    host = BrowserHost()
    yield host
    host.close()


@pytest.mark.parametrize("bid, error", [
    ("ok", None), ("far", None), ("label", None),  # scrolled into view; a label's text checks its box
    ("off", "click('off') failed: element is disabled"), ("hidden", "click('hidden') failed: element is not visible"),
    ("under", "click('under') failed: another element covers it (div#veil)"),
    ("gone", "click: no element with bid 'gone' on this page"),
    ('ok"], [bid="far', """click: no element with bid 'ok"], [bid="far' on this page"""),  # not CSS
])
def test_a_click_lands_or_says_why_not(host, bid, error):
    async def click() -> tuple[str, str | None]:
        context = await host.new_context()
        try:
            page = await context.new_page()
            await page.set_content(CLICK_PAGE.replace("{BID}", BID))
            try:
                await run_action(page, Action("click", (bid,)), site="http://127.0.0.1/")
                return await page.title(), None
            except ActionError as e:
                return await page.title(), str(e)
        finally:
            await host.close_context(context)

    title, raised = host.run(click(), timeout=30)
    if error is None:
        assert raised is None and title == f"clicked {bid}"
    else:
        assert raised == error and title == ""
