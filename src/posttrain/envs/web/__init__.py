"""Web agents on a real browser: MiniWoB++ task pages and a generated shop, in Chromium via Playwright."""

from posttrain.envs.web.actions import Action, ActionError, parse_action
from posttrain.envs.web.env import WebEnv
from posttrain.envs.web.miniwob import TIERS, MiniWoBEnv
from posttrain.envs.web.shop.env import WebShopEnv

__all__ = ["TIERS", "Action", "ActionError", "MiniWoBEnv", "WebEnv", "WebShopEnv", "parse_action"]
