"""The shop website: plain server-rendered HTML over a generated catalogue, served by the env.

Pages: home (categories), search results (10 a page), product pages (colour and size options,
"Add to cart"), the cart, checkout and the order confirmation. The site records what the
episode did (pages seen, cart, orders) in :class:`ShopState`, which the env reads to score.
"""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from posttrain.envs.web.shop.catalog import CATEGORIES, Product

PAGE_SIZE = 10


@dataclass(frozen=True)
class Item:
    product: Product
    colour: str
    size: str


@dataclass
class ShopState:
    """What happened on the site in this episode."""

    viewed: list[int] = field(default_factory=list)  # product ids, in order
    result_categories: set[str] = field(default_factory=set)  # categories shown on result pages
    cart: list[Item] = field(default_factory=list)
    orders: list[list[Item]] = field(default_factory=list)


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def tokens(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z0-9][a-z0-9-]*", text.lower())}


def search(products: list[Product], query: str) -> list[Product]:
    """Products sharing words with ``query`` (title, colours, category), most shared first."""
    wanted = tokens(query)
    scored = []
    for p in products:
        shared = len(wanted & tokens(f"{p.title} {' '.join(p.colours)}"))
        if shared:
            scored.append((-shared, p.id, p))
    return [p for _, _, p in sorted(scored)]


def _page(title: str, body: str, cart_size: int) -> str:
    e = html.escape
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)} - Threadline shop</title></head><body>"
            "<header><a href='/'>Home</a> "
            "<form action='/search' method='get' role='search'><input name='q' aria-label='Search products'> "
            "<button type='submit'>Search</button></form> "
            f"<a href='/cart'>Cart ({cart_size})</a></header><main>{body}</main></body></html>")


class ShopSite:
    """Renders the pages and keeps the episode's :class:`ShopState` (one episode at a time)."""

    def __init__(self, products: list[Product]):
        self.products = {p.id: p for p in products}
        self._ordered = products
        self._lock = threading.Lock()
        self.state = ShopState()

    def reset(self) -> None:
        with self._lock:
            self.state = ShopState()

    # ------------------------------------------------------------ pages

    def home(self) -> str:
        links = "".join(f"<li><a href='/search?q={c}'>{c.capitalize()}</a></li>" for c in CATEGORIES)
        return f"<h1>Welcome to Threadline</h1><h2>Shop by category</h2><ul>{links}</ul>"

    def results(self, query: str, page: int) -> str:
        found = search(self._ordered, query)
        pages = max(1, -(-len(found) // PAGE_SIZE))
        page = min(max(page, 1), pages)
        shown = found[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        self.state.result_categories |= {p.category for p in shown}
        e = html.escape
        rows = "".join(f"<li><a href='/product/{p.id}'>{e(p.title)}</a> ${p.price:.2f}, colours: "
                       f"{e(', '.join(p.colours))}</li>" for p in shown)
        nav = ""
        if page > 1:
            nav += f"<a href='/search?q={e(query)}&page={page - 1}'>Previous page</a> "
        if page < pages:
            nav += f"<a href='/search?q={e(query)}&page={page + 1}'>Next page</a>"
        summary = f"{len(found)} results for '{e(query)}', page {page} of {pages}" if found else \
            f"No products match '{e(query)}'. Try other words."
        return f"<h1>Search results</h1><p>{summary}</p><ul>{rows}</ul><nav>{nav}</nav>"

    def product(self, pid: int) -> str | None:
        p = self.products.get(pid)
        if p is None:
            return None
        self.state.viewed.append(pid)
        e = html.escape
        colours = "".join(f"<option value='{c}'>{c}</option>" for c in p.colours)
        sizes = "".join(f"<option value='{s}'>{s}</option>" for s in p.sizes)
        return (f"<h1>{e(p.title)}</h1><p>Price: ${p.price:.2f}</p><p>Rating: {p.rating} of 5</p>"
                f"<p>{e(p.description)}</p><form action='/cart/add' method='post'>"
                f"<input type='hidden' name='product' value='{p.id}'>"
                f"<label>Colour <select name='colour'>{colours}</select></label> "
                f"<label>Size <select name='size'>{sizes}</select></label> "
                "<button type='submit'>Add to cart</button></form>")

    def cart(self) -> str:
        if not self.state.cart:
            return "<h1>Your cart</h1><p>Your cart is empty.</p>"
        e = html.escape
        rows = "".join(
            f"<li>{e(i.product.title)}, colour {i.colour}, size {i.size}, ${i.product.price:.2f} "
            f"<form action='/cart/remove' method='post' style='display:inline'><input type='hidden' name='index' "
            f"value='{n}'><button type='submit'>Remove {e(i.product.title)}</button></form></li>"
            for n, i in enumerate(self.state.cart))
        total = sum(i.product.price for i in self.state.cart)
        return (f"<h1>Your cart</h1><ul>{rows}</ul><p>Total: ${total:.2f}</p>"
                "<a href='/checkout'>Proceed to checkout</a>")

    def checkout(self) -> str:
        if not self.state.cart:
            return "<h1>Checkout</h1><p>Your cart is empty.</p>"
        total = sum(i.product.price for i in self.state.cart)
        return (f"<h1>Checkout</h1><p>{len(self.state.cart)} item(s), total ${total:.2f}.</p>"
                "<form action='/checkout' method='post'><button type='submit'>Place order</button></form>")

    # ------------------------------------------------------------ form posts

    def add(self, form: dict[str, str]) -> str:
        p = self.products.get(int(form.get("product", "0") or 0))
        if p is None or form.get("colour") not in p.colours or form.get("size") not in p.sizes:
            return "/cart"
        self.state.cart.append(Item(p, form["colour"], form["size"]))
        return "/cart"

    def remove(self, form: dict[str, str]) -> str:
        index = int(form.get("index", "-1") or -1)
        if 0 <= index < len(self.state.cart):
            del self.state.cart[index]
        return "/cart"

    def place_order(self) -> str:
        if not self.state.cart:
            return "/checkout"
        self.state.orders.append(self.state.cart)
        self.state.cart = []
        return f"/order/{len(self.state.orders)}"

    def handle(self, method: str, path: str, form: dict[str, str]) -> tuple[int, str]:
        """(status, HTML) for a GET, or (303, redirect target) for a POST."""
        url = urlsplit(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._lock:
            if method == "POST":
                action = {"/cart/add": lambda: self.add(form), "/cart/remove": lambda: self.remove(form),
                          "/checkout": self.place_order}.get(url.path)
                return (303, action()) if action else (404, _page("Not found", "<h1>Not found</h1>", 0))
            body, title = None, ""
            if url.path == "/":
                body, title = self.home(), "Home"
            elif url.path == "/search":
                page = int(query.get("page", "1")) if query.get("page", "1").isdigit() else 1
                body, title = self.results(query.get("q", ""), page), "Search results"
            elif re.fullmatch(r"/product/\d+", url.path):
                body = self.product(int(url.path.rsplit("/", 1)[1]))
                title = self.products[int(url.path.rsplit("/", 1)[1])].title if body else ""
            elif url.path == "/cart":
                body, title = self.cart(), "Cart"
            elif url.path == "/checkout":
                body, title = self.checkout(), "Checkout"
            elif re.fullmatch(r"/order/\d+", url.path) and 0 < int(url.path.rsplit("/", 1)[1]) <= len(self.state.orders):
                body, title = f"<h1>Thank you!</h1><p>Order {url.path.rsplit('/', 1)[1]} is placed.</p>", "Order placed"
            if body is None:
                return 404, _page("Not found", "<h1>Page not found</h1>", len(self.state.cart))
            return 200, _page(title, body, len(self.state.cart))

    def handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args) -> None:  # noqa: A002 - the stdlib's signature
                pass

            def _answer(self, method: str) -> None:
                form: dict[str, str] = {}
                if method == "POST":
                    length = int(self.headers.get("Content-Length") or 0)
                    form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                status, content = site.handle(method, self.path, form)
                if status == 303:
                    self.send_response(303)
                    self.send_header("Location", content)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = content.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self._answer("POST")

        return Handler
