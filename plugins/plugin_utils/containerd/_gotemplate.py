# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A model of Go's text/template, as k3s and rke2 use it to render the containerd template.

PRIVATE to the collection. Controller side, stdlib only.

parse() builds the tree Go's parser builds (lexer with trim markers, comments, strings and raw
strings; if/else if/else, range, with, define, block, template, break/continue, pipelines,
variables) and fails where Go's parser fails (unclosed action, unbalanced end, unknown function,
undefined variable). execute() evaluates the tree over data that is only partly known: a value can
be Unknown (of a type, with an optional typical value). Where a condition depends on an unknown
value the branch is a *decision*; explore() runs the template once per set of decisions (typical
choices first, then each decision flipped), so both sides of every undecidable branch are checked.
Each output character keeps its origin (template line, or a named sub-template such as base) so
that checks on the composed TOML can name the user's line.

Go's own text/template is the oracle for this model in the tests (tests/oracle).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import unquoted_find

# --- errors -------------------------------------------------------------------------------------


class TemplateError(K3sGpuError):
    """Where Go's parser or executor fails (the collection's one error type: the message is its cause). code:
    parse_error, unknown_function, unknown_template, missing_field, exec_error; line: 1-based line of the template
    text; message: Go's own words, as the template check quotes them."""

    def __init__(self, code, line, message, name="main"):
        super().__init__(message)
        self.code, self.line, self.message, self.name = code, line, message, name


# --- lexer --------------------------------------------------------------------------------------

_SPACE = " \t\r\n"
_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][+-]?\d+)?)(?:i)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD_CHAIN = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_VARIABLE = re.compile(r"\$[A-Za-z0-9_]*")
KEYWORDS = ("if", "else", "end", "range", "with", "define", "template", "block", "break", "continue")


class Token:
    __slots__ = ("kind", "value", "line")

    def __init__(self, kind, value, line):
        self.kind, self.value, self.line = kind, value, line

    def __repr__(self):
        return "Token(%s, %r, %d)" % (self.kind, self.value, self.line)


class Action:
    """One {{ }}: its tokens, the line it starts on, whether it is a comment, its trim markers."""
    __slots__ = ("tokens", "line", "comment", "trim_left", "trim_right", "start", "end", "text")

    def __init__(self, line, start):
        self.tokens, self.line, self.start = [], line, start
        self.comment = self.trim_left = self.trim_right = False
        self.end = start
        self.text = ""


def _right_trim_at(text, index):
    """Length of ' -}}' (whitespace, '-', '}}') at index, else 0."""
    j = index
    while j < len(text) and text[j] in _SPACE:
        j += 1
    if j > index and text.startswith("-}}", j):
        return j + 3 - index
    return 0


def lex(text: str) -> List[Tuple[Any, ...]]:
    """The template as a list of ("text", str, line) and ("action", Action) items. Raises TemplateError."""
    items = []
    pos = 0
    line = 1
    size = len(text)
    while pos < size:
        open_at = text.find("{{", pos)
        if open_at < 0:
            items.append(("text", text[pos:], line))
            break
        if open_at > pos:
            items.append(("text", text[pos:open_at], line))
            line += text.count("\n", pos, open_at)
        action = Action(line, open_at)
        i = open_at + 2
        if text.startswith("-", i) and i + 1 < size and text[i + 1] in _SPACE:
            action.trim_left = True
            i += 2
        # a comment starts right after the delimiter (and the trim marker)
        probe = i
        if action.trim_left:
            while probe < size and text[probe] in _SPACE:
                probe += 1
        if text.startswith("/*", probe):
            pos, line = _lex_comment(text, action, probe, line)
        else:
            pos, line = _lex_action(text, action, i, line)
        action.end = pos
        action.text = text[open_at:pos]
        items.append(("action", action))
    return items


def _lex_comment(text, action, probe, line):
    """A comment action from its /* at probe: (the index after its }}, the line there)."""
    close = text.find("*/", probe + 2)
    if close < 0:
        raise TemplateError("parse_error", line, "unclosed comment")
    after = close + 2
    trim = _right_trim_at(text, after)
    if trim:
        action.trim_right = True
        after += trim
    elif text.startswith("}}", after):
        after += 2
    else:
        raise TemplateError("parse_error", line, "comment ends before closing delimiter")
    action.comment = True
    return after, line + text.count("\n", action.start, after)


def _lex_action(text, action, i, line):
    """The tokens of an action from i, after its {{: (the index after its }}, the line there)."""
    size = len(text)
    while True:
        while i < size and text[i] in _SPACE:
            trim = _right_trim_at(text, i)
            if trim:
                break
            if text[i] == "\n":
                line += 1
            i += 1
        if i >= size:
            raise TemplateError("parse_error", action.line, "unclosed action")
        trim = _right_trim_at(text, i)
        if trim:
            line += text.count("\n", i, i + trim)
            action.trim_right = True
            return i + trim, line
        if text.startswith("}}", i):
            return i + 2, line
        i, line = _lex_token(text, action, i, line)


def _lex_quoted(text, action, i, line):
    """A "string", `raw string` or 'c' character constant at i: the index after it, the line there."""
    size = len(text)
    char = text[i]
    if char == '"':
        j = i + 1
        while j < size and text[j] != '"':
            if text[j] == "\n":
                raise TemplateError("parse_error", line, "unterminated quoted string")
            j += 2 if text[j] == "\\" else 1
        if j >= size:
            raise TemplateError("parse_error", line, "unterminated quoted string")
        action.tokens.append(Token("string", _decode_go_string(text[i:j + 1], line), line))
    elif char == "`":
        j = text.find("`", i + 1)
        if j < 0:
            raise TemplateError("parse_error", line, "unterminated raw quoted string")
        action.tokens.append(Token("string", text[i + 1:j], line))
        line += text.count("\n", i, j)
    else:
        j = i + 1
        while j < size and text[j] != "'":
            j += 2 if text[j] == "\\" else 1
        if j >= size:
            raise TemplateError("parse_error", line, "unterminated character constant")
        value = _decode_go_string('"' + text[i + 1:j].replace('"', '\\"') + '"', line)
        action.tokens.append(Token("number", ord(value[0]) if value else 0, line))
    return j + 1, line


def _lex_token(text, action, i, line):
    """The lexer's step: the one token at i, appended to the action; (the index after it, the line there)."""
    size = len(text)
    char = text[i]
    if char in "\"`'":
        return _lex_quoted(text, action, i, line)
    if text.startswith(":=", i):
        action.tokens.append(Token("declare", ":=", line))
        return i + 2, line
    if char in "()|,=":
        action.tokens.append(Token(char, char, line))
        return i + 1, line
    if char == "$":
        match = _VARIABLE.match(text, i)
        action.tokens.append(Token("variable", match.group(0), line))
        return match.end(), line
    if char == ".":
        match = _FIELD_CHAIN.match(text, i)
        if match:
            # `$x.A` and `(pipe).A` chain onto the term before them only when adjacent
            attached = (i > 0 and text[i - 1] not in _SPACE and action.tokens
                        and action.tokens[-1].kind in ("variable", ")"))
            action.tokens.append(Token("chain" if attached else "field", tuple(match.group(0)[1:].split(".")), line))
            return match.end(), line
        if not (i + 1 < size and text[i + 1].isdigit()):
            action.tokens.append(Token("dot", ".", line))
            return i + 1, line
    if char.isdigit() or char == "." or (char in "+-" and i + 1 < size and (text[i + 1].isdigit() or text[i + 1] == ".")):
        match = _NUMBER.match(text, i)
        action.tokens.append(Token("number", _number(match.group(0), line), line))
        return match.end(), line
    if char.isalpha() or char == "_":
        match = _IDENT.match(text, i)
        word = match.group(0)
        if word in ("true", "false"):
            action.tokens.append(Token("bool", word == "true", line))
        elif word == "nil":
            action.tokens.append(Token("nil", None, line))
        elif word in KEYWORDS:
            action.tokens.append(Token("keyword", word, line))
        else:
            action.tokens.append(Token("identifier", word, line))
        return match.end(), line
    raise TemplateError("parse_error", line, "unexpected %r in command" % char)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _decode_go_string(quoted, line):
    """The value of a Go string literal (quoted with its quotes; Go escapes decoded), as text/template reads it."""
    out = []
    i = 1
    body_end = len(quoted) - 1
    while i < body_end:
        char = quoted[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        nxt = quoted[i + 1] if i + 1 < body_end else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = quoted[i + 2:i + 2 + width]
            try:
                out.append(chr(int(digits, 16)))
            except ValueError:
                raise TemplateError("parse_error", line, "invalid syntax in quoted string %s" % quoted)
            i += 2 + width
        elif nxt.isdigit():
            out.append(chr(int(quoted[i + 1:i + 4], 8)))
            i += 4
        else:
            raise TemplateError("parse_error", line, "invalid syntax in quoted string %s" % quoted)
    return "".join(out)


def _number(text, line):
    clean = text.replace("_", "")
    try:
        if clean.endswith("i"):
            raise ValueError
        if re.match(r"^[+-]?0[xXbBoO]", clean):
            return int(clean, 0)
        if re.match(r"^[+-]?\d+$", clean):
            return int(clean, 10)
        return float(clean)
    except ValueError:
        raise TemplateError("parse_error", line, "bad number syntax: %r" % text)


# --- parser -------------------------------------------------------------------------------------
# Nodes are small tuples-with-names; a list of nodes is a "list".

class Node:
    __slots__ = ("kind", "line", "a", "b", "c", "d", "nid")

    def __init__(self, kind, line, a=None, b=None, c=None, d=None, nid=0):
        self.kind, self.line, self.a, self.b, self.c, self.d, self.nid = kind, line, a, b, c, d, nid

    def __repr__(self):
        return "Node(%s@%d)" % (self.kind, self.line)


# Go's builtin functions (text/template funcs.go), the ones its parser knows without a FuncMap.
BUILTIN_FUNCS = ("and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
                 "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne")


class Template:
    """A parsed template set: main tree and every define/block, plus what it references."""

    def __init__(self):
        self.trees = {}          # name -> list of nodes
        self.calls = []          # (name, line) of every {{ template }}
        self.comment_actions = []  # lines of actions that sit after a '#' on their line (outside strings)


class _Parser:

    def __init__(self, text, funcs, name):
        self.text = text
        self.funcs = set(BUILTIN_FUNCS) | set(funcs or ())
        self.name = name
        self.items = lex(text)
        self.pos = 0
        self.nid = 0
        self.result = Template()
        self.vars = [["$"]]

    def _node(self, kind, line, a=None, b=None, c=None, d=None):
        self.nid += 1
        return Node(kind, line, a, b, c, d, self.nid)

    def parse(self) -> Template:
        self._apply_trims()
        self.in_comment = set(id(a) for a in comment_actions(self.text, self.items))
        self.result.comment_actions = [(a.line, _action_kind(a), a.trim_right) for a in
                                       (item[1] for item in self.items if item[0] == "action") if id(a) in self.in_comment]
        main, stop = self._list(top=True)
        if stop is not None:
            keyword, action = stop
            raise TemplateError("parse_error", action.line, "unexpected {{%s}}" % keyword)
        self.result.trees[self.name] = main
        return self.result

    def _apply_trims(self):
        items = self.items
        for index, item in enumerate(items):
            if item[0] != "action":
                continue
            action = item[1]
            if action.trim_left and index > 0 and items[index - 1][0] == "text":
                kind, value, line = items[index - 1]
                items[index - 1] = (kind, value.rstrip(_SPACE), line)
            if action.trim_right and index + 1 < len(items) and items[index + 1][0] == "text":
                kind, value, line = items[index + 1]
                stripped = value.lstrip(_SPACE)
                items[index + 1] = (kind, stripped, line + value[:len(value) - len(stripped)].count("\n"))

    # list of nodes up to a {{end}}/{{else}}; returns (nodes, (keyword, action) | None)
    def _list(self, top=False):
        nodes = []
        while self.pos < len(self.items):
            item = self.items[self.pos]
            self.pos += 1
            if item[0] == "text":
                if item[1]:
                    nodes.append(self._node("text", item[2], item[1]))
                continue
            action = item[1]
            if action.comment:
                continue
            tokens = action.tokens
            if not tokens:
                raise TemplateError("parse_error", action.line, "missing value for command")
            first = tokens[0]
            if first.kind == "keyword":
                word = first.value
                if word in ("end", "else"):
                    return nodes, (word, action)
                if word == "define":
                    if not top:
                        raise TemplateError("parse_error", action.line, "unexpected <define> in command")
                    self._define(action)
                    continue
                nodes.append(self._control(word, action))
                continue
            nodes.append(self._node("action", action.line, self._pipeline(tokens, action, allow_decl=True),
                                    d=id(action) in self.in_comment))
        return nodes, None

    def _control(self, word, action):
        tokens = action.tokens[1:]
        line = action.line
        if word == "template":
            name, rest = self._template_name(tokens, action)
            pipe = self._pipeline(rest, action) if rest else None
            self.result.calls.append((name, line))
            return self._node("template", line, name, pipe)
        if word == "block":
            name, rest = self._template_name(tokens, action)
            if not rest:
                raise TemplateError("parse_error", line, "missing value for block")
            pipe = self._pipeline(rest, action)
            body, stop = self._list()
            if stop is None or stop[0] != "end":
                raise TemplateError("parse_error", line, "unexpected EOF in block")
            self._add_tree(name, body, line)
            self.result.calls.append((name, line))
            return self._node("template", line, name, pipe)
        if word in ("break", "continue"):
            if tokens:
                raise TemplateError("parse_error", line, "unexpected %s in {{%s}}" % (tokens[0].value, word))
            if not getattr(self, "_range_depth", 0):
                raise TemplateError("parse_error", line, "{{%s}} outside {{range}}" % word)
            return self._node(word, line)
        if word in ("if", "range", "with"):
            return self._branch(word, tokens, action)
        raise TemplateError("parse_error", line, "unexpected {{%s}}" % word)

    def _template_name(self, tokens, action):
        if not tokens or tokens[0].kind != "string":
            raise TemplateError("parse_error", action.line, "unexpected %s in template clause" % (
                tokens[0].value if tokens else "end of action"))
        return tokens[0].value, tokens[1:]

    def _define(self, action):
        name, rest = self._template_name(action.tokens[1:], action)
        if rest:
            raise TemplateError("parse_error", action.line, "unexpected %r in define clause" % (rest[0].value,))
        saved = self.vars
        self.vars = [["$"]]
        body, stop = self._list()
        self.vars = saved
        if stop is None or stop[0] != "end":
            raise TemplateError("parse_error", action.line, "unexpected EOF in define")
        self._add_tree(name, body, action.line)

    def _add_tree(self, name, body, line):
        if name in self.result.trees and _nonempty(self.result.trees[name]) and _nonempty(body):
            raise TemplateError("parse_error", line, "template: multiple definition of template %r" % name)
        if name not in self.result.trees or _nonempty(body):
            self.result.trees[name] = body

    def _branch(self, word, tokens, action):
        line = action.line
        self.vars.append([])
        range_vars = None
        if word == "range":
            range_vars, tokens = self._range_decl(tokens, action)
        pipe = self._pipeline(tokens, action, allow_decl=(word != "range"))
        if word == "range":
            self._range_depth = getattr(self, "_range_depth", 0) + 1
        body, stop = self._list()
        if word == "range":
            self._range_depth -= 1
        if stop is None:
            raise TemplateError("parse_error", line, "unexpected EOF")
        else_body = None
        keyword, stop_action = stop
        if keyword == "else":
            rest = stop_action.tokens[1:]
            if rest and rest[0].kind == "keyword" and rest[0].value in ("if", "with") and word in ("if", "with"):
                if rest[0].value != word:
                    raise TemplateError("parse_error", stop_action.line, "unexpected %s in {{else}}" % rest[0].value)
                # {{else if x}} is {{else}}{{if x}}...{{end}}{{end}}: one shared end
                self.vars.pop()
                nested = self._branch(word, rest[1:], stop_action)
                return self._node(word, line, pipe, body, [nested], range_vars)
            if rest:
                raise TemplateError("parse_error", stop_action.line, "unexpected %r in else" % (rest[0].value,))
            else_body, stop = self._list()
            if stop is None or stop[0] != "end":
                raise TemplateError("parse_error", line, "expected end; found %s" % (
                    "EOF" if stop is None else "{{%s}}" % stop[0]))
            stop_action = stop[1]
        if stop_action.tokens[1:]:
            raise TemplateError("parse_error", stop_action.line, "unexpected %r in end" % (stop_action.tokens[1].value,))
        self.vars.pop()
        return self._node(word, line, pipe, body, else_body, range_vars)

    def _range_decl(self, tokens, action):
        # range $i, $e := pipeline | range $e := pipeline
        names = []
        if len(tokens) >= 2 and tokens[0].kind == "variable":
            if tokens[1].kind == "declare":
                names = [tokens[0].value]
                tokens = tokens[2:]
            elif tokens[1].kind == "," and len(tokens) >= 4 and tokens[2].kind == "variable" and tokens[3].kind == "declare":
                names = [tokens[0].value, tokens[2].value]
                tokens = tokens[4:]
        self.vars[-1].extend(names)
        return names, tokens

    def _known_var(self, name):
        return any(name in scope for scope in self.vars)

    def _pipeline(self, tokens, action, allow_decl=False):
        line = action.line
        decl = None
        if allow_decl and len(tokens) >= 2 and tokens[0].kind == "variable" and tokens[1].kind in ("declare", "="):
            if tokens[1].kind == "=" and not self._known_var(tokens[0].value):
                raise TemplateError("parse_error", line, "undefined variable %s" % tokens[0].value)
            decl = (tokens[0].value, tokens[1].kind)
            tokens = tokens[2:]
            if decl[1] == "declare":
                self.vars[-1].append(decl[0])
        if not tokens:
            raise TemplateError("parse_error", line, "missing value for command")
        commands = []
        current = []
        depth = 0
        for token in tokens:
            if token.kind == "(":
                depth += 1
            elif token.kind == ")":
                depth -= 1
                if depth < 0:
                    raise TemplateError("parse_error", line, "unexpected right paren")
            if token.kind == "|" and depth == 0:
                if not current:
                    raise TemplateError("parse_error", line, "missing command")
                commands.append(self._command(current, action))
                current = []
                continue
            current.append(token)
        if depth:
            raise TemplateError("parse_error", line, "unclosed left paren")
        if not current:
            raise TemplateError("parse_error", line, "missing command")
        commands.append(self._command(current, action))
        return self._node("pipeline", line, decl, commands)

    def _command(self, tokens, action):
        operands = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token.kind == "(":
                depth, j = 1, i + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(tokens[j].kind, 0)
                    j += 1
                inner = self._pipeline(tokens[i + 1:j - 1], action, allow_decl=True)
                node = self._node("paren", token.line, inner)
                i = j
                if i < len(tokens) and tokens[i].kind == "chain":
                    node = self._node("chain", token.line, node, tokens[i].value)
                    i += 1
                operands.append(node)
                continue
            if token.kind in ("declare", "=", ",", "chain"):
                raise TemplateError("parse_error", token.line, "unexpected %r in operand" % token.value)
            if token.kind == "keyword":
                raise TemplateError("parse_error", token.line, "unexpected <%s> in command" % token.value)
            if token.kind == "identifier" and token.value not in self.funcs:
                raise TemplateError("unknown_function", token.line, "function %r not defined" % token.value)
            if token.kind == "variable":
                base = token.value.split(".")[0]
                if not self._known_var(base):
                    raise TemplateError("parse_error", token.line, "undefined variable %s" % base)
            node = self._node(token.kind, token.line, token.value)
            i += 1
            if i < len(tokens) and tokens[i].kind == "chain" and token.kind == "variable":
                node = self._node("chain", token.line, node, tokens[i].value)
                i += 1
            operands.append(node)
        return self._node("command", tokens[0].line, operands)


def comment_actions(text: str, items: Sequence[Tuple[Any, ...]]) -> List[Action]:
    """The actions that sit after a TOML `#` on their line (outside a string): k3s executes them."""
    found = []
    for item in items:
        if item[0] != "action" or item[1].comment:
            continue
        action = item[1]
        line_start = text.rfind("\n", 0, action.start) + 1
        before = re.sub(r"\{\{.*?\}\}", "", text[line_start:action.start])
        if _hash_outside_string(before):
            found.append(action)
    return found


def _action_kind(action):
    first = action.tokens[0] if action.tokens else None
    if first is not None and first.kind == "keyword":
        return "template" if first.value in ("template", "block") else "keyword"
    return "value"


def comment_actions_of(text: str) -> List[Tuple[int, str, bool]]:
    """(line, kind, trims the newline) of the actions in TOML comments, for text that may not parse."""
    try:
        items = lex(text)
    except TemplateError:
        return []
    return [(a.line, _action_kind(a), a.trim_right) for a in comment_actions(text, items)]


def _nonempty(body):
    return any(n.kind != "text" or n.a.strip() for n in body)


def _hash_outside_string(before):
    return unquoted_find(before, "#") >= 0


def parse(text: str, funcs: Iterable[str] = (), name: str = "main") -> Template:
    """Parse a template like Go's template.New(name).Funcs(funcs).Parse(text). Raises TemplateError."""
    return _Parser(text, funcs, name).parse()


# --- values -------------------------------------------------------------------------------------
# Types: {"kind": "struct", "fields": {name: type}, "open": bool, "name": str}, {"kind": "map", "elem": t},
# {"kind": "slice", "elem": t}, {"kind": "string"|"bool"|"int"|"any"}.

ANY = {"kind": "any"}
_NO_TYPICAL = object()


class Unknown:
    """A value the controller cannot know (a flag, a path on the node); typical: what most nodes have."""
    __slots__ = ("type", "typical", "source")

    def __init__(self, type_, typical=_NO_TYPICAL, source=None):
        self.type, self.typical, self.source = type_ or ANY, typical, source

    def has_typical(self) -> bool:
        return self.typical is not _NO_TYPICAL


class Struct:
    """A struct value: its type and the fields whose values are known (the rest are Unknown)."""
    __slots__ = ("type", "values")

    def __init__(self, type_, values=None):
        self.type, self.values = type_, dict(values or {})


class TypedMap(dict):
    """A Go map with a known element type: a missing key reads as the element's zero value."""

    def __init__(self, elem, items=()):
        super().__init__(items)
        self.elem = elem

    def missing(self) -> Any:
        return zero_value(self.elem)


def zero_of(type_: Mapping[str, Any]) -> Union[str, bool, int, None]:
    kind = type_["kind"]
    return {"string": "", "bool": False, "int": 0}.get(kind)


def zero_value(type_: Mapping[str, Any]) -> Any:
    """Go's zero value of a type: a struct of zero fields, an empty map or slice, "" / false / 0."""
    kind = type_["kind"]
    if kind == "struct":
        return Struct(type_, {name: zero_value(t) for name, t in type_.get("fields", {}).items()})
    if kind == "map":
        return TypedMap(type_["elem"])
    if kind == "slice":
        return []
    return zero_of(type_)


def _truth(value):
    if isinstance(value, Unknown):
        if value.has_typical():
            return None, _truth(value.typical)[1]
        return None, True
    if isinstance(value, Struct):
        return True, True
    if value is None:
        return False, False
    if isinstance(value, (bool, int, float)):
        return bool(value), bool(value)
    if isinstance(value, (str, list, tuple, dict)):
        return len(value) > 0, len(value) > 0
    return True, True


def _placeholder(type_):
    kind = (type_ or ANY)["kind"]
    if kind == "bool":
        return "false"
    if kind == "int":
        return "0"
    return "k3s-gpu-unknown"


def format_value(value: Any) -> str:
    """Go's fmt.Sprint of a value, as {{ }} prints it."""
    if isinstance(value, Unknown):
        return format_value(value.typical) if value.has_typical() else _placeholder(value.type)
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value != int(value) else "%d" % value
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join("%s:%s" % (k, format_value(value[k])) for k in sorted(value)) + "]"
    if isinstance(value, Struct):
        return "{" + " ".join(format_value(value.values.get(k)) for k in value.type.get("fields", {})) + "}"
    return str(value)


# --- execution ----------------------------------------------------------------------------------

class Output:
    """Rendered text with the origin of each piece: [(text, origin)] where origin is (name, line)."""

    def __init__(self):
        self.pieces = []

    def write(self, text: str, origin: Tuple[str, int]) -> None:
        if text:
            self.pieces.append((text, origin))

    def text(self) -> str:
        return "".join(p[0] for p in self.pieces)

    def line_origins(self) -> List[Optional[Tuple[str, int]]]:
        """Origin (name, line) of each output line: that of its first non-blank piece; the lines of
        a text piece count on from the line it starts on."""
        origins = [None]
        append = origins.append
        for text, origin in self.pieces:
            if "\n" not in text:  # most pieces: a part of one line
                if origins[-1] is None and text and not text.isspace():
                    origins[-1] = origin
                continue
            parts = text.split("\n")
            if origins[-1] is None and parts[0] and not parts[0].isspace():
                origins[-1] = origin
            name, first = origin
            in_base = name == "base"
            for index in range(1, len(parts)):
                part = parts[index]
                append(None if not part or part.isspace() else origin if in_base else (name, first + index))
        last = None
        for index, origin in enumerate(origins):
            if origin is None:
                origins[index] = last
            else:
                last = origin
        return origins


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Execution:
    """One run of a template set for one set of decisions.

    externals: name -> callable(execution, dot, output) for templates that are not in the text
    (k3s's base). funcs: name -> callable(*args) for k3s's FuncMap (Unknown in, Unknown out is fine).
    """

    MAX_DEPTH = 40

    def __init__(self, template, externals=None, funcs=None, decisions=None, findings=None):
        self.template = template
        self.externals = externals or {}
        self.funcs = funcs or {}
        self.decisions = decisions or {}
        self.taken = {}          # decision id -> choice taken in this run (typical when not forced)
        self.typical = {}        # decision id -> the typical choice
        self.decision_lines = {}
        self.findings = findings if findings is not None else []
        self.depth = 0
        self.calls = []          # (name, line) actually executed

    # decisions: a condition or range over an unknown value
    def decide(self, node: Node, typical: bool, what: str) -> bool:
        key = node.nid
        choice = self.decisions.get(key, typical)
        self.taken[key] = choice
        self.typical[key] = typical
        self.decision_lines[key] = (node.line, what)
        return choice

    def run(self, name: str, dot: Any, output: Output) -> None:
        if name not in self.template.trees:
            if name in self.externals:
                return self.externals[name](self, dot, output)
            raise TemplateError("unknown_template", 0, "template %r not defined" % name)
        self._list(self.template.trees[name], dot, [("$", dot)], output, name)

    def _list(self, nodes, dot, variables, output, tree):
        for node in nodes:
            self._node(node, dot, variables, output, tree)

    def _node(self, node, dot, variables, output, tree):
        kind = node.kind
        if kind == "text":
            output.write(node.a, (tree, node.line))
        elif kind == "action":
            value = self._pipeline(node.a, dot, variables, tree)
            if node.a.a is None:
                text = format_value(value)
                if node.d and "\n" in text:
                    self.findings.append(("action_in_comment", node.line, "prints several lines"))
                output.write(text, (tree, node.line))
        elif kind == "if" or kind == "with":
            value = self._pipeline(node.a, dot, variables, tree)
            known, typical = _truth(value)
            truth = known if known is not None else self.decide(node, typical, "{{%s}}" % kind)
            scope = list(variables)
            if truth:
                self._list(node.b, value if kind == "with" else dot, scope, output, tree)
            elif node.c:
                self._list(node.c, dot, scope, output, tree)
        elif kind == "range":
            self._range(node, dot, variables, output, tree)
        elif kind == "template":
            value = self._pipeline(node.b, dot, variables, tree) if node.b is not None else None
            self.depth += 1
            if self.depth > self.MAX_DEPTH:
                raise TemplateError("exec_error", node.line, "exceeded maximum template depth (%d)" % self.MAX_DEPTH)
            if node.a not in self.template.trees and node.a not in self.externals:
                raise TemplateError("unknown_template", node.line, "template: no template %r associated with template %r" % (
                    node.a, tree), name=tree)
            self.calls.append((node.a, node.line))
            self.run(node.a, value, output)
            self.depth -= 1
        elif kind == "break":
            raise _Break()
        elif kind == "continue":
            raise _Continue()
        else:  # pragma: no cover - the parser makes no other node kinds at list level
            raise TemplateError("exec_error", node.line, "unknown node %s" % kind)

    def _range(self, node, dot, variables, output, tree):
        value = self._pipeline(node.a, dot, variables, tree)
        names = node.d or []
        items = None
        if isinstance(value, Unknown):
            type_ = value.type
            elem = type_.get("elem", ANY) if type_["kind"] in ("map", "slice") else ANY
            if value.has_typical():
                items = _items(value.typical, node.line)
            elif self.decide(node, True, "{{range}}"):
                items = [("k3s-gpu-unknown", Unknown(elem))]
            else:
                items = []
        else:
            items = _items(value, node.line)
        if not items:
            if node.c:
                self._list(node.c, dot, list(variables), output, tree)
            return
        for key, element in items:
            scope = list(variables)
            if len(names) == 1:
                scope.append((names[0], element))
            elif len(names) == 2:
                scope.append((names[0], key))
                scope.append((names[1], element))
            try:
                self._list(node.b, element, scope, output, tree)
            except _Break:
                break
            except _Continue:
                continue

    def _pipeline(self, pipe, dot, variables, tree):
        value = None
        for index, command in enumerate(pipe.b):
            value = self._command(command, dot, variables, tree, value if index else _NO_TYPICAL)
        decl = pipe.a
        if decl is not None:
            name, how = decl
            if how == "declare":
                variables.append((name, value))
            else:
                for index in range(len(variables) - 1, -1, -1):
                    if variables[index][0] == name:
                        variables[index] = (name, value)
                        break
        return value

    def _command(self, command, dot, variables, tree, piped):
        operands = command.a
        first = operands[0]
        if first.kind == "identifier":
            args = [self._operand(op, dot, variables, tree) for op in operands[1:]]
            if piped is not _NO_TYPICAL:
                args.append(piped)
            return self._call(first.a, args, first.line)
        if len(operands) > 1 or piped is not _NO_TYPICAL:
            raise TemplateError("exec_error", first.line, "can't give argument to non-function %s" % (
                _describe(first),))
        return self._operand(first, dot, variables, tree)

    def _operand(self, node, dot, variables, tree):
        kind = node.kind
        if kind == "field":
            return self._fields(dot, node.a, node.line)
        if kind == "dot":
            return dot
        if kind in ("string", "number", "bool"):
            return node.a
        if kind == "nil":
            raise TemplateError("exec_error", node.line, "nil is not a command")
        if kind == "variable":
            return self._variable(node.a, variables, node.line)
        if kind == "chain":
            base = self._operand(node.a, dot, variables, tree)
            return self._fields(base, node.b, node.line)
        if kind == "paren":
            return self._pipeline(node.a, dot, list(variables), tree)
        if kind == "identifier":
            return self._call(node.a, [], node.line)
        raise TemplateError("exec_error", node.line, "can't evaluate %s" % kind)  # pragma: no cover

    def _variable(self, name, variables, line):
        for index in range(len(variables) - 1, -1, -1):
            if variables[index][0] == name:
                return variables[index][1]
        raise TemplateError("exec_error", line, "undefined variable: %s" % name)  # pragma: no cover

    def _fields(self, value, path, line):
        walked = []
        for name in path:
            value = self._field(value, name, line, walked)
            walked.append(name)
        return value

    def _field(self, value, name, line, walked):
        where = "." + ".".join(walked) if walked else "."
        if isinstance(value, Unknown):
            type_ = value.type
            typical = value.typical if value.has_typical() else _NO_TYPICAL
            if type_["kind"] == "struct":
                field_type = self._struct_field(type_, name, line, walked)
                sub = _NO_TYPICAL
                if isinstance(typical, Struct):
                    sub = typical.values.get(name, _NO_TYPICAL)
                return Unknown(field_type, sub)
            if type_["kind"] == "map":
                return Unknown(type_["elem"])
            if type_["kind"] == "any":
                return Unknown(ANY)
            raise TemplateError("exec_error", line, "can't evaluate field %s in type %s" % (name, type_["kind"]))
        if isinstance(value, Struct):
            field_type = self._struct_field(value.type, name, line, walked)
            if name in value.values:
                return value.values[name]
            return Unknown(field_type)
        if isinstance(value, TypedMap):
            return value[name] if name in value else value.missing()
        if isinstance(value, dict):
            return value.get(name)
        if value is None:
            raise TemplateError("exec_error", line, "nil pointer evaluating %s.%s" % (where, name))
        raise TemplateError("exec_error", line, "can't evaluate field %s in type %s" % (name, type(value).__name__))

    def _struct_field(self, type_, name, line, walked):
        fields = type_.get("fields", {})
        if name in fields:
            return fields[name]
        if name in type_.get("gone", ()):
            raise TemplateError("missing_field", line, "can't evaluate field %s in type %s" % (name, type_.get("name", "struct")))
        path = ".".join(walked + [name])
        if type_.get("open"):
            self.findings.append(("unverified_field", line, path))
            return ANY
        raise TemplateError("missing_field", line, "can't evaluate field %s in type %s" % (name, type_.get("name", "struct")))

    def _call(self, name, args, line):
        if name in self.funcs:
            if any(isinstance(a, Unknown) for a in args):
                # the result is unknown, but typical: computed from the typical (or placeholder) values
                return Unknown({"kind": "string"}, self.funcs[name](*[_stand_in(a) for a in args]))
            return self.funcs[name](*args)
        if name in ("print", "println", "printf") and _any_unknown(args):
            return Unknown({"kind": "string"}, _builtin(name, [_stand_in(a) for a in args], line))
        return _builtin(name, args, line)


def _stand_in(value):
    """A concrete value for an Unknown: its typical value, else the placeholder of its type."""
    if not isinstance(value, Unknown):
        return value
    if value.has_typical():
        return value.typical
    kind = value.type["kind"]
    return {"bool": False, "int": 0}.get(kind, "k3s-gpu-unknown")


def _describe(node):
    if node.kind == "field":
        return "." + ".".join(node.a)
    return str(node.a)


def _items(value, line):
    if value is None:
        return []
    if isinstance(value, dict):
        return [(k, value[k]) for k in sorted(value)]
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return [(i, i) for i in range(value)]
    raise TemplateError("exec_error", line, "range can't iterate over %s" % format_value(value))


def _any_unknown(args):
    return any(isinstance(a, Unknown) for a in args)


def _builtin(name, args, line):
    if name in ("and", "or"):
        if not args:
            raise TemplateError("exec_error", line, "wrong number of args for %s: want at least 1 got 0" % name)
        for arg in args:
            known, _typical = _truth(arg)
            if known is None:
                return Unknown(ANY)
            if (name == "and" and not known) or (name == "or" and known):
                return arg
        return args[-1]
    if name == "not":
        if len(args) != 1:
            raise TemplateError("exec_error", line, "wrong number of args for not: want 1 got %d" % len(args))
        known, typical = _truth(args[0])
        return Unknown({"kind": "bool"}, not typical) if known is None else not known
    if name in ("eq", "ne", "lt", "le", "gt", "ge"):
        return _compare(name, args, line)
    if name == "len":
        if len(args) != 1:
            raise TemplateError("exec_error", line, "wrong number of args for len")
        if isinstance(args[0], Unknown):
            return Unknown({"kind": "int"})
        try:
            return len(args[0])
        except TypeError:
            raise TemplateError("exec_error", line, "len of type %s" % type(args[0]).__name__)
    if name in ("print", "println", "printf", "html", "js", "urlquery"):
        if _any_unknown(args):
            return Unknown({"kind": "string"})
        if name == "printf":
            return _sprintf(args[0], args[1:], line) if args else ""
        if name == "println":
            return " ".join(format_value(a) for a in args) + "\n"
        return _sprint(args)
    if name == "index":
        return _index(args, line)
    if name in ("slice", "call"):
        return Unknown(ANY)
    raise TemplateError("unknown_function", line, "function %r not defined" % name)  # pragma: no cover


def _compare(name, args, line):
    """eq, ne, lt, le, gt, ge."""
    if len(args) < 2 and name != "eq" or len(args) < 2:
        raise TemplateError("exec_error", line, "missing argument for comparison")
    if _any_unknown(args):
        return Unknown({"kind": "bool"})
    first = args[0]
    if name == "eq":
        return any(first == other and type(first) is type(other) for other in args[1:])
    other = args[1]
    if name == "ne":
        return not (first == other and type(first) is type(other))
    try:
        return {"lt": first < other, "le": first <= other, "gt": first > other, "ge": first >= other}[name]
    except TypeError:
        raise TemplateError("exec_error", line, "incompatible types for comparison")


def _index(args, line):
    """index: a missing map key reads as the map's zero value, as in Go."""
    if _any_unknown(args):
        return Unknown(ANY)
    value = args[0]
    for key in args[1:]:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            if isinstance(value, TypedMap):
                value = value.missing()
                continue
            if isinstance(value, dict):
                value = None
                continue
            raise TemplateError("exec_error", line, "error calling index: index out of range: %s" % format_value(key))
    return value


def _sprint(args):
    # fmt.Sprint puts spaces between operands when neither is a string
    out = []
    for index, arg in enumerate(args):
        if index and not isinstance(arg, str) and not isinstance(args[index - 1], str):
            out.append(" ")
        out.append(format_value(arg))
    return "".join(out)


_VERB = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d+))?([vsdqtxXfgeb%])")


def _sprintf(fmt, args, line):
    if not isinstance(fmt, str):
        raise TemplateError("exec_error", line, "printf: format is not a string")
    values = list(args)

    def verb(match: re.Match[str]) -> str:
        flags, width, precision, letter = match.groups()
        if letter == "%":
            return "%"
        if not values:
            return "%!" + letter + "(MISSING)"
        value = values.pop(0)
        if letter == "q":
            text = '"%s"' % format_value(value).replace("\\", "\\\\").replace('"', '\\"')
        elif letter in "dxXb" and isinstance(value, int) and not isinstance(value, bool):
            text = format(value, {"d": "d", "x": "x", "X": "X", "b": "b"}[letter])
        elif letter in "feg" and isinstance(value, (int, float)):
            text = ("%" + ("." + precision if precision else "") + letter) % value
        else:
            text = format_value(value)
        if width:
            text = text.ljust(int(width)) if "-" in flags else text.rjust(int(width), "0" if "0" in flags else " ")
        return text

    out = _VERB.sub(verb, fmt)
    if values:
        out += "%!(EXTRA " + ", ".join(format_value(v) for v in values) + ")"
    return out


# --- exploring the decisions ---------------------------------------------------------------------

class Run:
    """The result of one execution: output (or the error), the decisions it took."""

    def __init__(self, output, error, taken, typical, decision_lines, findings, calls):
        self.output, self.error = output, error
        self.taken, self.typical, self.decision_lines = taken, typical, decision_lines
        self.findings, self.calls = findings, calls

    @property
    def flipped(self) -> List[int]:
        return sorted(k for k, v in self.taken.items() if v != self.typical.get(k))


def explore(template: Template, data: Any, externals: Optional[Mapping[str, Callable[[Execution, Any, Output], Any]]] = None,
            funcs: Optional[Mapping[str, Callable[..., Any]]] = None, name: str = "main",
            limit: int = 32) -> Tuple[List[Run], bool]:
    """Run the template for the typical choices, then with the decisions flipped, breadth first.

    A run forces the choices of its parent plus one more decision the other way, so the first n+1
    runs of n independent decisions already take each branch once, and every combination runs
    while they fit under limit. Returns (runs, complete): complete says no path was left out.
    """
    runs = []
    seen = set()
    queued = {frozenset()}
    queue = [{}]
    while queue:
        if len(runs) >= limit:
            return runs, False
        decisions = queue.pop(0)
        execution = Execution(template, externals, funcs, decisions)
        output = Output()
        error = None
        try:
            execution.run(name, data, output)
        except TemplateError as exc:
            error = exc
        key = frozenset(execution.taken.items())
        if key in seen:
            continue
        seen.add(key)
        runs.append(Run(output, error, execution.taken, execution.typical, execution.decision_lines,
                        execution.findings, execution.calls))
        for decision_id, choice in sorted(execution.taken.items()):
            if decision_id not in decisions:
                child = dict(decisions)
                child[decision_id] = not choice
                key = frozenset(child.items())
                if key not in queued:
                    queued.add(key)
                    queue.append(child)
    return runs, True
