# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The check cache's key covers exactly the code a template check runs."""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _check_cache as check_cache

PLUGINS = Path(__file__).resolve().parents[4] / "plugins"
# a module of the collection as its path under plugins/ (a wing is a sub-package of plugin_utils)
_IMPORT = re.compile(r"ansible_collections\.k3s_gpu\.nvidia\.plugins\.(module_utils|plugin_utils(?:\.[a-z]+)?)(?: import |\.)(_\w+)")


def _closure(start):
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = (PLUGINS / name).read_text(encoding="utf-8")
        todo.extend("%s/%s.py" % (package.replace(".", "/"), module) for package, module in _IMPORT.findall(text))
    return seen


def test_engine_files_are_the_template_checks_import_closure():
    assert sorted(check_cache._ENGINE_FILES) == sorted(_closure("plugin_utils/containerd/_template_check.py"))


def test_fingerprint_depends_on_every_input():
    assert check_cache.fingerprint(a=1) == check_cache.fingerprint(a=1)
    assert check_cache.fingerprint(a=1) != check_cache.fingerprint(a=2)
