"""An Avro schema compiled once into a validator and a fused validate-and-write function for JSON rows.

The relay's direct Avro path (producer/encode/_avro_batch.py) used to run fastavro's ``validate`` (~1.5 µs a
row of the bench's record) and then fastavro's ``schemaless_writer`` (~1.7 µs), each walking the
parsed schema again for every row. :func:`compile_schema` walks it once and generates Python code
(one function per named type, union, array and map; primitives inlined) that checks a decoded JSON
value and writes its Avro binary encoding in the same pass.

The compiled writer only ever *accepts* or *gives up*: it never refuses a row itself. It accepts
the exact JSON types (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``; plus
``bytes``, and what fastavro's logical-type writers turn a value into) and raises :class:`GiveUp`
(or whatever the failing operation raised) on anything else: a value that does not fit, a missing
field without a default, a ``-type`` key, tuple notation, a union whose branch fastavro would pick
by counting record fields, a string with a lone surrogate (no UTF-8), an integer too large for a double.
The caller then runs fastavro's ``validate`` and ``schemaless_writer`` as before, so a refused row
gets exactly fastavro's error and reason, and an exotic valid row fastavro's bytes.

Invariants (tests/test_producer/encode/test_avro_compiled.py: generated schemas and values, valid and
invalid, against the installed fastavro):
- whenever :attr:`CompiledSchema.write` returns, fastavro's ``validate`` accepts the value and
  ``schemaless_writer`` writes exactly the returned bytes (so the coercions the writer alone would
  make, 1.5 into a ``long`` as 1 or "1" into a ``double``, never happen: such values give up);
- :meth:`CompiledSchema.valid` answers as ``fastavro.validation.validate(value, schema,
  raise_errors=False)`` does (it gives up on tuple notation and on types it does not know);
- valid JSON values (each field present or defaulted) of records, enums, arrays, maps, unions
  (nullable or not, at most one branch taking a dict), fixed, named references, recursive types and
  logical types are written by the compiled code, not given up on.
"""

from __future__ import annotations

import array
import numbers
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harvest_outbox.producer.errors import HarvestError

__all__ = ["CompiledSchema", "GiveUp", "compile_schema"]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
#: Zig-zag values below this are written from a table (one or two bytes); larger ones 14 bits at a time.
_TABLE = 1 << 14


class GiveUp(HarvestError):
    """The compiled code does not take this value: let fastavro validate (and refuse, or write) it."""


def _varint_bytes(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_V: tuple[bytes, ...] = tuple(_varint_bytes(z) for z in range(_TABLE))
#: the first two 7-bit groups of a varint that goes on: z & 0x3fff, each byte with its continuation bit
_C14: tuple[bytes, ...] = tuple(bytes(((k & 0x7F) | 0x80, ((k >> 7) & 0x7F) | 0x80)) for k in range(_TABLE))


def _varint(z: int) -> bytes:
    """A non-negative (zig-zag encoded) integer as an Avro varint."""
    return _V[z] if z < _TABLE else _C14[z & (_TABLE - 1)] + _varint(z >> 14)


class _Ctx:
    """One schema's generated source, the constants it refers to, and its named types' functions."""

    def __init__(self, named: dict[str, Any], logical: Mapping[str, Callable[..., Any]]) -> None:
        self.named = named
        self.logical = logical
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {
            "GiveUp": GiveUp,
            "_V": _V,
            "_varint": _varint,
            "_TABLE": _TABLE,
            "_pf": struct.Struct("<f").pack,
            "_pd": struct.Struct("<d").pack,
        }
        self.named_fn: dict[str, str] = {}
        self.preds: dict[str, Callable[[Any], bool]] = {}
        self._n = 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, value: Any, prefix: str = "_k") -> str:
        name = self.fresh(prefix)
        self.consts[name] = value
        return name

    # -- schema shapes ---------------------------------------------------------------------------

    def kind(self, schema: Any) -> str:
        """The schema's type name ("union" for a list; a named type's name for a reference)."""
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            t = schema.get("type")
            return t if isinstance(t, str) else "?"
        return schema if isinstance(schema, str) else "?"

    def deref(self, schema: Any) -> Any:
        while isinstance(schema, str) and schema in self.named:
            schema = self.named[schema]
        return schema

    def prepare(self, schema: Any) -> Callable[..., Any] | None:
        """fastavro's logical-type writer for ``schema`` (what validate and the writer both apply)."""
        if isinstance(schema, dict) and isinstance(schema.get("logicalType"), str):
            return self.logical.get(f"{self.kind(schema)}-{schema['logicalType']}")
        return None

    # -- the fused writer: statements that check ``var`` and bytes expressions that encode it --------

    def emit(self, schema: Any, var: str, ind: str) -> tuple[list[str], list[str]]:
        """(statements, expressions): the statements raise unless ``var`` is a value this code writes;
        the expressions, joined, are its encoding."""
        kind = self.kind(schema)
        prep = self.prepare(schema)
        if prep is not None:
            if kind not in _INLINE:  # a logical type on a record, array or map: fastavro's
                return [f"{ind}raise GiveUp"], []
            prepared = self.fresh("p")
            fn, sch = self.const(prep, "_prep"), self.const(schema, "_sch")
            stmts, exprs = self.emit(_without_logical(schema), prepared, ind)
            return [f"{ind}{prepared} = {fn}({var}, {sch})", *stmts], exprs
        if kind == "null":
            return [f"{ind}if {var} is not None: raise GiveUp"], []
        if kind == "boolean":
            out = self.fresh("b")
            return [
                f"{ind}if {var} is True: {out} = b'\\x01'",
                f"{ind}elif {var} is False: {out} = b'\\x00'",
                f"{ind}else: raise GiveUp",
            ], [out]
        if kind in ("int", "long"):
            lo, hi = (INT_MIN, INT_MAX) if kind == "int" else (LONG_MIN, LONG_MAX)
            z = self.fresh("z")
            return [
                f"{ind}if type({var}) is not int or not {lo} <= {var} <= {hi}: raise GiveUp",
                f"{ind}{z} = ({var} << 1) ^ ({var} >> 63)",
            ], [f"(_V[{z}] if {z} < _TABLE else _varint({z}))"]
        if kind in ("float", "double"):
            # ints too (fastavro accepts them); one beyond a double's range raises in pack: fastavro decides
            pack = "_pf" if kind == "float" else "_pd"
            return [f"{ind}if type({var}) is not float and type({var}) is not int: raise GiveUp"], [f"{pack}({var})"]
        if kind in ("string", "bytes"):
            raw, n = self.fresh("s"), self.fresh("n")
            if kind == "string":
                head = [f"{ind}if type({var}) is not str: raise GiveUp", f"{ind}{raw} = {var}.encode()"]
            else:
                head = [
                    f"{ind}if type({var}) is not bytes and type({var}) is not bytearray: raise GiveUp",
                    f"{ind}{raw} = {var}",
                ]
            return [*head, f"{ind}{n} = len({raw}) << 1"], [f"(_V[{n}] if {n} < _TABLE else _varint({n}))", raw]
        if kind == "fixed":
            size = int(schema["size"])
            return [
                f"{ind}if (type({var}) is not bytes and type({var}) is not bytearray) or len({var}) != {size}: "
                "raise GiveUp"
            ], [var]
        if kind == "enum":
            symbols: dict[Any, bytes] = {}
            for i, symbol in enumerate(schema["symbols"]):
                symbols.setdefault(symbol, _varint(i << 1))  # the first, as the writer's list.index
            table = self.const(symbols, "_enum")
            out = self.fresh("e")
            # a symbol is a str; anything else misses the table (KeyError, or TypeError if unhashable)
            return [f"{ind}if type({var}) is not str: raise GiveUp", f"{ind}{out} = {table}[{var}]"], [out]
        fn = self.function(schema)
        return [], [f"{fn}({var})"]

    def function(self, schema: Any) -> str:
        """The name of a generated function ``(value) -> bytes`` for a record, array, map, union or
        named reference (one per named type, so references and recursion call it)."""
        if isinstance(schema, str) and schema in self.named:
            target, key = self.named[schema], schema
        elif isinstance(schema, dict) and isinstance(schema.get("name"), str) and schema["name"] in self.named:
            target, key = schema, schema["name"]
        else:
            target, key = schema, None
        if key is not None:
            if key in self.named_fn:
                return self.named_fn[key]
            name = self.named_fn[key] = self.fresh("f")
        else:
            name = self.fresh("f")
        kind = self.kind(target)
        if self.prepare(target) is not None and kind not in _INLINE:
            self.define(name, ["    raise GiveUp"])  # a logical type on a container: leave it to fastavro
        elif kind == "record":
            self.record(name, target)
        elif kind == "array":
            self.array(name, target)
        elif kind == "map":
            self.map(name, target)
        elif kind == "union":
            self.union(name, target)
        elif kind in _INLINE:
            stmts, exprs = self.emit(target, "v", "    ")
            self.define(name, [*stmts, f"    return {_join(exprs)}"])
        else:  # error, request, error_union, an unknown name, anything newer: fastavro decides
            self.define(name, ["    raise GiveUp"])
        return name

    def define(self, name: str, body: list[str]) -> None:
        self.lines += [f"def {name}(v):", *body, ""]

    def record(self, name: str, schema: dict[str, Any]) -> None:
        # Not a dict, or with a "-type" key (fastavro's validate compares it to the record's name):
        # fastavro decides. A missing field takes its default, as in validate and the writer; one
        # without a default gives up (KeyError): fastavro then validates it as None.
        body = ['    if type(v) is not dict or "-type" in v: raise GiveUp']
        exprs: list[str] = []
        for field in schema["fields"]:
            var = self.fresh("x")
            if "default" in field:
                body.append(f"    {var} = v.get({field['name']!r}, {self.const(field['default'], '_d')})")
            else:
                body.append(f"    {var} = v[{field['name']!r}]")
            stmts, parts = self.emit(field["type"], var, "    ")
            body += stmts
            exprs += parts
        self.define(name, [*body, f"    return {_join(exprs)}"])

    def array(self, name: str, schema: dict[str, Any]) -> None:
        stmts, exprs = self.emit(schema["items"], "x", "        ")
        self.define(
            name,
            [
                "    if type(v) is not list: raise GiveUp",
                "    n = len(v) << 1",
                "    if not n: return b'\\x00'",
                "    out = [_V[n] if n < _TABLE else _varint(n)]",
                "    ap = out.append",
                "    for x in v:",
                *stmts,
                *(f"        ap({e})" for e in exprs),
                "    ap(b'\\x00')",
                "    return b''.join(out)",
            ],
        )

    def map(self, name: str, schema: dict[str, Any]) -> None:
        key_stmts, key_exprs = self.emit("string", "k", "        ")
        stmts, exprs = self.emit(schema["values"], "x", "        ")
        self.define(
            name,
            [
                "    if type(v) is not dict: raise GiveUp",
                "    n = len(v) << 1",
                "    if not n: return b'\\x00'",
                "    out = [_V[n] if n < _TABLE else _varint(n)]",
                "    ap = out.append",
                "    for k, x in v.items():",
                *key_stmts,
                *stmts,
                *(f"        ap({e})" for e in [*key_exprs, *exprs]),
                "    ap(b'\\x00')",
                "    return b''.join(out)",
            ],
        )

    def union(self, name: str, branches: list[Any]) -> None:
        kinds = [self.kind(self.deref(b)) for b in branches]
        if len(branches) == 2 and "null" in kinds and not self.may_take_none(branches[1 - kinds.index("null")]):
            # The nullable union: fastavro's writer picks null for None and the other branch for
            # anything that branch accepts (the only one that can); so the other branch's code decides.
            null_at = kinds.index("null")
            other = 1 - null_at
            stmts, exprs = self.emit(branches[other], "v", "    ")
            self.define(
                name,
                [
                    f"    if v is None: return {_V[null_at << 1]!r}",
                    *stmts,
                    f"    return {_join([repr(_V[other << 1]), *exprs])}",
                ],
            )
            return
        chooser = self.const(self.branch_chooser(branches), "_choose")
        body = [f"    i = {chooser}(v)"]
        for i, branch in enumerate(branches):
            stmts, exprs = self.emit(branch, "v", "        ")
            body += [f"    if i == {i}:", *stmts, f"        return {_join([repr(_V[i << 1]), *exprs])}"]
        self.define(name, [*body, "    raise GiveUp"])

    def may_take_none(self, schema: Any) -> bool:
        schema = self.deref(schema)
        return self.kind(schema) in ("null", "union", "?") or self.prepare(schema) is not None

    def branch_chooser(self, branches: list[Any]) -> Callable[[Any], int]:
        """fastavro's writer's choice of a union branch: the first branch that validates, except that
        a valid ``float`` branch yields to a later ``double``. When a record branch validates and so
        does another branch, fastavro counts record fields (and its versions differ on named
        references): give up, fastavro decides."""
        preds = [self.predicate(b) for b in branches]
        kinds = [self.kind(self.deref(b)) for b in branches]

        def choose(value: Any) -> int:
            if isinstance(value, tuple):
                raise GiveUp  # tuple notation names the branch: fastavro's
            record_at = -1
            for i, pred in enumerate(preds):
                if not pred(value):
                    continue
                kind = kinds[i]
                if kind == "record":
                    if record_at >= 0:
                        raise GiveUp
                    record_at = i
                    continue
                if record_at >= 0:
                    raise GiveUp
                if kind == "float":
                    for j in range(i + 1, len(kinds)):
                        if kinds[j] == "double":
                            return j
                return i
            if record_at < 0:
                raise GiveUp  # no branch fits: fastavro refuses it, with its message
            return record_at

        return choose

    # -- the validator: fastavro.validate's acceptance rules, compiled into closures ----------------

    def predicate(self, schema: Any) -> Callable[[Any], bool]:
        """``(value) -> bool``: whether fastavro's validate accepts ``value`` for ``schema``."""
        if isinstance(schema, str) and schema in self.named:
            if schema not in self.preds:
                self.preds[schema] = _give_up  # recursion: replaced below before any call
                self.preds[schema] = self.predicate(self.named[schema])
            by_name = self.preds
            return lambda value: by_name[schema](value)
        prep = self.prepare(schema)
        if prep is not None:
            inner = self.predicate(_without_logical(schema))
            return lambda value: inner(prep(value, schema))
        kind = self.kind(schema)
        if kind in _SIMPLE:
            return _SIMPLE[kind]
        if kind == "fixed":
            size = schema["size"]
            return lambda value: isinstance(value, (bytes, bytearray)) and len(value) == size
        if kind == "enum":
            symbols = schema["symbols"]
            return lambda value: value in symbols
        if kind == "array":
            item = self.predicate(schema["items"])
            return lambda value: (
                isinstance(value, (Sequence, array.array))
                and not isinstance(value, str)
                and all(item(x) for x in value)
            )
        if kind == "map":
            val = self.predicate(schema["values"])
            return lambda value: (
                isinstance(value, Mapping)
                and all(isinstance(k, str) for k in value)
                and all(val(x) for x in value.values())
            )
        if kind in ("union", "error_union"):
            preds = [self.predicate(b) for b in schema]

            def union(value: Any) -> bool:
                if isinstance(value, tuple):
                    raise GiveUp
                return any(pred(value) for pred in preds)

            return union
        if kind in ("record", "error", "request"):
            fullname = schema["name"]
            fields = [(f["name"], f.get("default"), self.predicate(f["type"])) for f in schema["fields"]]

            def record(value: Any) -> bool:
                if not isinstance(value, Mapping) or ("-type" in value and value["-type"] != fullname):
                    return False
                # a missing field takes its default, or None (fastavro's non-strict validate)
                return all(pred(value.get(name, default)) for name, default, pred in fields)

            return record
        return _give_up


#: the types whose checks and encodings are inlined where they are used
_INLINE = frozenset(("null", "boolean", "int", "long", "float", "double", "string", "bytes", "fixed", "enum"))


def _without_logical(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "logicalType"}


def _give_up(value: Any) -> Any:
    raise GiveUp


def _join(exprs: list[str]) -> str:
    if not exprs:
        return "b''"
    if len(exprs) == 1:
        return exprs[0]
    return f"b''.join(({', '.join(exprs)},))"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, numbers.Integral)) and not isinstance(value, bool)


_SIMPLE: dict[str, Callable[[Any], bool]] = {
    "null": lambda value: value is None,
    "boolean": lambda value: isinstance(value, bool),
    "string": lambda value: isinstance(value, str),
    "bytes": lambda value: isinstance(value, (bytes, bytearray)),
    "int": lambda value: _is_int(value) and INT_MIN <= value <= INT_MAX,
    "long": lambda value: _is_int(value) and LONG_MIN <= value <= LONG_MAX,
    "float": lambda value: isinstance(value, (int, float, numbers.Real)) and not isinstance(value, bool),
    "double": lambda value: isinstance(value, (int, float, numbers.Real)) and not isinstance(value, bool),
}


class CompiledSchema:
    """One parsed Avro schema compiled: :attr:`write` ``(value) -> bytes`` (Avro binary, no header;
    raises when it gives up) and :meth:`valid`."""

    __slots__ = ("_valid", "source", "write")

    def __init__(self, write: Callable[[Any], bytes], valid: Callable[[Any], bool], source: str) -> None:
        self.write = write
        self._valid = valid
        self.source = source  # the generated code, for a reader who wonders what runs

    def valid(self, value: Any) -> bool:
        """fastavro.validate's answer (raise_errors=False); raises :class:`GiveUp` for tuple notation."""
        return self._valid(value)


def compile_schema(parsed: Any, named: dict[str, Any]) -> CompiledSchema:
    """``parsed`` (fastavro's ``parse_schema(schema, named)``) and its named types, compiled."""
    from fastavro.write import LOGICAL_WRITERS  # the registry extra; validate and the writer share it

    ctx = _Ctx(named, LOGICAL_WRITERS)
    top = ctx.function(parsed)
    source = "\n".join(ctx.lines)
    exec(compile(source, "<avro_compiled>", "exec"), ctx.consts)  # code generated from the schema, names quoted by repr
    return CompiledSchema(ctx.consts[top], ctx.predicate(parsed), source)
