"""Bounded reading of every file the project reads: stacks, inputs, saved specs, rate traces, --trace, SHA256SUMS.

One reader so every file fails the same way: a one-line `InputError` naming the file (and the line, column
or byte where it can), never a traceback, a hang or gigabytes of memory. The bounds:

- size: a file larger than its limit is refused before it is read;
- encoding: UTF-8 only; the error names the first bad byte and its offset;
- nesting: JSON, JSONL and YAML deeper than `MAX_DEPTH` levels are refused (no RecursionError);
- numbers: an integer literal longer than `MAX_INT_DIGITS` digits is refused (Python would spend
  quadratic time on it, or refuse it with a traceback beyond 4,300 digits);
- YAML aliases: at most `MAX_YAML_ALIASES`, and the document as expanded (every alias counted as a copy
  of what it names) at most `MAX_YAML_NODES` nodes — a "billion laughs" alias bomb is refused from its
  small composed graph, before anything walks the expansion.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError

MAX_DOCUMENT_BYTES = 8 * 1024 * 1024  # a stack file is ~12 KB, a saved spec ~200 KB
MAX_TRACE_BYTES = 256 * 1024 * 1024  # the bundled traces are ≤ 1.2 MB; a month of Azure rows is ~150 MB
MAX_LINE_CHARS = 65_536  # the csv module refuses fields beyond 131,072 characters with its own error
MAX_DEPTH = 64
MAX_INT_DIGITS = 30
MAX_YAML_ALIASES = 1_000
MAX_YAML_NODES = 200_000


def read_text(path: str | Path, what: str = "", *, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The file's text, or an InputError naming it: missing, a directory, too large, empty or not UTF-8."""
    p = Path(path)
    name = f"{what} {str(p)!r}" if what else str(p)
    if str(p) in ("", "."):
        raise InputError(f"{name}: no file named (an empty path)")
    try:
        if p.is_dir():
            raise InputError(f"{name}: cannot read (a directory, not a file)")
        if not p.exists():
            raise InputError(f"{name}: cannot read (no such file)")
        if not p.is_file():  # a FIFO would block the read forever, /dev/zero never end it
            raise InputError(f"{name}: cannot read (not a regular file)")
        size = p.stat().st_size
        if size > max_bytes:
            raise InputError(f"{name}: {size:,} bytes is larger than the {max_bytes:,}-byte limit for this file")
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)  # a file growing while read: bound the read itself
    except OSError as e:
        raise InputError(f"{name}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise InputError(f"{name}: larger than the {max_bytes:,}-byte limit for this file")
    if not data.strip():
        raise InputError(f"{name}: the file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    return text.removeprefix("\ufeff")


def open_text_lines(path: str | Path, what: str = "", *, max_bytes: int = MAX_TRACE_BYTES) -> io.StringIO:
    """A line-oriented text file (CSV, JSONL) as a file object: bounded, UTF-8, no NUL, no giant line."""
    p = Path(path)
    name = f"{what} {str(p)!r}" if what else str(p)
    text = read_text(p, what, max_bytes=max_bytes)
    nul = text.find("\0")
    if nul >= 0:
        raise InputError(f"{name}: line {text.count(chr(10), 0, nul) + 1} holds a NUL character; not a text file")
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE_CHARS:
            raise InputError(f"{name}: line {n} is {len(line):,} characters long; at most {MAX_LINE_CHARS:,} allowed")
    return io.StringIO(text, newline="")


# ── JSON ─────────────────────────────────────────────────────────────────────────────────────────

_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_depth_ok(text: str, name: str, line: int | None = None) -> None:
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                where = f"line {line}" if line is not None else f"line {text.count(chr(10), 0, m.start()) + 1}"
                raise InputError(f"{name}: {where} nests deeper than {MAX_DEPTH} levels")
        elif c in "]}":
            depth -= 1


def _line_excerpt(text: str, index: int) -> str:
    """`line N (its start…)`: where a problem sits, with the key in view."""
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    line = text[start:end if end >= 0 else len(text)].strip()
    return f"line {text.count(chr(10), 0, index) + 1} ({line[:50]}{'…' if len(line) > 50 else ''})"


class _BigInt(ValueError):
    pass


def _bounded_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise _BigInt(len(s.lstrip("-")))
    return int(s)


def loads_json(text: str, name: str, line: int | None = None) -> Any:
    """JSON with bounded depth and integer size; NaN/Infinity parse (the validators say which field is not a number)."""
    _json_depth_ok(text, name, line)
    try:
        return json.loads(text, parse_int=_bounded_int)
    except _BigInt as e:
        m = re.search(r"\d{%d,}" % (MAX_INT_DIGITS + 1), text)
        where = f"line {line}" if line is not None or m is None else _line_excerpt(text, m.start())
        raise InputError(f"{name}: {where}: an integer of {e.args[0]:,} digits; at most {MAX_INT_DIGITS} allowed") from None
    except json.JSONDecodeError as e:
        where = f"line {line}" if line is not None else f"line {e.lineno}, column {e.colno}"
        raise InputError(f"{name}: not valid JSON at {where}: {e.msg}") from None
    except (ValueError, RecursionError) as e:  # pragma: no cover - bounded above; a last guard
        raise InputError(f"{name}: not valid JSON: {e}") from None


# ── YAML ─────────────────────────────────────────────────────────────────────────────────────────


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting, many aliases and huge integers while composing."""

    def __init__(self, stream: str, name: str) -> None:
        super().__init__(stream)
        self.name = name
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise InputError(
                    f"{self.name}: line {mark.line + 1}: more than {MAX_YAML_ALIASES:,} YAML aliases; refused"
                )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise InputError(
                    f"{self.name}: line {mark.line + 1}, column {mark.column + 1} nests deeper than {MAX_DEPTH} levels"
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):  # type: ignore[override]
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            where = _line_excerpt(node.start_mark.buffer, node.start_mark.index) if node.start_mark.buffer else (
                f"line {node.start_mark.line + 1}")
            raise InputError(f"{self.name}: {where}: an integer of {len(digits):,} digits; at most {MAX_INT_DIGITS} allowed")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _expanded_nodes(root: yaml.Node, name: str) -> int:
    """Nodes in the document with every alias expanded, from the shared composed graph (memoised); and, on the same
    walk, each mapping once for a key given twice (_refuse_duplicate_keys)."""
    sizes: dict[int, int] = {}
    # iterative post-order: the graph is at most MAX_DEPTH deep, but no recursion at all is simpler to trust.
    # `open_` holds the nodes expanded and not yet summed: between a node's expansion and its sum the stack
    # yields exactly its descendants, so meeting an open node again means it contains itself — an alias inside
    # its own anchor (`&a [*a]`), which PyYAML composes into a cycle: infinitely many values, and without this
    # check a loop that grows the stack until the machine runs out of memory
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if not done and id(node) in open_:
            mark = node.start_mark
            raise InputError(
                f"{name}: line {mark.line + 1}, column {mark.column + 1}: a YAML alias refers to a node that "
                "contains it (a recursive alias: infinitely many values); refused"
            )
        if isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
            if not done:
                _refuse_duplicate_keys(node, name)
        elif isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        else:
            kids = []
        if done:
            open_.discard(id(node))
            total = 1 + sum(sizes.get(id(k), 0) for k in kids)
            sizes[id(node)] = total
            if total > MAX_YAML_NODES:
                raise InputError(
                    f"{name}: expands to more than {MAX_YAML_NODES:,} values through YAML aliases "
                    "(an alias bomb?); refused"
                )
        else:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def _refuse_duplicate_keys(node: yaml.MappingNode, name: str) -> None:
    """A key given twice in one mapping of the composed graph (before construction: PyYAML keeps the last silently —
    a second `environment:` overrode the first with no word — and its merge step rewrites anchored mappings in place,
    so a check while constructing took a merged key and its override for a pair). Keys compare by tag and text, as
    written (1 and "1" differ); merge keys (<<) are not keys and may be overridden."""
    first: dict[tuple[str, str], yaml.Node] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        was = first.setdefault((key.tag, key.value), key)
        if was is not key:
            raise InputError(f"{name}: line {key.start_mark.line + 1}: key {key.value!r} given twice in one "
                             f"mapping (first on line {was.start_mark.line + 1}); YAML would silently keep the last")


def loads_yaml(text: str, name: str) -> Any:
    loader = None
    try:
        loader = _BoundedLoader(text, name)  # the reader checks characters here already (NUL, controls)
        node = loader.get_single_node()
        if node is None:
            raise InputError(f"{name}: the file is empty")
        _expanded_nodes(node, name)
        return loader.construct_document(node)
    except InputError:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise InputError(f"{name}: not valid YAML (syntax error at {where}): {what}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{name}: not valid YAML: {' '.join(str(e).split())}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # e.g. a date 2026-13-45
        raise InputError(f"{name}: not valid YAML: a value cannot be read ({e})") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_document(path: str | Path, what: str = "", *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """A YAML or JSON document (JSON by the .json suffix; YAML otherwise, which also reads JSON)."""
    p = Path(path)
    name = f"{what} {str(p)!r}" if what else str(p)
    text = read_text(p, what, max_bytes=max_bytes)
    if p.suffix == ".json":
        return loads_json(text, name)
    return loads_yaml(text, name)


def find_non_finite(value: Any, path: str = "") -> str | None:
    """The path of the first NaN or infinite number in a parsed document, or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return where or "(top level)"
        if isinstance(v, dict):
            stack.extend((x, f"{where}.{k}" if where else str(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}.{i}" if where else str(i)) for i, x in enumerate(v))
    return None
