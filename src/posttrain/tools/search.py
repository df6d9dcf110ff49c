"""Search over a local text corpus with BM25 (Robertson & Zaragoza, 2009), via ``rank_bm25``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rank_bm25 import BM25Okapi

from posttrain.tools.registry import ToolError

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def search_tool(documents: Sequence[str], top_k: int = 3) -> Callable[[str], str]:
    """A ``search(query)`` tool over ``documents`` returning the ``top_k`` best matches."""
    if not documents:
        raise ValueError("search_tool needs at least one document")
    index = BM25Okapi([_words(d) for d in documents])

    def search(query: str) -> str:
        """Search the document collection and return the best-matching passages.

        Args:
            query: Keywords to look for, e.g. "capital of France".
        """
        terms = _words(query)
        if not terms:
            raise ToolError("empty query; give some keywords to search for")
        scores = index.get_scores(terms)
        best = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_k]
        hits = [f"[{rank + 1}] {documents[i]}" for rank, i in enumerate(best) if scores[i] > 0]
        return "\n".join(hits) or "no results"

    return search
