# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A small, byte-stable YAML emitter for the Kubernetes manifests this collection writes.

PRIVATE to the collection. Controller side, stdlib only.

The manifests land in a server's auto-deploy directory, so the same objects must give the same bytes
on every controller (no dependence on the PyYAML version or its emitter settings, or `copy` would
report a change for nothing). Every scalar is written with json.dumps (a JSON string, number, bool
or null is valid YAML with the same meaning); mappings and non-empty lists are block style; a
multi-line string that YAML can hold verbatim (a HelmChart's valuesContent) is a literal block.
Key order is the caller's, then alphabetical. The unit tests read the output back with PyYAML.
"""

from __future__ import annotations

import json
import re

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import is_list

from collections.abc import Mapping

_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
# YAML 1.1 words a plain key would turn into booleans or null (PyYAML reads YAML 1.1).
_YAML_SPECIAL = ("y", "n", "yes", "no", "on", "off", "true", "false", "null")
# what a literal block cannot carry verbatim: CR, other control characters, a leading space or newline
_NOT_LITERAL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]|\A[ \n]|\n\n\Z|[ \t]\n|[ \t]\Z")


def yaml_key(key):
    if _PLAIN_KEY.match(key) and key.lower() not in _YAML_SPECIAL:
        return key
    return json.dumps(key)


def _literal_lines(text, pad):
    """A literal block for a multi-line string, or None if YAML could not keep it byte for byte."""
    if "\n" not in text or _NOT_LITERAL.search(text):
        return None
    indicator = "|" if text.endswith("\n") else "|-"
    body = text[:-1] if text.endswith("\n") else text
    return indicator, [(pad + line) if line else "" for line in body.split("\n")]


def _value_lines(prefix, value, indent, key_order, lines):
    """Append `prefix` + value, where prefix is `key:` or `-`, at the given indent."""
    pad = "  " * indent
    if isinstance(value, Mapping) and value:
        lines.append(pad + prefix)
        mapping_lines(value, indent + 1, key_order, lines)
    elif is_list(value) and value:
        lines.append(pad + prefix)
        _sequence_lines(value, indent + 1, key_order, lines)
    elif isinstance(value, str) and _literal_lines(value, pad + "  "):
        indicator, body = _literal_lines(value, pad + "  ")
        lines.append("%s%s %s" % (pad, prefix, indicator))
        lines.extend(body)
    else:
        # scalars, empty maps and empty lists in JSON flow style, which YAML reads as is
        lines.append("%s%s %s" % (pad, prefix, json.dumps(value, sort_keys=True)))


def _sequence_lines(items, indent, key_order, lines):
    pad = "  " * indent
    for item in items:
        if isinstance(item, Mapping) and item:
            # the item's first key shares the line with its dash: `- name: x`, the rest below it
            nested = []
            mapping_lines(item, indent + 1, key_order, nested)
            lines.append(pad + "- " + nested[0].lstrip(" "))
            lines.extend(nested[1:])
        else:
            _value_lines("-", item, indent, key_order, lines)


def _key_rank(key, key_order):
    return (key_order.index(key) if key in key_order else len(key_order), key)


def mapping_lines(mapping, indent, key_order, lines):
    for key in sorted((str(key) for key in mapping), key=lambda key: _key_rank(key, key_order)):
        _value_lines(yaml_key(key) + ":", mapping[key], indent, key_order, lines)


def render_documents(comment, documents, key_order=()):
    """`# comment`, then '---' and one block-style document per mapping; ends with a newline."""
    lines = ["# " + line if line else "#" for line in comment.split("\n")]
    for document in documents:
        lines.append("---")
        mapping_lines(document, 0, tuple(key_order), lines)
    return "\n".join(lines) + "\n"
