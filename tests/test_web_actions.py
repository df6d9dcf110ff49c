"""Parsing web actions out of model text (BrowserGym's syntax); no browser needed."""

import socket
import time

import pytest

from posttrain.envs.web.actions import Action, ActionError, parse_action, same_site
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
