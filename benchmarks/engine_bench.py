# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Engine cost per node: detect + plan + render + merge, with a 200-line user template and three
runtimes to write. Prints medians and the peak memory of one call (tracemalloc).

Run: benchmarks/run.sh engine   (or PYTHONPATH=.tmp/collections python benchmarks/engine_bench.py)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _check_cache as check_cache
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml_read as toml_read

RELEASE = "v1.31.6+k3s1"
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
TOOLKIT = "/opt/nvidia/toolkit"  # off the service PATH: k3s detects none, all three are ours


def user_template(lines=200):
    out = ["# site template", '{{ template "base" . }}', ""]
    index = 0
    while len(out) < lines - 4:
        out += ["# site runtime %d" % index,
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'site-%d']" % index,
                '  runtime_type = "io.containerd.runc.v2"',
                '  pod_annotations = ["io.site/%d"]' % index,
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'site-%d'.options]" % index,
                '  BinaryName = "/opt/site/bin/runtime-%d"' % index,
                "  SystemdCgroup = true",
                ""]
        index += 1
    out += ["{{ if .NodeConfig.AgentConfig.Snapshotter }}", "# snapshotter set", "{{ end }}"]
    return "\n".join(out[:lines]) + "\n"


def make_node(root, template_text):
    os.makedirs(root + TOOLKIT, exist_ok=True)
    for name in ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy"):
        path = root + TOOLKIT + "/" + name
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\n")
        os.chmod(path, 0o755)
    os.makedirs(os.path.dirname(root + TEMPLATE), exist_ok=True)
    with open(root + TEMPLATE, "w") as handle:
        handle.write(template_text)


def forget_memos():
    """Each host's task runs in a freshly forked Ansible worker: nothing memoised by an earlier call."""
    detect._FOLDERS.clear()
    template_check._DATA_TYPES.clear()
    toml_read._LINES.clear()
    toml._QUOTED.clear()


def one_node(root, cache_dir=None):
    forget_memos()
    # typed once, as _configure.run types the reading it gets
    facts = NodeFacts.from_reading(detect.gather(root, "k3s", RELEASE, toolkit_dirs=[TOOLKIT]))
    # cache_dir: the run-wide verdicts of the template check, as the action plugin shares them between hosts;
    # a new CheckCache per call is a new forked worker (nothing in memory, the verdict read from the file)
    rendered = engine.compute(facts, {}, check_cache=check_cache.CheckCache(cache_dir) if cache_dir else None)
    return rendered.plan, rendered.changes


def measure(label, root, iterations, cache_dir=None):
    one_node(root, cache_dir)  # warm imports (and, with cache_dir, the run's verdict of this template)
    times = []
    for _round in range(iterations):
        start = time.perf_counter()
        plan, file_changes = one_node(root, cache_dir)
        times.append((time.perf_counter() - start) * 1000)
    tracemalloc.start()
    one_node(root, cache_dir)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times.sort()
    print("%-42s median %6.2f ms  p90 %6.2f ms  min %6.2f ms  peak mem %5.0f KiB  (n=%d, written=%d, changed files=%d)" % (
        label, statistics.median(times), times[int(len(times) * 0.9)], times[0], peak / 1024, iterations,
        len(plan.write), len(file_changes)))
    return statistics.median(times)


def main():
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    lines = int(os.environ.get("ENGINE_TEMPLATE_LINES", "200"))
    root = tempfile.mkdtemp(prefix="k3s-gpu-bench-")
    try:
        template = user_template(lines)
        assert template.count("\n") == lines
        make_node(root, template)
        print("engine benchmark: k3s %s, %d-line user template, 3 runtimes to write; python %s" % (
            RELEASE, lines, sys.version.split()[0]))
        for label, cache_dir in (("cold", None), ("fleet", os.path.join(root, ".verdicts"))):
            # cold: the template's check computed on every node; fleet: the second and later hosts of a run
            # with the same template read its verdict from the run's shared directory
            with open(root + TEMPLATE, "w") as handle:
                handle.write(template)
            measure("%s: first run (blocks appended)" % label, root, iterations, cache_dir)
            _plan, file_changes = one_node(root)
            with open(root + TEMPLATE, "w") as handle:
                handle.write(file_changes[0].after)
            measure("%s: steady state (nothing to change)" % label, root, iterations, cache_dir)
            with open(root + TEMPLATE, "w") as handle:
                handle.write(file_changes[0].after.replace(TOOLKIT + "/nvidia-container-runtime.legacy", "/old/path"))
            measure("%s: update (one BinaryName in place)" % label, root, iterations, cache_dir)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
