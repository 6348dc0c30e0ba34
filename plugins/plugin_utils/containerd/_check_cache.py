# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Template-check verdicts shared by the hosts of one playbook run.

PRIVATE to the collection. Controller side.

A fleet carries few distinct templates, and a check's verdict is a pure function of its inputs (the
template text, the release, what the node detects, the flags, the data dir, the target release) and
of the engine's own code. The key is a SHA-256 over all of them, the engine's source files included,
so a verdict is reused only for exactly the same question asked of exactly the same code. Entries live
in memory and, when a directory is given (the run's local temporary directory, which every forked
worker of ansible-playbook shares and which is removed when the run ends), in one JSON file per key,
written atomically. A missing, unreadable or damaged entry is computed again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Dict, Mapping, Optional

# The check's code: _template_check and every module of the collection it imports, directly or not
# (plugins/ relative). A new import of the engine belongs here, or a stale verdict could be reused.
_ENGINE_FILES = (
    "plugin_utils/containerd/_check_cache.py", "plugin_utils/containerd/_gotemplate.py", "plugin_utils/_release_rules.py",
    "plugin_utils/containerd/_template_check.py", "plugin_utils/containerd/_toml.py", "plugin_utils/containerd/_toml_read.py",
    "plugin_utils/containerd/_types.py", "plugin_utils/_node_facts.py", "plugin_utils/_k3s_config.py",
    "module_utils/_distro.py", "module_utils/_errors.py", "module_utils/_k3s_base.py", "module_utils/_plan.py", "module_utils/_values.py",
)


def _engine_digest():
    digest = hashlib.sha256()
    plugins = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plugin_utils/containerd/..
    for name in _ENGINE_FILES:
        with open(os.path.join(plugins, *name.split("/")), "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


ENGINE_DIGEST = _engine_digest()


def fingerprint(**inputs: Any) -> str:
    """The key of a check: every input, and the engine's code."""
    text = json.dumps(inputs, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256((ENGINE_DIGEST + "\n" + text).encode("utf-8")).hexdigest()


class CheckCache:
    def __init__(self, directory=None):
        self.directory = directory
        self.memory = {}

    def _path(self, key):
        return os.path.join(self.directory, key + ".json")

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        if key in self.memory:
            return self.memory[key]
        if not self.directory:
            return None
        try:
            with open(self._path(key), encoding="utf-8") as handle:
                value = json.load(handle)
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict) or value.get("key") != key:
            return None
        self.memory[key] = value
        return value

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        value = dict(value, key=key)
        self.memory[key] = value
        if not self.directory:
            return
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(value, handle)
            os.replace(tmp, self._path(key))
        except OSError:
            pass  # a cache that cannot be written only costs the next host the same work
