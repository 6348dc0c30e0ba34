# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper (not part of the collection): writes one JSON line per finished task with its
wall time, to the file named by TASK_TIMER_OUT."""

from __future__ import annotations

DOCUMENTATION = r"""
name: task_timer
type: aggregate
short_description: Record task wall times for the benchmarks
description: Writes one JSON line per task result (task name, host, seconds, changed) to E(TASK_TIMER_OUT).
requirements: [enable in ansible.cfg or ANSIBLE_CALLBACKS_ENABLED]
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase


# the callback header Ansible asks for, as in fleet/callback_plugins/fleet_events.py (another plugin directory) (docs/architecture-duplicates.md)
class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._start = None
        self._out = open(os.environ["TASK_TIMER_OUT"], "a")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start = time.perf_counter()

    def _record(self, result, status):
        self._out.write(json.dumps({"task": result._task.get_name(), "host": result._host.get_name(),
                                    "seconds": time.perf_counter() - self._start, "status": status,
                                    "changed": bool(result._result.get("changed"))}) + "\n")
        self._out.flush()

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "failed")
