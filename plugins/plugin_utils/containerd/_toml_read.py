# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One pass over a containerd config: its values and its table headers with their line ranges.

PRIVATE to the collection. Controller side. containerd configs and k3s templates are nearly always
plain TOML: `[table]` headers and `key = value` lines with short strings, booleans, integers and
one-line arrays of those. `read_plain` reads exactly that subset with one regular expression per
line, several times faster than tomllib (which goes character by character), and gives up (returns
None) on anything else or on anything that may be invalid; tomllib then decides and names the error.
So wherever it answers, the answer is the one tomllib gives (tests/unit holds it to that on the
corpus and on generated documents).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple


class Table:
    """An explicit `[header]` (or `[[header]]`) with the lines it spans: start is the header line,
    content_end is one past its last line with TOML, end is the next header's line (or the end)."""

    __slots__ = ("path", "array", "start", "content_end", "end")

    def __init__(self, path, array, start):
        self.path, self.array, self.start = path, array, start
        self.content_end = self.end = start + 1


# control characters other than tab are invalid anywhere in TOML (CR only as part of CRLF, left to tomllib)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\\]*"|'[^']*')"""
_KEY_PARTS = re.compile(_KEY_PART)
_COMMENT = r"(?:\#.*)?"
# a scalar: basic string without escapes, literal string, boolean, decimal integer (a float, a date,
# `truex` do not reach the end of the line, so the line falls back)
_SCALAR = r""""(?P<basic>[^"\\]*)"|'(?P<literal>[^']*)'|(?P<boolean>true|false)|(?P<integer>[+-]?(?:0|[1-9](?:_?[0-9])*))"""
# one expression per line: blank or comment, a [header], or key = scalar
_LINE = re.compile(r"""[ \t]*(?:%(comment)s
    |\[[ \t]*(?P<header>%(part)s(?:[ \t]*\.[ \t]*%(part)s)*)[ \t]*\][ \t]*%(comment)s
    |(?P<key>%(part)s)[ \t]*=[ \t]*(?:%(scalar)s)[ \t]*%(comment)s)""" % {
    "comment": _COMMENT, "part": _KEY_PART, "scalar": _SCALAR}, re.X)
_ARRAY_LINE = re.compile(r"[ \t]*(?P<key>%s)[ \t]*=[ \t]*(?=\[)" % _KEY_PART)
_ITEM = re.compile(r"[ \t]*(?:%s)[ \t]*(?P<sep>,|(?=\]))" % _SCALAR)
_ARRAY_END = re.compile(r"[ \t]*\][ \t]*%s" % _COMMENT)
_EMPTY_ARRAY_END = re.compile(r"\[[ \t]*\][ \t]*%s" % _COMMENT)
_HEADER_GROUP, _KEY_GROUP = _LINE.groupindex["header"], _LINE.groupindex["key"]
_BOOLEAN_GROUP, _INTEGER_GROUP = _LINE.groupindex["boolean"], _LINE.groupindex["integer"]


def _value(match):
    basic, literal, boolean, integer = match.group("basic", "literal", "boolean", "integer")
    if basic is not None:
        return basic
    if literal is not None:
        return literal
    if boolean is not None:
        return boolean == "true"
    return int(integer.replace("_", ""))


def _array_line(line):
    """(key, list) of `key = [scalar, ...]` on one line, or None."""
    match = _ARRAY_LINE.match(line)
    if not match:
        return None
    index = match.end()
    if _EMPTY_ARRAY_END.fullmatch(line, index):
        return match.group("key"), []
    index += 1  # the [
    values = []
    while True:
        item = _ITEM.match(line, index)
        if not item:
            return None
        values.append(_value(item))
        index = item.end()
        if _ARRAY_END.fullmatch(line, index):
            return match.group("key"), values
        if not item.group("sep"):
            return None


_BLANK, _HEADER_LINE, _KEY_VALUE = "blank", "header", "key"
_LINES = {}  # line text -> what it holds: the same lines come back within a document and between them


def _classify(line):
    """(kind, key path or key, value) of one line of the plain subset, or None."""
    match = _LINE.fullmatch(line)
    if match is None:
        found = _array_line(line)
        if found is None:
            return None
        key, value = found
        value = tuple(value)  # shared between documents: each one gets its own list
    else:
        kind = match.lastindex  # the last group that matched tells the kind of line
        if kind is None:
            return _BLANK, None, None
        if kind == _HEADER_GROUP:
            return _HEADER_LINE, tuple(p[1:-1] if p[0] in "\"'" else p for p in _KEY_PARTS.findall(match.group(kind))), None
        key, value = match.group(_KEY_GROUP, kind)
        if kind == _BOOLEAN_GROUP:
            value = value == "true"
        elif kind == _INTEGER_GROUP:
            value = int(value.replace("_", ""))
    return _KEY_VALUE, key[1:-1] if key[0] in "\"'" else key, value


def read_plain(lines: Sequence[str]) -> Optional[Tuple[Dict[str, Any], List[Table]]]:
    """(data, tables) for a document of the plain subset, else None (read it with tomllib)."""
    if _CONTROL.search("".join(lines)):
        return None
    if len(_LINES) > 8192:
        _LINES.clear()
    root = {}
    explicit = set()
    tables = []
    current, table = root, None
    for number, line in enumerate(lines):
        entry = _LINES.get(line)
        if entry is None:
            entry = _LINES[line] = _classify(line) or (None, None, None)
        kind, key, value = entry
        if kind is _BLANK:
            if table is not None:
                table.end = number + 1
        elif kind is _KEY_VALUE:
            if key in current:
                return None  # set twice, or a table of that name exists
            current[key] = list(value) if isinstance(value, tuple) else value
            if table is not None:
                table.end = table.content_end = number + 1
        elif kind is _HEADER_LINE:
            if key in explicit:
                return None  # declared twice: tomllib names it
            explicit.add(key)
            current = root
            for part in key:
                current = current.setdefault(part, {})
                if not isinstance(current, dict):
                    return None
            table = Table(key, False, number)
            tables.append(table)
        else:
            return None  # outside the plain subset
    return root, tables
