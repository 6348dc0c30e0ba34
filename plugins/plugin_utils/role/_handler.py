# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's handler: restart the service once after a change to a file it reads at start, verify it, and
roll back (and fail the host) when it is not healthy (role/_restart holds the rules; this is their I/O).

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import time

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_phases as phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart

# gpu_node_result's keys that belong to the task that registered it, not to the result
TASK_KEYS = ("changed", "failed", "msg", "warnings", "deprecations", "diff", "skipped", "invocation")


def restart_verified(task, result, settings, task_vars):
    """The handler: restart the service once after a change to a file it reads at start, verify it, and roll back
    (and fail the host) when it is not healthy. Returns gpu_node_result with restarted and verified."""
    node = task.template(task_vars.get("gpu_node_result") or {})
    result.update((k, v) for k, v in node.items() if k not in TASK_KEYS and not k.startswith("_ansible"))
    # what the host step changed, for the summary: this task's own `changed` is the restart only
    result["host_changed"] = bool(node.get("host_changed", node.get("changed")))
    state = host_state.HostState.from_result(node.get("node"), "%s: nothing to restart: gpu_node_result.node" % task.host)
    facts, changes = state.facts, state.changes or host_state.Changes()
    units = facts.units
    reason = restart.why_not(bool(task.check_mode), settings["restart"], state.plan.live, units)
    if reason:
        line = restart.not_restarted(task.host, units[0] if units else facts.distribution, reason)
        task.display.display(line)  # it asks for an action; on the host's own result too, as the host step's
        result["msg"] = " ".join(filter(None, [node.get("msg"), line]))
        result["changed"] = False
        return result
    unit = units[0]

    def systemd(state=None):
        args = {"name": unit}
        if state:
            args["state"] = state
        return task.execute_module("ansible.builtin.systemd_service", args)

    restarted = systemd("restarted")
    if restarted.get("failed"):
        return host_step.failed(result, "%s: restarting %s failed: %s" % (task.host, unit, restarted.get("msg")))
    result["changed"] = True
    timeout, settle = settings["restart_timeout_seconds"], settings["restart_settle_seconds"]
    first = restart.unit_state(systemd().get("status"))
    for _attempt in range(max(1, -(-int(timeout) // 2))):  # every 2 s, at least once: 1 s still waits
        if first[0] == "active":
            break
        time.sleep(2)
        first = restart.unit_state(systemd().get("status"))
    if first[0] == "active":
        time.sleep(settle)  # longer than the unit's restart delay: a crash loop shows as a restart
    second = restart.unit_state(systemd().get("status"))
    after = phases.read_node(task.execute_module, settings, facts.distribution, facts.release)
    found = restart.problems(unit, first, second, changes.handlers, after.get("loaded_config"), timeout, settle)
    result.update(restarted=True, verified=not found)
    if found:
        roll_back(task, result, changes, unit, found)
    return result


def roll_back(task, result, changes, unit, found):
    journal = task.execute_module("ansible.builtin.command", {"argv": [
        "journalctl", "--unit", unit, "--lines", str(restart.JOURNAL_LINES), "--no-pager", "--output", "cat"]})
    created, restored = restart.rollback(changes.files)
    undone = []
    for path in created:
        undone.append((path, task.execute_module("ansible.builtin.file", {"path": path, "state": "absent"})))
    for backup, path in restored:
        copied = task.execute_module("ansible.builtin.copy", {"src": backup, "dest": path, "remote_src": True,
                                                              "mode": "preserve"})
        undone.append((path, copied))
    rewrites = restart.rewritten(changes.files)
    if rewrites:
        # the text the run read, written back by the collection's own writer (the copy module alone takes no
        # `content`: that is its action plugin's work)
        undone.append((", ".join(path for _text, path in rewrites), task.execute_module("k3s_gpu.nvidia.node_files", {
            "files": [{"path": path, "state": "file", "content": text} for text, path in rewrites]})))
    task.execute_module("ansible.builtin.systemd_service", {"name": unit, "state": "restarted"})
    message = restart.failure(task.host, found, unit, journal.get("stdout_lines") or [])
    not_undone = ["%s (%s)" % (path, outcome.get("msg")) for path, outcome in undone if outcome.get("failed")]
    if not_undone:
        message += " Could NOT put back: %s; restore them by hand." % "; ".join(not_undone)
    host_step.failed(result, message)
    result["changed"] = True
