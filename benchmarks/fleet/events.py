# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the events file of one playbook run (callback_plugins/fleet_events.py): what each task cost
and what ran on each host."""

from __future__ import annotations

import dataclasses
import json
import re

RAN = ("ok", "changed", "failed", "ignored")  # the task did its work on the host (not skipped)
# the part of a task path that names the collection checkout, whatever directory it lies in
_CHECKOUT_PREFIX = re.compile(r"^.*/ansible_collections/k3s_gpu/nvidia/")
_ROLE_PREFIX = re.compile(r"^[\w.]+ : ")  # "k3s_gpu.nvidia.gpu_node : Detect the node"


def task_location(path, repo_root):
    """A task's file:line relative to the collection (never a path of this machine)."""
    path, root = path or "", repo_root.rstrip("/") + "/"
    if _CHECKOUT_PREFIX.match(path):
        return _CHECKOUT_PREFIX.sub("", path)
    return path[len(root):] if path.startswith(root) else path


@dataclasses.dataclass
class TaskCost:
    """One task of the run (tasks at the same file:line, e.g. one file included for two groups of
    hosts, are added together)."""
    location: str
    name: str  # without the role prefix (the location names the role)
    action: str
    play: str
    ran: int = 0  # hosts it ran on
    skipped: int = 0
    changed: int = 0
    modules: int = 0  # module executions, on all hosts together
    module_names: set = dataclasses.field(default_factory=set)  # which modules those were
    connection_ops: int = 0  # commands and file transfers, on all hosts together
    wall_seconds: float = 0.0  # from the task's start to its last host's result
    host_seconds: float = 0.0  # time spent in the workers of the hosts it ran on, added up


@dataclasses.dataclass
class HostWork:
    dispatched: int = 0  # tasks sent to a worker for this host (each one a fork), skipped or not
    skipped: int = 0
    module_tasks: int = 0  # tasks that ran at least one module on the host
    controller_tasks: int = 0  # tasks that ran without a module (set_fact, debug, assert, include_tasks)
    modules: int = 0  # module executions (an action plugin may run several per task)
    connection_ops: int = 0
    worker_seconds: float = 0.0


@dataclasses.dataclass
class RunEvents:
    tasks: list  # TaskCost, in the order they started
    hosts: dict  # host name -> HostWork
    playbook_start: float  # time.monotonic() when the first playbook started (interpreter and CLI ready)
    changed: int  # host results with changed=true
    failed: int  # failed or unreachable host results
    main_cpu: float = 0.0  # CPU seconds of ansible-playbook's main process (strategy, results, callbacks)
    worker_cpu: float = 0.0  # CPU seconds of the workers themselves, added up (action plugins, connection)
    module_cpu: float = 0.0  # CPU seconds of the processes the workers waited for (modules), added up
    children_cpu: float = 0.0  # CPU seconds of all reaped workers (fork to exit) and their modules, added up


def read_events(path, repo_root):
    starts, results, workers, playbook_start = {}, [], {}, None
    main_cpu = children_cpu = 0.0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            kind = event["event"]
            if kind == "task_start":
                starts.setdefault(event["task"], event)  # a task started twice keeps its first start
            elif kind == "result":
                results.append(event)
            elif kind == "worker":
                workers[(event["task"], event["host"])] = event
            elif kind == "playbook_start" and playbook_start is None:
                playbook_start = event["t"]
            elif kind == "playbook_end":
                main_cpu = max(main_cpu, event.get("main_cpu") or 0.0)
                children_cpu = max(children_cpu, event.get("children_cpu") or 0.0)

    tasks, hosts, last_result = {}, {}, {}
    changed = failed = 0
    for result in results:
        uuid, host, status = result["task"], result["host"], result["status"]
        last_result[uuid] = max(last_result.get(uuid, 0.0), result["t"])
        start = starts.get(uuid, {"name": "?", "action": "?", "path": "", "play": "?"})
        location = task_location(start["path"], repo_root)
        task = tasks.setdefault(location, TaskCost(location, _ROLE_PREFIX.sub("", start["name"]), start["action"], start["play"]))
        work = hosts.setdefault(host, HostWork())
        worker = workers.get((uuid, host), {"seconds": 0.0, "modules": [], "commands": 0, "transfers": 0})
        work.dispatched += 1
        if status in RAN:
            modules, ops = len(worker["modules"]), worker["commands"] + worker["transfers"]
            task.ran += 1
            task.modules += modules
            task.module_names.update(worker["modules"])
            task.connection_ops += ops
            task.host_seconds += worker["seconds"]
            work.modules += modules
            work.connection_ops += ops
            if modules:
                work.module_tasks += 1
            else:
                work.controller_tasks += 1
        else:
            task.skipped += 1
            work.skipped += 1
        work.worker_seconds += worker["seconds"]
        changed += status == "changed"
        task.changed += status == "changed"
        failed += status in ("failed", "unreachable")

    for uuid, start in starts.items():
        if uuid in last_result:
            tasks[task_location(start["path"], repo_root)].wall_seconds += last_result[uuid] - start["t"]
    order = {}
    for start in sorted(starts.values(), key=lambda event: event["t"]):
        order.setdefault(task_location(start["path"], repo_root), len(order))
    ordered = sorted(tasks.values(), key=lambda task: order.get(task.location, len(order)))
    return RunEvents(ordered, hosts, playbook_start, changed, failed, main_cpu,
                     sum(w.get("cpu_self") or 0.0 for w in workers.values()),
                     sum(w.get("cpu_children") or 0.0 for w in workers.values()), children_cpu)
