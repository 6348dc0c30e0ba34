# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The action plugins' tests build their plugin here, as Ansible builds it for a task."""

from __future__ import annotations

from unittest import mock


def make_action(module, args, check_mode=False, diff=None):
    """module's ActionModule for a task with these args: mocks for the connection, the loader and the rest, a templar
    that returns its value as it is. diff: the task's diff flag (None leaves the mock's)."""
    task = mock.MagicMock()
    task.args = dict(args)
    task.async_val = 0
    task.check_mode = check_mode
    if diff is not None:
        task.diff = diff
    connection = mock.MagicMock()
    connection._shell.tmpdir = "/tmp/remote"
    templar = mock.MagicMock()
    templar.template.side_effect = lambda value: value
    return module.ActionModule(task, connection, mock.MagicMock(), mock.MagicMock(), templar, mock.MagicMock())
