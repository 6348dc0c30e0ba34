# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What k3s_gpu.nvidia.containerd_runtimes does, for every caller on the controller (its own action plugin and
the gpu_node role's host step), one step after the other, each returning a value the next one reads:

    read (_node_reading: a NodeFacts; one round trip, none when a fitting runtime_info result is handed over)
    -> decide (_decide: an EditPlan) -> render (_render: a Rendered, every file's new text, checked)
    -> write (_node_write: one k3s_gpu.nvidia.node_files execution, each file only if it is still the text the
       decision was made from)

PRIVATE to the collection. `execute_module(name, args)` runs a module on the host of the task."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Sequence

from ansible import constants as C
from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _check_cache as check_cache
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _decide as decide_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _render as render_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import FileChange, Rendered
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


# containerd_runtimes' options with the file options it passes on to node_files
SPEC = dict(CONTAINERD_RUNTIMES_SPEC)
SPEC.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in node_write.FILE_ARGS)

ExecuteModule = Callable[[str, Dict[str, Any]], Dict[str, Any]]


def run(result: Dict[str, Any], params: Mapping[str, Any], execute_module: ExecuteModule, want_diff: bool,
        own_files: bool = False, extra_changes: Sequence[FileChange] = (), write: bool = True) -> Dict[str, Any]:
    """Fill the task result of containerd_runtimes for params (validated by its argument spec).

    own_files (the gpu_node role): keep the bytes of a user's file before the first edit and put them back on state
    absent (_bookkeeping); extra_changes: more files of the role's, written in the same node_files execution.
    write=False decides only: result["write_due"] says whether node_files would run, and nothing is written."""
    binaries = sorted(set(r["binary"] for r in params["runtimes"] or [] if r.get("binary")))
    facts = node_reading.facts_for(result, params, execute_module, binaries)
    if facts is None:
        return result
    # hosts of one run share the template checks' verdicts (the run's local temporary directory)
    cache = check_cache.CheckCache(os.path.join(C.DEFAULT_LOCAL_TMP, "k3s-gpu-template-checks"))
    try:
        plan = decide_step.decide(facts, params, check_cache=cache)
        rendered = render_step.render(facts, plan, params, own_files=own_files, check_cache=cache,
                                      extra_changes=extra_changes)
    except K3sGpuError as exc:
        result.update(failed=True, msg=exc.text(), error=exc.as_dict(), changed=False)
        return result
    result.update(render_step.outcome(facts, rendered, own_files, want_diff))
    if rendered.warnings:
        result.setdefault("warnings", []).extend(rendered.warnings)  # after the reading's (newer_release) ones
    return node_write.write(result, facts, rendered, params, execute_module, own_files, write)


def compute(facts: NodeFacts, params: Mapping[str, Any], own_files: bool = False, check_cache: Any = None) -> Rendered:
    """decide, then render: every file's new text for params on the node the facts read, nothing written (the
    benchmarks, the tests and the upgrade check read it). Raises K3sGpuError."""
    plan = decide_step.decide(facts, params, check_cache=check_cache)
    return render_step.render(facts, plan, params, own_files=own_files, check_cache=check_cache)
