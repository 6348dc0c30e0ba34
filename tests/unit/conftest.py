# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Sandbox node trees for the unit tests: a root prefix with fake toolkit binaries.

The binaries are shell stubs: no GPU and no NVIDIA toolkit can run here, and detection only
looks at names, types and permission bits.
"""

from __future__ import annotations

import os
import re
import stat
import shutil
import tempfile

import pytest

STUB = "#!/bin/sh\nexit 0\n"

# Node layouts the engine is tested on: binary node paths per layout.
LAYOUTS = {
    "package": ["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
                "/usr/bin/nvidia-container-runtime.legacy"],
    "operator": ["/usr/local/nvidia/toolkit/nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
                 "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy",
                 "/usr/local/nvidia/toolkit/nvidia-container-runtime.real"],
    "custom_on_path": ["/opt/nvidia/bin/nvidia-container-runtime", "/opt/nvidia/bin/nvidia-container-runtime.cdi",
                       "/opt/nvidia/bin/nvidia-container-runtime.legacy"],
    "custom_off_path": ["/opt/nvidia/bin/nvidia-container-runtime", "/opt/nvidia/bin/nvidia-container-runtime.cdi",
                        "/opt/nvidia/bin/nvidia-container-runtime.legacy"],
    "legacy_only": ["/usr/bin/nvidia-container-runtime.legacy"],
    "nothing": [],
}


class Sandbox:
    def __init__(self, root):
        self.root = root

    def path(self, node_path):
        return self.root + node_path

    def write(self, node_path, content="", mode=0o644):
        host = self.path(node_path)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        with open(host, "wb") as handle:
            handle.write(data)
        os.chmod(host, mode)
        return host

    def binary(self, node_path, mode=0o755):
        return self.write(node_path, STUB, mode)

    def symlink(self, node_path, target):
        host = self.path(node_path)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        os.symlink(target, host)

    def mkdir(self, node_path):
        os.makedirs(self.path(node_path), exist_ok=True)

    def read(self, node_path):
        with open(self.path(node_path), "rb") as handle:
            return handle.read()

    def exists(self, node_path):
        return os.path.lexists(self.path(node_path))

    def k3s(self, distribution="k3s", layout="nothing"):
        data_dir = "/var/lib/rancher/%s" % distribution
        self.mkdir(data_dir + "/agent/etc/containerd")
        for binary in LAYOUTS[layout]:
            self.binary(binary)
        if layout == "custom_on_path":
            unit = "k3s" if distribution == "k3s" else "rke2-server"
            self.write("/etc/default/%s" % unit, 'PATH="/opt/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"\n')
        return self

    def snapshot(self):
        """Every file under the root with its bytes and mode, to prove nothing changed."""
        result = {}
        for directory, _dirs, files in os.walk(self.root):
            for name in files:
                host = os.path.join(directory, name)
                if os.path.islink(host):
                    result[host] = ("link", os.readlink(host))
                elif not stat.S_ISREG(os.lstat(host).st_mode):
                    result[host] = ("other", os.lstat(host).st_mode)  # a FIFO would block an open
                else:
                    with open(host, "rb") as handle:
                        result[host] = (handle.read(), os.stat(host).st_mode)
        return result


@pytest.fixture
def sandbox():
    root = tempfile.mkdtemp(prefix="k3s-gpu-")
    try:
        yield Sandbox(root)
    finally:
        shutil.rmtree(root)


# Every failed action's or module's message holds its ending once: "...; nothing was written. Nothing was changed."
# fails the test that made it (issue 42: one failure boundary adds the ending only where a message has none).
_TWICE = re.compile(r"(?i)nothing was (changed|written)\b.*\bnothing was (changed|written|checked)\b")


def _spec_action():
    """SpecAction, or None where the controller's code is not importable (ansible-test runs the module tests without
    ansible.plugins)."""
    try:
        from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
    except ImportError:
        return None
    return SpecAction


@pytest.fixture(autouse=True)
def ending_once(monkeypatch):
    from ansible.module_utils.basic import AnsibleModule

    def check(msg):
        for text in msg if isinstance(msg, list) else [msg]:
            if isinstance(text, str) and _TWICE.search(text):
                pytest.fail("a message ends twice: %s" % text)
    spec_action = _spec_action()
    if spec_action is not None:
        ran = spec_action.run

        def run(self, *args, **kwargs):
            result = ran(self, *args, **kwargs)
            if isinstance(result, dict) and result.get("failed"):
                check(result.get("msg"))
            return result
        monkeypatch.setattr(spec_action, "run", run)
    failed = AnsibleModule.fail_json

    def fail_json(self, msg, **kwargs):
        check(msg)
        return failed(self, msg, **kwargs)
    monkeypatch.setattr(AnsibleModule, "fail_json", fail_json)
    yield


# K3S_GPU_MESSAGES=<file>: every message the suite makes the collection render (a K3sGpuError's text, a failed action's
# or module's msg) is appended to <file> as JSON lines with the test's id, so that two heads can be compared message
# by message (a renovation changes none of them). Off unless set.
_MESSAGES = os.environ.get("K3S_GPU_MESSAGES")


@pytest.fixture(autouse=True)
def record_messages(request, monkeypatch):
    if not _MESSAGES:
        yield
        return
    import json
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
    spec_action = _spec_action()

    def write(kind, text):
        with open(_MESSAGES, "a") as out:
            out.write(json.dumps({"test": request.node.nodeid, "kind": kind, "text": str(text)}) + "\n")

    made = K3sGpuError.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        write("error", self.text())
    monkeypatch.setattr(K3sGpuError, "__init__", init)
    if spec_action is not None:
        ran = spec_action.run

        def run(self, *args, **kwargs):
            result = ran(self, *args, **kwargs)
            if isinstance(result, dict) and result.get("failed"):
                write("action", result.get("msg"))
            return result
        monkeypatch.setattr(spec_action, "run", run)
    failed = AnsibleModule.fail_json

    def fail_json(self, msg, **kwargs):
        write("module", msg)
        return failed(self, msg, **kwargs)
    monkeypatch.setattr(AnsibleModule, "fail_json", fail_json)
    yield
