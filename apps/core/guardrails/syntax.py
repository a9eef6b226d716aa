"""The regular-expression subset of guardrail patterns: a strict parser to a small tree.

Admin patterns (a team's member or record number formats) run on every request and every streamed
answer, so they run on RE2 (linear time, no backtracking) and must mean the same to every tool that
reads them. This parser accepts only the syntax that Python's `re` and RE2 read alike, and refuses the
rest with a message a person can act on: no backreferences, lazy or possessive quantifiers, flags other
than `i`, Unicode or POSIX classes, nested sets, unescaped `{` or `]`-first classes. The tree it builds is
what `apps.core.guardrails.forms` turns into the pattern that runs, its width and the pattern of its
prefixes (what lets the streaming scanner hold back only text that could still become a match).

Accepted: literals (escape punctuation with a backslash), `.`, classes `[...]` with ranges and
`\\d \\w \\s \\D \\W \\S`, `\\n \\t \\r \\f \\v \\xHH`, groups `(...)`, `(?:...)`, `(?P<name>...)`,
`(?i:...)`, a leading `(?i)`, alternation, the greedy quantifiers `? * + {n} {m,n} {m,}`, and the
anchors `^ $ \\b \\B`. Lookarounds `(?=...) (?!...) (?<=...) (?<!...)` only where the caller allows them
(the built-in detectors, which run on Python's `re`; RE2 has none).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

MAX_REPEAT = 1000  # RE2's own bound on a counted repetition
MAX_DEPTH = 32  # nested groups


class PatternError(ValueError):
    """A pattern outside the subset; the message says where and why."""


@dataclass(frozen=True)
class Char:
    """One character: a literal, a class, an escape class or `.` (`src` is its canonical source)."""

    src: str


@dataclass(frozen=True)
class Edge:
    """A zero-width anchor: `^`, `$`, `\\b`, `\\B`."""

    src: str


@dataclass(frozen=True)
class Look:
    body: Node
    ahead: bool
    negative: bool


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    body: Node
    low: int
    high: int | None  # None: unbounded


@dataclass(frozen=True)
class Group:
    body: Node
    name: str | None = None
    ignore_case: bool = False


Node = Char | Edge | Look | Seq | Alt | Repeat | Group

_SPECIAL = frozenset(".^$*+?()[]{}|\\")
_CLASS_SPECIAL = frozenset("]\\^-[&~|")
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_CLASS_ESCAPES = frozenset("dDwWsS")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_")


def literal(char: str, special: frozenset[str] = _SPECIAL) -> str:
    """`char` as pattern source that both engines read as that character."""
    for name, value in _CONTROL_ESCAPES.items():
        if char == value:
            return "\\" + name
    if char in special:
        return "\\" + char
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    return char


def parse(pattern: str, *, lookarounds: bool = False) -> Node:
    """The tree of `pattern`, or `PatternError`."""
    return _Parser(pattern, lookarounds).parse()


class _Parser:
    def __init__(self, text: str, lookarounds: bool) -> None:
        self.text = text
        self.pos = 0
        self.lookarounds = lookarounds
        self.depth = 0

    def fail(self, why: str) -> PatternError:
        return PatternError(f"{why} (at position {self.pos})")

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.text[at] if at < len(self.text) else ""

    def take(self, prefix: str) -> bool:
        if self.text.startswith(prefix, self.pos):
            self.pos += len(prefix)
            return True
        return False

    def parse(self) -> Node:
        ignore_case = self.take("(?i)")
        node = self.alternation()
        if self.pos < len(self.text):
            raise self.fail("unbalanced parenthesis ')'")
        return Group(node, ignore_case=True) if ignore_case else node

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.take("|"):
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.pos < len(self.text) and self.peek() not in "|)":
            items.append(self.quantified())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self) -> Node:
        atom = self.atom()
        bounds = self.quantifier()
        if bounds is None:
            return atom
        if isinstance(atom, Edge | Look):
            raise self.fail("nothing to repeat: an anchor or lookaround cannot be repeated")
        if self.peek() and self.peek() in "?+*{":
            raise self.fail("lazy, possessive or repeated quantifiers are not supported")
        return Repeat(atom, *bounds)

    def quantifier(self) -> tuple[int, int | None] | None:
        simple: dict[str, tuple[int, int | None]] = {"?": (0, 1), "*": (0, None), "+": (1, None)}
        char = self.peek()
        if char in simple and char:
            self.pos += 1
            return simple[char]
        if char != "{":
            return None
        end = self.text.find("}", self.pos)
        low, comma, high = self.text[self.pos + 1 : end].partition(",") if end > 0 else ("", "", "")
        if not low.isdecimal() or not low.isascii() or (high and not (high.isdecimal() and high.isascii())):
            raise self.fail("'{' must start a repetition {n}, {m,n} or {m,}; escape a literal brace as \\{")
        bounds = (int(low), int(high) if high else (None if comma else int(low)))
        if any(b is not None and b > MAX_REPEAT for b in bounds):
            raise self.fail(f"a repetition count is at most {MAX_REPEAT}")
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise self.fail("a repetition {m,n} needs m <= n")
        self.pos = end + 1
        return bounds

    def atom(self) -> Node:
        char = self.peek()
        self.pos += 1
        if char == "(":
            return self.group()
        if char == "[":
            return Char(self.char_class())
        if char == "\\":
            return self.escape()
        if char == ".":
            return Char(".")
        if char in "^$":
            return Edge(char)
        if char in "*+?{":
            self.pos -= 1
            raise self.fail(f"nothing to repeat before '{char}'")
        return Char(literal(char))

    def group(self) -> Node:
        if self.depth >= MAX_DEPTH:
            raise self.fail(f"groups nest at most {MAX_DEPTH} deep")
        self.depth += 1
        node = self.group_body()
        self.depth -= 1
        if not self.take(")"):
            raise self.fail("missing ')'")
        return node

    def group_body(self) -> Node:
        if self.take("?:"):
            return Group(self.alternation())
        if self.take("?i:"):
            return Group(self.alternation(), ignore_case=True)
        if self.take("?P<"):
            end = self.text.find(">", self.pos)
            name = self.text[self.pos : end] if end > 0 else ""
            if not name or not set(name) <= _NAME_CHARS or name[0].isdigit():
                raise self.fail("a group name is letters, digits and _, not starting with a digit")
            self.pos = end + 1
            return Group(self.alternation(), name=name)
        for prefix, ahead, negative in (("?=", True, False), ("?!", True, True), ("?<=", False, False)):
            if self.take(prefix):
                return self.look(ahead, negative)
        if self.take("?<!"):
            return self.look(False, True)
        if self.peek() == "?":
            raise self.fail("unsupported group '(?': use (?:...), (?P<name>...) or (?i:...)")
        return Group(self.alternation())

    def look(self, ahead: bool, negative: bool) -> Node:
        if not self.lookarounds:
            raise self.fail("lookarounds are not supported (patterns run on RE2, which has none)")
        return Look(self.alternation(), ahead, negative)

    def escape(self) -> Node:
        char = self.peek()
        self.pos += 1
        if char == "b" or char == "B":
            return Edge("\\" + char)
        return Char(self.escaped_char(char, in_class=False))

    def escaped_char(self, char: str, *, in_class: bool) -> str:
        """The source of `\\<char>` (the backslash read already)."""
        if not char:
            raise self.fail("a pattern cannot end with a backslash")
        if char in _CLASS_ESCAPES or char in _CONTROL_ESCAPES:
            return "\\" + char
        if char == "x":
            digits = self.text[self.pos : self.pos + 2]
            if len(digits) != 2 or not all(d in string.hexdigits for d in digits):
                raise self.fail("\\x takes two hex digits")
            self.pos += 2
            return literal(chr(int(digits, 16)), _CLASS_SPECIAL if in_class else _SPECIAL)
        if char.isdigit():
            raise self.fail("backreferences (\\1) are not supported")
        if char.isalnum() or char == "_":
            raise self.fail(f"unsupported escape '\\{char}'")
        return literal(char, _CLASS_SPECIAL if in_class else _SPECIAL)

    def char_class(self) -> str:
        negate = self.take("^")
        if self.peek() == "]":
            raise self.fail("a class cannot start with ']': escape it as \\]")
        parts: list[str] = []
        while not self.take("]"):
            parts.append(self.class_item())
        return "[" + ("^" if negate else "") + "".join(parts) + "]"

    def class_item(self) -> str:
        first, is_char = self.class_char()
        if self.peek() != "-" or self.peek(1) in ("]", ""):
            return first
        self.pos += 1
        last, last_is_char = self.class_char()
        if not (is_char and last_is_char):
            raise self.fail("a range needs single characters at both ends")
        low, high = self._decoded(first), self._decoded(last)
        if low > high:
            raise self.fail("a range needs its first character before its last")
        return first + "-" + last

    def class_char(self) -> tuple[str, bool]:
        """One class member's source, and whether it is a single character (a range end)."""
        char = self.peek()
        if not char:
            raise self.fail("missing ']'")
        self.pos += 1
        if char == "[":
            raise self.fail("a '[' inside a class must be escaped as \\[ (no nested or POSIX sets)")
        if char == "\\":
            escaped = self.peek()
            self.pos += 1
            src = self.escaped_char(escaped, in_class=True)
            return src, escaped not in _CLASS_ESCAPES
        return literal(char, _CLASS_SPECIAL), True

    @staticmethod
    def _decoded(src: str) -> str:
        if src.startswith("\\x"):
            return chr(int(src[2:], 16))
        if src.startswith("\\") and src[1:] in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[src[1:]]
        return src[-1]
