"""Java's ``route.topic.regex`` (Kafka's ``RegexRouter``, as Debezium's outbox router runs it), translated
to a Postgres ARE that routes every value as Java does, or refused at config load (docs/debezium.md,
"Which routing regexes harvest accepts").

Java runs ``matcher.matches()`` on the routed value, then ``matcher.replaceFirst(replacement)``, which
searches again (``find()``, leftmost match, alternatives and quantifiers in Java's priority order) and
keeps the text after that match. Postgres matches the whole value (``^(?:…)$``) and sizes groups by
POSIX rules (longest, earlier groups first). The two agree on the subset accepted here:

- single-character atoms (literals, escapes, ``.``, ``[…]`` classes, ``\\d \\w \\s`` and negations) with
  greedy quantifiers: both engines give each quantifier, left to right, the longest run that lets the rest
  match, and Java's ``find()`` then matches the whole value too;
- groups (plain, named, non-capturing) without quantifiers, at most 9 capturing ones (``regexp_replace``
  has ``\\1``-``\\9``);
- alternation only between plain literal strings of which none is a prefix of another: at most one
  branch matches at any position, so "first" (Java) and "longest" (POSIX) pick the same;
- ``^`` first and ``$`` last; ``\\b`` / ``\\B`` where the characters on both sides come from ASCII-only
  atoms or the value's edge (JDK 17 counts non-ASCII letters as word characters, JDK 19+ does not).

Java's character classes are spelled out (``\\w`` is ``[A-Za-z0-9_]`` in Java, locale-dependent in
Postgres; ``.`` excludes Java's line terminators), and the relay matches under collation "C", so the
routing does not depend on the database's locale.
tests/test_producer/mapping/test_java_regex.py runs the JDK's ``java.util.regex`` beside Postgres over a corpus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from harvest_outbox.producer.errors import ConfigError, shown

#: Java's ``.`` (no DOTALL, no UNIX_LINES): anything but a line terminator.
_JAVA_LINE_TERMINATORS = "\n\r\u0085\u2028\u2029"
#: An ARE class of Java's line terminators (a value holding one is not matched by ``.*``).
LINE_TERMINATOR_CLASS = "[\\u000a\\u000d\\u0085\\u2028\\u2029]"
_JAVA_CLASSES = {
    "d": (("0", "9"),),
    "w": (("A", "Z"), ("a", "z"), ("0", "9"), ("_", "_")),
    "s": tuple((c, c) for c in " \t\n\x0b\f\r"),
}
_CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "a": "\a", "e": "\x1b"}
_NAMED_GROUP = re.compile(r"\(\?<([A-Za-z][A-Za-z0-9]*)>")
_COUNT = re.compile(r"\{(\d+)(,(\d*))?\}")
#: Postgres' largest repetition count (RE_DUPMAX); Java allows more, Postgres refuses the pattern.
_PG_DUPMAX = 255
_MAX_GROUPS = 9
_WORD = "[A-Za-z0-9_]"
_FIX = "rewrite it with the constructs docs/debezium.md lists as accepted"


@dataclass(frozen=True)
class _Atom:
    """One character from a set: ``text`` is its ARE (a literal or a bracket expression)."""

    text: str
    ascii_only: bool  # every character it matches is ASCII
    literal: str | None = None  # the character, for an atom that is one fixed character
    low: int = 1
    high: int | None = 1  # None: unbounded


@dataclass(frozen=True)
class _Alt:
    branches: tuple[str, ...]  # plain literal strings, none a prefix of another


@dataclass(frozen=True)
class _Zero:
    """A zero-width element: ``^``, ``$``, ``\\b`` or ``\\B`` (``kind``) at pattern offset ``at``."""

    kind: str
    at: int


@dataclass(frozen=True)
class _Mark:
    """A group's parenthesis as the ARE writes it: ``(``, ``(?:`` or ``)``."""

    text: str


_Item = _Atom | _Alt | _Zero | _Mark


@dataclass(frozen=True)
class JavaRegex:
    """A routing regex accepted by :func:`translate`."""

    pattern: str  # the ARE, anchored to the whole value
    replacement: str  # regexp_replace's
    groups: dict[str, int]  # named group -> number


def _char_are(c: str) -> str:
    # Letters and digits as they are (readable); anything else as a \u escape, which means the
    # character itself in and outside a bracket expression, whatever it is.
    if c.isascii() and (c.isalnum() or c == "_"):
        return c
    cp = ord(c)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


class _Parser:
    def __init__(self, regex: str, where: str) -> None:
        self.s, self.where, self.i = regex, where, 0
        self.items: list[_Item] = []
        self.groups: dict[str, int] = {}
        self.count = 0

    def refuse(self, what: str, why: str, fix: str = _FIX, at: int | None = None) -> ConfigError:
        pos = self.i if at is None else at
        return ConfigError(
            f"{self.where}: {shown(self.s)}: {what} (at offset {pos}) is not accepted: {why}; fix: {fix}"
        )

    # -- the grammar: alternation of sequences; groups hold the same ------------------------------

    def parse(self) -> list[_Item]:
        self.body()
        if self.i < len(self.s):  # only a stray ')' stops body() early
            raise self.refuse("')'", "it closes no group", "remove it or write \\) for the character")
        return self.items

    def body(self) -> None:
        start, alt_at = len(self.items), self.i
        branches = [self.sequence()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            if len(branches) == 1:
                alt_at = self.i
            self.i += 1
            branches.append(self.sequence())
        if len(branches) == 1:
            return
        words: list[str] = []
        for branch in branches:
            word = "".join(x.literal for x in branch if isinstance(x, _Atom) and x.literal is not None)
            if not branch or len(word) != len(branch):
                raise self.refuse(
                    "alternation '|'",
                    "Postgres picks the longest alternative, Java the first that matches, so only "
                    "alternatives that are plain non-empty literal strings are accepted",
                    "list literal alternatives (orders|customers), or route with one class, e.g. [a-z]+",
                    alt_at,
                )
            words.append(word)
        for x, short in enumerate(words):
            for y, long in enumerate(words):
                if x != y and long.startswith(short):
                    raise self.refuse(
                        "alternation '|'",
                        f"alternative {short!r} is a prefix of {long!r}: Java takes the first that matches, "
                        f"Postgres the longest",
                        "make no alternative a prefix of another, e.g. orders? instead of order|orders (on "
                        "'orders' Java's replaceFirst takes 'order' and keeps the 's' after the replacement)",
                        alt_at,
                    )
        # At most one alternative matches at any position: "first" and "longest" are the same one.
        del self.items[start:]
        self.items.append(_Alt(tuple(words)))

    def sequence(self) -> list[_Item]:
        start = len(self.items)
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            self.element()
        return self.items[start:]

    def element(self) -> None:
        c, at = self.s[self.i], self.i
        if c == "(":
            self.group()
            self.no_quantifier("a group", "quantify single characters or classes only, e.g. [a-z]+")
            return
        if c in "^$":
            self.i += 1
            self.items.append(_Zero(c, at))
            self.no_quantifier(repr(c), "remove the quantifier")
            return
        if c == "\\" and self.s[self.i + 1 : self.i + 2] in ("b", "B"):
            self.i += 2
            self.items.append(_Zero(self.s[at : at + 2], at))
            self.no_quantifier(self.s[at : at + 2], "remove the quantifier")
            return
        atom = self.atom()
        self.items.append(self.quantified(atom))

    def group(self) -> None:
        at = self.i
        m = _NAMED_GROUP.match(self.s, self.i)
        capturing = True
        if m:
            name = m.group(1)
            if name in self.groups:
                raise self.refuse(f"group name {name!r}", "it is defined twice (Java refuses it)", "rename one")
            self.count += 1
            self.groups[name] = self.count
            self.i = m.end()
        elif self.s.startswith("(?:", self.i):
            capturing = False
            self.i += 3
        elif self.s.startswith("(?", self.i):
            construct = self.s[self.i : self.i + 4]
            raise self.refuse(
                f"the group {construct!r}…",
                "lookarounds, atomic groups, inline flags and other special groups have no equal in "
                "Postgres' matching of the whole value",
                "use plain (…), named (?<name>…) or non-capturing (?:…) groups",
            )
        else:
            self.count += 1
            self.i += 1
        if self.count > _MAX_GROUPS:
            raise self.refuse(
                "a 10th capturing group",
                "Postgres' regexp_replace fills in groups 1-9 only",
                "use (?:…) for the others",
                at,
            )
        self.items.append(_Mark("(" if capturing else "(?:"))
        self.body()
        if self.i >= len(self.s):
            raise self.refuse("'('", "the group is not closed", "close it with ')'", at)
        self.i += 1
        self.items.append(_Mark(")"))

    def no_quantifier(self, what: str, fix: str) -> None:
        if self.i < len(self.s) and self.s[self.i] in "?*+{":
            raise self.refuse(
                f"a quantifier on {what}",
                "Postgres sizes repeated groups by other rules than Java",
                fix,
            )

    def atom(self) -> _Atom:
        c, at = self.s[self.i], self.i
        if c == ".":
            self.i += 1
            return _Atom("[^" + "".join(map(_char_are, _JAVA_LINE_TERMINATORS)) + "]", ascii_only=False)
        if c == "[":
            return self.bracket()
        if c == "\\":
            return self.escape(in_class=False)
        if c in "?*+{":
            raise self.refuse(repr(c), "it has nothing to repeat", "escape it (\\" + c + ")")
        if c in "]}":
            raise self.refuse(repr(c), "Java reads it as a literal, which is easy to misread", f"write \\{c}")
        self.i += 1
        if c.isascii() or not 0xD800 <= ord(c) <= 0xDFFF:
            return _Atom(_char_are(c), ascii_only=c.isascii(), literal=c)
        raise self.refuse("a lone surrogate", "it is not a character", "remove it", at)

    def escape(self, in_class: bool) -> _Atom:
        at = self.i
        if self.i + 1 >= len(self.s):
            raise self.refuse(
                "a trailing '\\'", "it escapes nothing (Java refuses the pattern)", "write \\\\ for a backslash"
            )
        e = self.s[self.i + 1]
        self.i += 2
        if e in _JAVA_CLASSES:
            body = _ranges(_JAVA_CLASSES[e])
            return _Atom(body if in_class else f"[{body}]", ascii_only=True)
        if e in "DWS":
            if in_class:
                raise self.refuse(
                    f"\\{e} inside [...]",
                    "a negated class cannot be merged into a bracket expression",
                    "use [^...] with the members spelled out",
                    at,
                )
            return _Atom("[^" + _ranges(_JAVA_CLASSES[e.lower()]) + "]", ascii_only=False)
        if e in _CHAR_ESCAPES:
            ch = _CHAR_ESCAPES[e]
        elif e == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", self.s[self.i : self.i + 2]):
            ch = chr(int(self.s[self.i : self.i + 2], 16))
            self.i += 2
        elif e == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", self.s[self.i : self.i + 4]):
            ch = chr(int(self.s[self.i : self.i + 4], 16))
            self.i += 4
            if 0xD800 <= ord(ch) <= 0xDFFF:
                raise self.refuse(
                    "a surrogate \\u escape",
                    "Java pairs surrogates, Postgres does not",
                    "write the character itself",
                    at,
                )
        elif not e.isascii() or not e.isalnum():
            ch = e  # Java: a backslash before a non-alphanumeric character quotes it
        else:
            raise self.refuse(
                f"the escape \\{e}",
                "harvest accepts \\d \\w \\s \\D \\W \\S \\b \\B \\t \\n \\r \\f \\a \\e \\xhh \\uhhhh and "
                "escaped punctuation; back references, \\p{…}, \\Q…\\E, \\A \\z \\Z \\G \\R \\h \\v and octal "
                "escapes have no equal here",
                "spell the characters out, e.g. [A-Za-z] for \\p{Alpha}",
                at,
            )
        return _Atom(_char_are(ch), ascii_only=ch.isascii(), literal=ch)

    def bracket(self) -> _Atom:
        at = self.i
        self.i += 1
        negated = self.s.startswith("^", self.i)
        self.i += negated
        members: list[str] = []
        ascii_only = not negated
        first = True
        while True:
            if self.i >= len(self.s):
                raise self.refuse("'['", "the class is not closed", "close it with ']'", at)
            c = self.s[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            if c in "[]" or self.s.startswith("&&", self.i):
                raise self.refuse(
                    f"{c!r} inside [...]",
                    "nested classes, unions and intersections (&&) are not accepted",
                    "escape the character (\\[ or \\]) or list the members in one class",
                )
            lo = self.class_char()
            if lo.literal is None:  # \d \w \s
                members.append(lo.text)
                ascii_only = ascii_only and lo.ascii_only
                first = False
                continue
            if self.s.startswith("-", self.i) and not self.s.startswith("-]", self.i):
                self.i += 1
                hi = self.class_char()
                if hi.literal is None or ord(hi.literal) < ord(lo.literal):
                    raise self.refuse(
                        "a range in [...]",
                        "its end is not a character at or after its start (Java refuses it)",
                        "write the range low-high",
                    )
                if self.s.startswith("-", self.i) and not self.s.startswith("-]", self.i):
                    raise self.refuse(
                        "'-' after a range",
                        "Java and Postgres read it differently",
                        "put '-' first or last in the class",
                    )
                members.append(f"{_char_are(lo.literal)}-{_char_are(hi.literal)}")
                ascii_only = ascii_only and hi.literal.isascii() and lo.literal.isascii()
            else:
                members.append(_char_are(lo.literal))
                ascii_only = ascii_only and lo.literal.isascii()
            first = False
        return _Atom("[" + ("^" if negated else "") + "".join(members) + "]", ascii_only=ascii_only)

    def class_char(self) -> _Atom:
        if self.s[self.i] == "\\":
            if self.s[self.i + 1 : self.i + 2] in ("b", "B"):
                raise self.refuse(f"\\{self.s[self.i + 1]} inside [...]", "it is not a character", "remove it")
            return self.escape(in_class=True)
        c = self.s[self.i]
        self.i += 1
        return _Atom(_char_are(c), ascii_only=c.isascii(), literal=c)

    def quantified(self, atom: _Atom) -> _Atom:
        if self.i >= len(self.s) or self.s[self.i] not in "?*+{":
            return atom
        at = self.i
        c = self.s[self.i]
        if c == "{":
            m = _COUNT.match(self.s, self.i)
            if not m:
                raise self.refuse(
                    "'{'", "it is not a repetition count {n}, {n,} or {n,m}", "write \\{ for the character"
                )
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if max(low, high or 0) > _PG_DUPMAX:
                raise self.refuse(
                    m.group(0), f"Postgres refuses repetition counts above {_PG_DUPMAX}", "use a smaller count or * / +"
                )
            if high is not None and high < low:
                raise self.refuse(m.group(0), "its maximum is below its minimum (Java refuses it)", "write {min,max}")
            self.i = m.end()
        else:
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[c]
            self.i += 1
        if self.i < len(self.s) and self.s[self.i] in "?+":
            greedy, q = self.s[at : self.i], self.s[at : self.i + 1]
            if q.endswith("+"):
                what, why = f"a possessive quantifier {q!r}", "Postgres has no possessive quantifiers"
                fix = (
                    f"use the greedy {greedy!r}: it routes the same when what follows cannot start with a "
                    f"character it repeats (e.g. [a-z]++ at the end of the pattern)"
                )
            else:
                what = f"a lazy quantifier {q!r}"
                why = "in Postgres a lazy quantifier makes the whole pattern prefer the shortest match"
                fix = f"use the greedy {greedy!r} with a class that stops where the match should (e.g. [^.]* for .*?)"
            raise self.refuse(what, why, fix, at)
        return _Atom(atom.text, atom.ascii_only, None if (low, high) != (1, 1) else atom.literal, low, high)


def _ranges(ranges: tuple[tuple[str, str], ...]) -> str:
    return "".join(_char_are(lo) if lo == hi else f"{_char_are(lo)}-{_char_are(hi)}" for lo, hi in ranges)


def _check_zero_width(p: _Parser, items: list[_Item]) -> None:
    flat = [x for x in items if not isinstance(x, _Mark)]
    for k, x in enumerate(flat):
        if not isinstance(x, _Zero):
            continue
        if x.kind == "^" and any(not isinstance(y, _Zero) for y in flat[:k]):
            raise p.refuse("'^'", "it is accepted first only (the regex matches the whole value)", "remove it", x.at)
        if x.kind == "$" and any(not isinstance(y, _Zero) for y in flat[k + 1 :]):
            raise p.refuse("'$'", "it is accepted last only (the regex matches the whole value)", "remove it", x.at)
        if x.kind in ("\\b", "\\B") and not (
            _side_ascii(reversed(flat[:k]), last=True) and _side_ascii(flat[k + 1 :], last=False)
        ):
            raise p.refuse(
                x.kind,
                "a character next to it may be a non-ASCII letter or digit, which JDK 17 counts as a word "
                "character and JDK 19+ does not",
                "put ASCII-only atoms on both sides, e.g. \\b\\w+\\b or \\b[a-z]+\\b",
                x.at,
            )


def _side_ascii(side: Iterable[_Item], last: bool) -> bool:
    # The characters that can stand next to a boundary: up to and including the first atom that
    # cannot be empty (or the value's edge); all must be ASCII.
    for y in side:
        if isinstance(y, _Zero):
            continue
        if isinstance(y, _Alt):
            return all((w[-1] if last else w[0]).isascii() for w in y.branches)
        assert isinstance(y, _Atom)
        if not y.ascii_only:
            return False
        if y.low >= 1:
            return True
    return True


def _emit(items: list[_Item]) -> str:
    out: list[str] = []
    for x in items:
        if isinstance(x, _Mark):
            out.append(x.text)
        elif isinstance(x, _Alt):
            out.append("(?:" + "|".join("".join(map(_char_are, w)) for w in x.branches) + ")")
        elif isinstance(x, _Zero):
            if x.kind in "^$":
                out.append(x.kind)
            else:
                # Explicit ASCII word characters: \y would use the database locale's.
                at = f"(?<={_WORD})(?!{_WORD})|(?<!{_WORD})(?={_WORD})"
                not_at = f"(?<={_WORD})(?={_WORD})|(?<!{_WORD})(?!{_WORD})"
                out.append("(?:" + (at if x.kind == "\\b" else not_at) + ")")
        else:
            q = ""
            if (x.low, x.high) != (1, 1):
                q = {(0, 1): "?", (0, None): "*", (1, None): "+"}.get((x.low, x.high), "")
                if not q:
                    q = f"{{{x.low},{'' if x.high is None else x.high}}}" if x.high != x.low else f"{{{x.low}}}"
            out.append(x.text + q)
    return "".join(out)


def translate(regex: str, replacement: str, where: str) -> JavaRegex:
    """Java's regex + RegexRouter replacement -> a :class:`JavaRegex`, or a ConfigError naming the
    construct, the reason and a fix."""
    p = _Parser(regex, where)
    items = p.parse()
    _check_zero_width(p, items)
    return JavaRegex("^(?:" + _emit(items) + ")$", _replacement(replacement, regex, p.groups, p.count, where), p.groups)


def _replacement(replacement: str, regex: str, groups: dict[str, int], count: int, where: str) -> str:
    # Java's Matcher.appendReplacement: \x is x; ${name} and $n (n <= the group count) are groups,
    # $0 the whole match. Postgres: \1-\9, \& the whole match, \\ a backslash.
    out, i = "", 0
    bad = f"{where}: route.topic.replacement {shown(replacement)}"
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            if i + 1 >= len(replacement):
                raise ConfigError(
                    f"{bad}: a trailing '\\' escapes nothing (Java refuses it); write \\\\ for a backslash"
                )
            nxt = replacement[i + 1]
            out += "\\\\" if nxt == "\\" else nxt
            i += 2
            continue
        if c == "$":
            m = re.match(r"\$\{([A-Za-z][A-Za-z0-9]*)\}", replacement[i:])
            if m:
                if m.group(1) not in groups:
                    raise ConfigError(
                        f"{bad} names group {m.group(1)!r}, which route.topic.regex {shown(regex)} does not define"
                    )
                out += f"\\{groups[m.group(1)]}"
                i += m.end()
                continue
            m = re.match(r"\$(\d)", replacement[i:])
            if m and int(m.group(1)) <= count:
                out += "\\&" if m.group(1) == "0" else f"\\{m.group(1)}"
                i += m.end()
                continue
            raise ConfigError(f"{bad}: '$' must name a group (${{name}} or $1); write \\$ for a dollar sign")
        out += "\\\\" if c == "\\" else c
        i += 1
    return out
