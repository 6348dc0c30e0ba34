# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What k3s_gpu.nvidia.containerd_runtimes does, for every caller on the controller (its own action plugin and
the gpu_node role's host step), one step after the other: the facts (_node_reading: one round trip, none when a
fitting runtime_info result is handed over), the plan and the file changes (_changes), the write (_node_write: one
k3s_gpu.nvidia.node_files execution, each file only if it is still the text the decision was made from), then the
task's result.

PRIVATE to the collection. `execute_module(name, args)` runs a module on the host of the task."""

from __future__ import annotations

import os

from ansible import constants as C
from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _changes as changes_engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _check_cache as check_cache
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


# containerd_runtimes' options with the file options it passes on to node_files
SPEC = dict(CONTAINERD_RUNTIMES_SPEC)
SPEC.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in node_write.FILE_ARGS)


def run(result, params, execute_module, want_diff, own_files=False, extra_changes=(), write=True):
    """Fill the task result of containerd_runtimes for params (validated by its argument spec).

    own_files (the gpu_node role): keep the bytes of a user's file before the first edit and put them back on state
    absent (_changes.role_bookkeeping); extra_changes: more files of the role's, written in the same node_files execution.
    write=False decides only: result["write_due"] says whether node_files would run, and nothing is written."""
    binaries = sorted(set(r["binary"] for r in params["runtimes"] or [] if r.get("binary")))
    facts = node_reading.facts_for(result, params, execute_module, binaries)
    if facts is None:
        return result
    # hosts of one run share the template checks' verdicts (the run's local temporary directory)
    cache = check_cache.CheckCache(os.path.join(C.DEFAULT_LOCAL_TMP, "k3s-gpu-template-checks"))
    try:
        plan, changes = changes_engine.compute(facts, params, own_files=own_files, check_cache=cache)
    except K3sGpuError as exc:
        result.update(failed=True, msg=exc.text(), error=exc.as_dict(), changed=False)
        return result
    result.update(changes_engine.result_fields(facts, plan))
    changes = changes + list(extra_changes)
    if own_files:
        # user files put back to their bytes before the first edit, and those changed since the collection last
        # wrote them (only its tables taken out)
        result.update(restored=plan.get("restored") or [], changed_since_written=plan.get("changed_since_written") or [])
    if plan.get("warnings"):
        result.setdefault("warnings", []).extend(plan["warnings"])  # after the reading's (newer_release) ones
    result["changed"] = bool(changes)
    result["files"] = [{"path": c["path"], "node_path": c["node_path"], "backup_file": None,
                        "action": "removed" if c["after"] is None else "updated" if c["exists"] else "created"}
                       for c in changes]
    if want_diff and changes:
        result["diff"] = [dict(before=c["before"] or "", after=c["after"] or "", before_header=c["path"],
                               after_header=c["path"]) for c in changes]
    return node_write.write(result, facts, plan, changes, params, execute_module, own_files, write)
