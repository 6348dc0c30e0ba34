# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The base of the collection's action plugins: arguments checked by the one spec the module file documents, and the
one failure boundary of every action.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

from typing import Any, Dict, Optional

from ansible.plugins.action import ActionBase

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, ended


class SpecAction(ActionBase):
    """run() validates the task's arguments against ARGUMENT_SPEC (and REQUIRED_IF), then hands them to
    run_validated().

    run() is also the failure boundary: a K3sGpuError raised anywhere below run_validated() becomes the task's failed
    result here, its message rendered once, so that no raise site and no phase renders one itself. The message ends
    with failure_ending (ended(): never a second ending): FAILURE_ENDING, unless a phase of the action declares its
    own by setting failure_ending when it begins. An action whose failed result holds more than failed, changed and msg
    overrides failed_result(); one that writes the error otherwise overrides failure_message()."""

    TRANSFERS_FILES = False
    ARGUMENT_SPEC = None
    REQUIRED_IF = None
    # the ending of a refusal's message, where the message does not say it already (None: the message as raised)
    FAILURE_ENDING: Optional[str] = None

    def run(self, tmp=None, task_vars=None):
        result = super(SpecAction, self).run(tmp, task_vars)
        del tmp
        args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC, required_if=self.REQUIRED_IF)[1]
        self.failure_ending = self.FAILURE_ENDING
        try:
            return self.run_validated(result, args, task_vars)
        except K3sGpuError as exc:
            return self.render_failure(result, exc)

    def run_validated(self, result, args, task_vars):
        raise NotImplementedError

    def render_failure(self, result: Dict[str, Any], exc: K3sGpuError) -> Dict[str, Any]:
        """The failure boundary: exc as the task's failed result, its message with the declared ending once."""
        message = self.failure_message(exc)
        if self.failure_ending:
            message = ended(message, self.failure_ending)
        return self.failed_result(result, message)

    def failure_message(self, exc: K3sGpuError) -> str:
        """The message of a refusal before its ending: the error's text."""
        return str(exc)

    def failed_result(self, result: Dict[str, Any], message: str) -> Dict[str, Any]:
        """The task's result for a refusal with this message."""
        result.update(failed=True, changed=False, msg=message)
        return result
