# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One host's data through containerd_runtimes' run (_configure.run on a sandbox node with a user's template): which
of the collection's files it passes through, in order. A "stay" is a run of calls inside one file; a "return" is a
stay in a file the run had already left. The fewer of both, the more the engine reads as read -> decide -> render ->
write (issue 42 measures the renovation with it).

Only the controller's engine (plugin_utils) counts, and only the calls at most --levels (default 2) below run: the
route the orchestration takes, not every helper a step uses (--levels=0: every call).

--steps: the run's own calls in order (read, decide, render, write), each with the files visited below it;
--values-apart: calls into containerd/_types.py (the frozen values the steps hand each other: their constructors
and properties) are not counted as stays.

Run: PYTHONPATH=.tmp/collections python benchmarks/engine_trace.py [--levels=N] [--stays] [--steps] [--values-apart]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from ansible_collections.k3s_gpu.nvidia.plugins.modules import node_files, runtime_info
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure

RELEASE = "v1.31.6+k3s1"
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
USER_TEMPLATE = ('# site template\n{{ template "base" . }}\n\n'
                 "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'runsc']\n"
                 '  runtime_type = "io.containerd.runsc.v1"\n')
BINARIES = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy")
MARK = os.sep + os.path.join("k3s_gpu", "nvidia", "plugins") + os.sep
CONTROLLER = "plugin_utils" + os.sep  # the controller's engine: where the route is to read as read -> decide -> write


def make_node(root):
    for name in BINARIES:
        path = root + "/usr/bin/" + name
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\nexit 0\n")
        os.chmod(path, 0o755)
    os.makedirs(os.path.dirname(root + TEMPLATE))
    with open(root + TEMPLATE, "w") as handle:
        handle.write(USER_TEMPLATE)


def run_module(module, args):
    """A node module in this process (the trace follows the controller; the module's own files count as one stay)."""
    import contextlib
    import io
    import json
    from ansible.module_utils.testing import patch_module_args
    out = io.StringIO()
    with patch_module_args(dict(args, _ansible_check_mode=False)), contextlib.redirect_stdout(out):
        try:
            module.main()
        except SystemExit:
            pass
    return json.loads(out.getvalue())


def _depth(frame):
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def trace(root):
    """Every call into the controller's engine during containerd_runtimes' run: (depth below run, file)."""
    modules = {"k3s_gpu.nvidia.runtime_info": runtime_info, "k3s_gpu.nvidia.node_files": node_files}
    params = dict((key, spec.get("default")) for key, spec in configure.SPEC.items())
    params.update(root=root, release=RELEASE, distribution="k3s", default_runtime="nvidia-legacy")
    calls = []
    top = _depth(sys._getframe()) + 1  # run's own frame

    def profile(frame, event, _arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if MARK not in path:
            return
        name = path.split(MARK, 1)[1]
        if not name.startswith(CONTROLLER):
            return  # the node side (modules, module_utils) and its helpers are not the engine's route
        calls.append((_depth(frame) - top, name))

    sys.setprofile(profile)
    try:
        result = configure.run({}, params, lambda name, args: run_module(modules[name], args), want_diff=False)
    finally:
        sys.setprofile(None)
    assert not result.get("failed"), result.get("msg")
    return calls


# the values the steps hand each other (frozen dataclasses): reading a value's property is not a stay in a step
VALUES = CONTROLLER + "containerd/_types.py"


def stays_of(calls, levels, values_apart):
    stays = []
    for depth, name in calls:
        if (levels and depth > levels) or (values_apart and name == VALUES):
            continue
        if not stays or stays[-1] != name:
            stays.append(name)
    return stays


def returns_of(stays):
    seen, returns = set(), 0
    for index, name in enumerate(stays):
        if name in seen and stays[index - 1] != name:
            returns += 1
        seen.add(name)
    return returns


def steps_of(calls, values_apart):
    """The run's steps (the file of each call run makes itself) in order, each with the files visited under it."""
    steps = []
    for depth, name in calls:
        if values_apart and name == VALUES:
            continue
        if depth <= 1 and (not steps or steps[-1][0] != name):
            steps.append((name, []))
        elif depth > 1 and steps and name not in steps[-1][1] and name != steps[-1][0]:
            steps[-1][1].append(name)
    return steps


def main():
    root = tempfile.mkdtemp(prefix="k3s-gpu-trace-")
    try:
        make_node(root)
        calls = trace(root)
    finally:
        shutil.rmtree(root)
    levels = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--levels=")), "2"))
    values_apart = "--values-apart" in sys.argv
    stays = stays_of(calls, levels, values_apart)
    print("stays: %d in %d files, returns to a file already left: %d" % (len(stays), len(set(stays)), returns_of(stays)))
    if "--stays" in sys.argv:
        print(" -> ".join(stays))
    if "--steps" in sys.argv:
        for step, below in steps_of(calls, values_apart):
            print("%s%s" % (step, (": " + ", ".join(below)) if below else ""))


if __name__ == "__main__":
    main()
