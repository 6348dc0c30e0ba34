# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Small value helpers shared by node and controller code.

PRIVATE to the collection. Stdlib only: this file runs on every node (Python 3.8+).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def type_name(value):
    """The Python type of a value, as error messages name it."""
    return type(value).__name__


def is_list(value):
    return isinstance(value, (list, tuple))


def line_key(line):
    """A release line such as "1.31" (or any dotted version of whole numbers) as a sortable tuple."""
    return tuple(int(part) for part in line.split("."))


def unquote(item):
    """A value without its surrounding quotes (env files, unit arguments, simple YAML)."""
    item = item.strip()
    if item[:1] in ("'", '"') and item[-1:] == item[:1] and len(item) > 1:
        return item[1:-1]
    return item


def unquoted_find(text, char):
    """The index of the first char outside "..." (backslash escapes) and '...' strings, as TOML quotes them; -1 if none."""
    quote = None
    index = 0
    while index < len(text):
        current = text[index]
        if quote:
            if current == "\\" and quote == '"':
                index += 2
                continue
            if current == quote:
                quote = None
        elif current in "\"'":
            quote = current
        elif current == char:
            return index
        index += 1
    return -1
