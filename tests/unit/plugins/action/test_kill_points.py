# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A run killed anywhere inside node_files is repaired by the next (issue 41): for every kill point of a converge and of
a take-back (each file-system change node_files makes, in order), the next run leaves the node as a clean run would (no
temporary file, the record complete), and `absent` then gives back the original tree: bytes, modes and directories.

A kill is emulated in process: from the chosen change on, every change of the file system raises Killed, a
BaseException that no `except` of the module catches, so that even its `finally` cleanups fail as they would in a
process killed there."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import host_step

TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
V3 = "plugins.'io.containerd.cri.v1.runtime'.containerd"
USER_TEMPLATE = ('# site template\n{{ template "base" . }}\n\n[%s.runtimes.runsc]\n  runtime_type = "io.containerd.runsc.v1"\n'
                 % V3)
# what node_files (and AnsibleModule under it) changes a node with
_CHANGES = [(os, "rename"), (os, "replace"), (os, "unlink"), (os, "remove"), (os, "mkdir"), (os, "rmdir"), (os, "chmod"),
            (os, "chown"), (os, "utime"), (os, "fsync"), (shutil, "copy2"), (shutil, "copyfile"), (tempfile, "mkstemp")]
BACKUPS = "/var/backups"


class Killed(BaseException):
    pass


class KillPoint:
    """Counts the changes; from change number `at` on (None: never), each one raises Killed."""

    def __init__(self, monkeypatch, at=None):
        self.count, self.at = 0, at
        for owner, name in _CHANGES:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, call):
        def change(*args, **kwargs):
            self.count += 1
            if self.at is not None and self.count > self.at:
                raise Killed()
            return call(*args, **kwargs)
        return change


def node(sandbox, scenario):
    sandbox.k3s("k3s", "package")
    sandbox.mkdir("/etc")
    if scenario["template"]:
        sandbox.write(TEMPLATE, USER_TEMPLATE, 0o640)


def role(sandbox, scenario, state="present"):
    result = host_step(sandbox, gpu_node_release=scenario["release"], gpu_node_default_runtime="nvidia-legacy",
                       gpu_node_backup=True, gpu_node_state=state)
    assert not result.get("failed"), result.get("msg")
    return result


def tree(sandbox, copies=True):
    """Every path under the root: kind, mode and bytes (the copies under /var/backups by name only: they carry the
    time and process in their name)."""
    out = {}
    for directory, dirs, files in os.walk(sandbox.root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            relative = path[len(sandbox.root):]
            info = os.lstat(path)
            if relative.startswith(BACKUPS + "/") and name.endswith("~"):
                if copies:
                    out[relative.rsplit(".", 3)[0]] = "copy"
                continue
            data = open(path, "rb").read() if stat.S_ISREG(info.st_mode) else None
            out[relative] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), data)
    return out


def temporaries(sandbox):
    return [os.path.join(d, n) for d, _s, files in os.walk(sandbox.root) for n in files if ".k3s-gpu-nvidia-tmp." in n]


SCENARIOS = {
    "template": {"release": "v1.31.6+k3s1", "template": True},  # the user's template edited, its original kept
    "dropin": {"release": "v1.33.10+k3s1", "template": False},  # the collection's drop-in and config.yaml.d
}


def changes_of(sandbox_factory, monkeypatch, scenario, state):
    """How many file-system changes a clean run of state makes (after a clean converge for absent)."""
    sandbox = sandbox_factory()
    node(sandbox, scenario)
    if state == "absent":
        role(sandbox, scenario)
    with monkeypatch.context() as patch:
        counter = KillPoint(patch)
        role(sandbox, scenario, state)
    return counter.count


@pytest.fixture
def sandbox_factory(sandbox):
    """Fresh sandbox nodes, as many as a test needs (of the sandbox fixture's kind)."""
    made = []

    def make():
        made.append(type(sandbox)(tempfile.mkdtemp(prefix="k3s-gpu-kill-")))
        return made[-1]
    yield make
    for sandbox in made:
        shutil.rmtree(sandbox.root)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("state", ["present", "absent"])
def test_every_kill_point_is_repaired_by_the_next_run(sandbox_factory, monkeypatch, name, state):
    scenario = SCENARIOS[name]
    total = changes_of(sandbox_factory, monkeypatch, scenario, state)
    assert total > 5  # the run does change the node: the kill points are real
    reference = sandbox_factory()
    node(reference, scenario)
    original = tree(reference)
    role(reference, scenario)
    converged = tree(reference, copies=False)
    failures = []
    for at in range(total):
        sandbox = sandbox_factory()
        node(sandbox, scenario)
        if state == "absent":
            role(sandbox, scenario)
        with monkeypatch.context() as patch:
            KillPoint(patch, at)
            try:
                role(sandbox, scenario, state)
            except Killed:
                pass
        role(sandbox, scenario, state)  # the next run, whole
        if temporaries(sandbox):
            failures.append((at, "temporaries", temporaries(sandbox)))
        if state == "present" and tree(sandbox, copies=False) != converged:
            failures.append((at, "not as a clean converge", sorted(set(tree(sandbox, False).items()) ^ set(converged.items()))))
        role(sandbox, scenario, "absent")
        if tree(sandbox) != original:
            failures.append((at, "absent did not give the node back", sorted(set(tree(sandbox)) ^ set(original))))
    assert failures == [], "\n".join(repr(f) for f in failures)
