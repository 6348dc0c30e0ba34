# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The FilterModule of the collection's filter plugins, each a file that holds one filter.

PRIVATE to the collection. Controller side.
"""

from __future__ import annotations


def one_filter(function):
    """The FilterModule class Ansible loads from a filter plugin file: the one filter, named as its function."""

    class FilterModule:
        def filters(self):
            return {function.__name__: function}

    return FilterModule
