"""The shop's products and shopping instructions, generated from a seed, and how a purchase is scored.

In the spirit of WebShop (Yao et al. 2022): an instruction names a product type, a material, a
colour, a size and a price limit, and the reward is the share of those the purchased item
matches, 1.0 only for an exact match. Every instruction is drawn from a real product, so each
has at least one exact answer; the catalogue holds look-alikes that differ in one attribute.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# category -> (materials it comes in, its sizes, price range in dollars)
CATEGORIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[int, int]]] = {
    "shirt": (("cotton", "linen", "silk", "polyester"), ("S", "M", "L", "XL"), (12, 60)),
    "t-shirt": (("cotton", "polyester", "bamboo"), ("XS", "S", "M", "L", "XL"), (6, 30)),
    "sweater": (("wool", "cashmere", "cotton", "acrylic"), ("S", "M", "L", "XL"), (20, 120)),
    "jacket": (("leather", "denim", "nylon", "wool"), ("S", "M", "L", "XL"), (35, 200)),
    "jeans": (("denim",), ("28", "30", "32", "34", "36"), (20, 90)),
    "shorts": (("cotton", "linen", "denim", "nylon"), ("S", "M", "L"), (10, 40)),
    "dress": (("cotton", "silk", "linen", "polyester"), ("XS", "S", "M", "L"), (18, 110)),
    "skirt": (("cotton", "denim", "wool", "silk"), ("XS", "S", "M", "L"), (15, 70)),
    "sneakers": (("canvas", "leather", "mesh"), ("38", "39", "40", "41", "42", "43", "44"), (25, 120)),
    "boots": (("leather", "suede", "rubber"), ("38", "39", "40", "41", "42", "43", "44"), (40, 180)),
    "hat": (("wool", "cotton", "straw"), ("S", "M", "L"), (8, 45)),
    "socks": (("cotton", "wool", "bamboo"), ("S", "M", "L"), (3, 15)),
}
COLOURS = ("black", "white", "grey", "navy", "blue", "red", "green", "beige", "brown", "pink", "yellow")
BRANDS = ("Alder", "Birchway", "Cobalt & Co", "Dunmore", "Elmstead", "Fenwick", "Grayson", "Harrow", "Ivory Lane",
          "Juniper", "Kestrel", "Larkfield", "Marlow", "Northgate", "Oakridge", "Penrose")
STYLES = ("classic", "slim", "relaxed", "everyday", "premium", "lightweight", "vintage", "essential")
PLURAL = ("jeans", "shorts", "sneakers", "boots", "socks")


@dataclass(frozen=True)
class Product:
    id: int
    title: str
    category: str
    material: str
    colours: tuple[str, ...]
    sizes: tuple[str, ...]
    price: float
    rating: float
    description: str


@dataclass(frozen=True)
class Goal:
    """What to buy: a ``category`` of ``material`` in ``colour`` and ``size``, costing at most ``max_price``."""

    category: str
    material: str
    colour: str
    size: str
    max_price: int

    def instruction(self) -> str:
        article = "" if self.category in PLURAL else "a "
        return (f"Buy {article}{self.colour} {self.material} {self.category} in size {self.size} "
                f"for at most ${self.max_price}.")


def generate_catalog(num_products: int = 300, seed: int = 0) -> list[Product]:
    """``num_products`` products, the same for the same seed."""
    rng = random.Random(f"shop-catalog-{seed}")
    products = []
    for pid in range(1, num_products + 1):
        category = rng.choice(list(CATEGORIES))
        materials, sizes, (low, high) = CATEGORIES[category]
        material = rng.choice(materials)
        brand, style = rng.choice(BRANDS), rng.choice(STYLES)
        colours = tuple(rng.sample(COLOURS, rng.randint(1, 4)))
        kept = tuple(s for s in sizes if rng.random() < 0.75) or (rng.choice(sizes),)
        price = round(rng.uniform(low, high), 0) - 0.01
        title = f"{brand} {style} {material} {category}"
        description = (f"A {style} {category} in {material} by {brand}. Available in {', '.join(colours)}; "
                       f"sizes {', '.join(kept)}.")
        products.append(Product(pid, title, category, material, colours, kept, price,
                                round(rng.uniform(3.0, 5.0), 1), description))
    return products


def goal_for(product: Product, rng: random.Random) -> Goal:
    """An instruction that ``product`` fulfils: one of its colours and sizes, a price limit just above it."""
    limit = int(math.ceil((product.price + rng.uniform(0.5, 8)) / 5) * 5)
    return Goal(product.category, product.material, rng.choice(product.colours), rng.choice(product.sizes), limit)


def item_score(goal: Goal, product: Product, colour: str, size: str) -> float:
    """Share of the goal's five attributes the bought item matches (Yao et al. 2022's attribute reward)."""
    matches = (product.category == goal.category, product.material == goal.material, colour == goal.colour,
               size == goal.size, product.price <= goal.max_price)
    return sum(matches) / len(matches)


def matches_product(goal: Goal, product: Product) -> bool:
    """Whether ``product`` can fulfil ``goal`` once the right colour and size are chosen."""
    return (product.category == goal.category and product.material == goal.material
            and goal.colour in product.colours and goal.size in product.sizes and product.price <= goal.max_price)
