# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper (not part of the collection): one JSON line per playbook event, to the file
named by FLEET_EVENTS_OUT, for benchmarks/fleet (see benchmarks/fleet/README.md).

Besides task starts and per-host results (seen in the controller's main process), it counts what each
worker process really did for its host and task: module executions (also those an action plugin
runs internally, e.g. ansible.builtin.copy's stat and file, or containerd_runtimes' runtime_info) and
connection operations (commands and file transfers, each a round trip over ssh). Callbacks cannot see
those, so the callback wraps three ActionBase methods and TaskExecutor.run when it is loaded: workers
are forked from the main process after the callbacks are loaded, and inherit the wrapped methods."""

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_events
type: aggregate
short_description: Record task and per-host events for the fleet benchmark
description:
  - Writes one JSON line per task start, per host result and per worker (module executions, connection operations,
    seconds spent) to E(FLEET_EVENTS_OUT).
requirements: [enable in ansible.cfg or ANSIBLE_CALLBACKS_ENABLED]
"""

import json
import os
import time

from ansible.executor.task_executor import TaskExecutor
from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

# The events file, opened once in the main process with O_APPEND: forked workers inherit the
# descriptor, and each event is one os.write() of one line, so lines from parallel workers never interleave.
_events_fd = None
# What the current worker process is doing (a worker runs one task on one host, then exits).
_worker = {}


def _emit(event):
    if _events_fd is not None:
        event["t"] = time.monotonic()  # CLOCK_MONOTONIC: comparable between processes and with the harness
        os.write(_events_fd, (json.dumps(event) + "\n").encode())


def _counting(method, counter):
    def wrapper(self, *args, **kwargs):
        if _worker:
            if counter == "modules":
                _worker["modules"].append(kwargs.get("module_name") or (args[0] if args else None) or self._task.action)
            else:
                _worker[counter] += 1
        return method(self, *args, **kwargs)
    wrapper.__wrapped__ = method
    return wrapper


def _timed_worker_run(run):
    def wrapper(self):
        _worker.clear()
        _worker.update(task=self._task._uuid, host=self._host.get_name(), modules=[], commands=0, transfers=0)
        start, cpu = time.monotonic(), os.times()
        try:
            return run(self)
        finally:
            end = os.times()
            # CPU of this worker itself (the action plugin, the connection) and of the processes it waited for (the
            # module's interpreter with the local connection)
            _emit({"event": "worker", "task": _worker["task"], "host": _worker["host"],
                   "seconds": time.monotonic() - start, "modules": _worker["modules"],
                   "commands": _worker["commands"], "transfers": _worker["transfers"],
                   "cpu_self": end.user + end.system - cpu.user - cpu.system,
                   "cpu_children": end.children_user + end.children_system - cpu.children_user - cpu.children_system})
            _worker.clear()
    wrapper.__wrapped__ = run
    return wrapper


def _install_counters():
    if hasattr(TaskExecutor.run, "__wrapped__"):
        return  # already installed (the plugin loaded twice in one process)
    TaskExecutor.run = _timed_worker_run(TaskExecutor.run)
    ActionBase._execute_module = _counting(ActionBase._execute_module, "modules")
    ActionBase._low_level_execute_command = _counting(ActionBase._low_level_execute_command, "commands")
    ActionBase._transfer_file = _counting(ActionBase._transfer_file, "transfers")


def _task_and_host(result):
    # ansible-core 2.19 names them task/host; older releases only _task/_host
    return getattr(result, "task", None) or result._task, getattr(result, "host", None) or result._host


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "fleet_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._play = None
        global _events_fd
        path = os.environ.get("FLEET_EVENTS_OUT")
        if path and _events_fd is None:
            _events_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            _install_counters()

    def v2_playbook_on_start(self, playbook):
        _emit({"event": "playbook_start"})

    def v2_playbook_on_play_start(self, play):
        self._play = play.get_name()
        _emit({"event": "play_start", "play": self._play})

    def _task_start(self, task, handler=False):
        _emit({"event": "task_start", "task": task._uuid, "name": task.get_name(), "action": task.action,
               "path": task.get_path(), "play": self._play, "handler": handler})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_start(task, handler=True)

    def _result(self, result, status):
        task, host = _task_and_host(result)
        _emit({"event": "result", "task": task._uuid, "host": host.get_name(), "status": status})

    def v2_runner_on_ok(self, result):
        outcome = result.result if hasattr(result, "result") else result._result
        self._result(result, "changed" if outcome.get("changed") else "ok")

    def v2_runner_on_skipped(self, result):
        self._result(result, "skipped")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result):
        self._result(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        # the controller's main process (strategy, result handling, callbacks): its own CPU since it started
        times = os.times()
        # and of every worker it reaped with the processes they reaped (all of a worker's life, fork to exit)
        _emit({"event": "playbook_end", "main_cpu": times.user + times.system,
               "children_cpu": times.children_user + times.children_system})
