# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The base of the collection's action plugins: arguments checked by the one spec the module file documents.

PRIVATE to the collection. Controller side.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class SpecAction(ActionBase):
    """run() validates the task's arguments against ARGUMENT_SPEC (and REQUIRED_IF), then hands them to
    run_validated()."""

    TRANSFERS_FILES = False
    ARGUMENT_SPEC = None
    REQUIRED_IF = None

    def run(self, tmp=None, task_vars=None):
        result = super(SpecAction, self).run(tmp, task_vars)
        del tmp
        args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC, required_if=self.REQUIRED_IF)[1]
        return self.run_validated(result, args, task_vars)

    def run_validated(self, result, args, task_vars):
        raise NotImplementedError
