# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One mapping merged over another, as Helm merges values and containerd merges an imported file (pure, no I/O).

PRIVATE to the collection. Controller side.
"""

from __future__ import annotations

import copy

from collections.abc import Mapping


def deep_merge(base, extra):
    """A copy of base with extra merged over it: maps merge key by key, anything else replaces. Helm merges values
    so, and containerd merges an imported config file over what it read before so ."""
    result = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result
