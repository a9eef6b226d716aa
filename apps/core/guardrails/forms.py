"""What a parsed pattern (`apps.core.guardrails.syntax`) turns into: the pattern that runs, its width, and
the pattern of its prefixes with the bound of how much text those can span.

The prefix pattern is what makes streamed redaction exact. A regex engine decides a match at `s` from
the text it reads from `s` on: the characters it consumes and those its lookaheads and anchors peek at.
If the text ended while the engine was still reading from `s`, the text from `s` to the end is a
prefix of some string the pattern reads (assertions relaxed: that only widens the set). So the scanner
holds back from the earliest position whose remainder is such a prefix, and everything before it is
decided for good, whatever text comes next (`apps.core.guardrails.scan`).
"""

from __future__ import annotations

from apps.core.guardrails.syntax import Alt, Char, Edge, Group, Look, Node, Repeat, Seq

# An anchor reads the characters around its position: those before are known, the one after is part of
# the text that follows it anyway, except for `$`, which Python also lets match before a final newline.
END_PEEK = "(?:\\n)?"


def source(node: Node, *, exact: bool = True) -> str:
    """The pattern of `node`. `exact=False` drops anchors and lookarounds (a superset of the strings)."""
    if isinstance(node, Char):
        return node.src
    if isinstance(node, Edge):
        return node.src if exact else ""
    if isinstance(node, Look):
        if not exact:
            return ""
        kind = (
            ("?=" if not node.negative else "?!") if node.ahead else ("?<=" if not node.negative else "?<!")
        )
        return f"({kind}{source(node.body)})"
    if isinstance(node, Seq):
        return "".join(source(item, exact=exact) for item in node.items)
    if isinstance(node, Alt):
        return "(?:" + "|".join(source(option, exact=exact) for option in node.options) + ")"
    if isinstance(node, Repeat):
        return f"(?:{source(node.body, exact=exact)}){_bounds(node.low, node.high)}"
    if node.ignore_case:
        return f"(?i:{source(node.body, exact=exact)})"
    if node.name is not None and exact:
        return f"(?P<{node.name}>{source(node.body)})"
    return f"(?:{source(node.body, exact=exact)})"


def _bounds(low: int, high: int | None) -> str:
    if high is None:
        return "*" if low == 0 else ("+" if low == 1 else f"{{{low},}}")
    return "?" if (low, high) == (0, 1) else (f"{{{low}}}" if low == high else f"{{{low},{high}}}")


def prefixes(node: Node) -> str:
    """A pattern matching exactly the prefixes (the empty one included) of what `node` reads:
    the text it consumes and what its lookaheads and right-looking anchors peek at."""
    if isinstance(node, Char):
        return f"(?:{node.src})?"
    if isinstance(node, Edge):
        return END_PEEK if node.src == "$" else ""
    if isinstance(node, Look):
        return prefixes(node.body) if node.ahead else ""
    if isinstance(node, Seq):
        if not node.items:
            return ""
        tail = prefixes(node.items[-1])
        for item in reversed(node.items[:-1]):
            tail = f"(?:{prefixes(item)}|{source(item, exact=False)}{tail})"
        return tail
    if isinstance(node, Alt):
        return "(?:" + "|".join(prefixes(option) for option in node.options) + ")"
    if isinstance(node, Repeat):
        if node.high == 0:
            return ""
        whole, part = source(node.body, exact=False), prefixes(node.body)
        if node.high is None:
            return f"(?:{whole})*{part}"
        return part if node.high == 1 else f"(?:{whole}){{0,{node.high - 1}}}{part}"
    return f"(?i:{prefixes(node.body)})" if node.ignore_case else f"(?:{prefixes(node.body)})"


def width(node: Node) -> tuple[int, int | None]:
    """The fewest and the most characters `node` consumes (None: no bound)."""
    if isinstance(node, Char):
        return 1, 1
    if isinstance(node, Edge | Look):
        return 0, 0
    if isinstance(node, Seq | Alt):
        parts = [width(n) for n in (node.items if isinstance(node, Seq) else node.options)]
        if not parts:
            return 0, 0
        highs = [high for _, high in parts]
        if isinstance(node, Alt):
            return min(low for low, _ in parts), None if None in highs else max(h or 0 for h in highs)
        return sum(low for low, _ in parts), None if None in highs else sum(h or 0 for h in highs)
    if isinstance(node, Repeat):
        low, high = width(node.body)
        if high == 0 or node.high == 0:
            return low * node.low, 0
        return low * node.low, None if high is None or node.high is None else high * node.high
    return width(node.body)


def reach(node: Node) -> int | None:
    """The longest text `prefixes(node)` matches: how far the scanner may hold back for this pattern."""
    if isinstance(node, Char):
        return 1
    if isinstance(node, Edge):
        return 1 if node.src == "$" else 0
    if isinstance(node, Look):
        return reach(node.body) if node.ahead else 0
    if isinstance(node, Seq):
        best, consumed = 0, 0
        for item in node.items:
            item_reach, item_high = reach(item), width(item)[1]
            if item_reach is None or item_high is None:
                return None
            best, consumed = max(best, consumed + item_reach), consumed + item_high
        return best
    if isinstance(node, Alt):
        reaches = [reach(option) for option in node.options]
        return None if None in reaches else max(r or 0 for r in reaches)
    if isinstance(node, Repeat):
        body_reach, body_high = reach(node.body), width(node.body)[1]
        if node.high == 0:
            return 0
        if node.high is None or body_reach is None or body_high is None:
            return None
        return (node.high - 1) * body_high + body_reach
    return reach(node.body)


def behind(node: Node) -> int:
    """The most characters before a match's start that its lookbehinds and anchors read."""
    if isinstance(node, Edge):
        return 1
    if isinstance(node, Look):
        return behind(node.body) if node.ahead else (width(node.body)[1] or 0)
    if isinstance(node, Seq | Alt):
        return max((behind(n) for n in (node.items if isinstance(node, Seq) else node.options)), default=0)
    if isinstance(node, Repeat | Group):
        return behind(node.body)
    return 0
