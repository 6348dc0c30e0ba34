# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The base template model the tests compose with: the engine's own (plugins/module_utils/_k3s_base.py)."""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._k3s_base import (
    BASE_LINE, SOURCES, base_table_paths, base_tables, compose, era_of, render_base)

__all__ = ["BASE_LINE", "SOURCES", "base_table_paths", "base_tables", "compose", "era_of", "render_base"]
