# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one error type: cause and fix written once, each option named as its reader sets it."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, clause

ROLE = {"release": "gpu_node_release", "distribution": "gpu_node_distribution"}


def test_an_option_is_written_once_and_named_for_each_reader():
    error = K3sGpuError("neither k3s nor rke2 was found under /srv", "set {distribution} and {release}",
                        ("distribution", "release"))
    assert str(error) == "neither k3s nor rke2 was found under /srv; set distribution and release"
    assert error.text(ROLE) == "neither k3s nor rke2 was found under /srv; set gpu_node_distribution and gpu_node_release"


def test_only_the_options_the_error_names_are_rendered():
    # a template's own braces stay as they are
    error = K3sGpuError('line 1: {{ template "base" . }} is missing; add it', variable=None)
    assert error.text(ROLE) == 'line 1: {{ template "base" . }} is missing; add it'


def test_a_module_result_carries_the_parts_across_the_wire():
    error = K3sGpuError("root is not /", "set {release}", "release")
    failed = {"failed": True, "msg": str(error), "error": error.as_dict()}
    assert K3sGpuError.from_result(failed).text(ROLE) == "root is not /; set gpu_node_release"
    # a module of Ansible's: its message, as a clause
    assert str(K3sGpuError.from_result({"failed": True, "msg": "Permission denied."})) == "Permission denied"
    assert str(K3sGpuError.from_result({"failed": True}, "slurp")) == "slurp failed without a message"


@pytest.mark.parametrize("text, expected", [("done.", "done"), ("done", "done"), ("wait...", "wait..."), (None, "")])
def test_a_clause_has_no_final_stop(text, expected):
    assert clause(text) == expected


def test_within_keeps_the_fix_and_the_variables():
    error = K3sGpuError("release 'x' is not a k3s version", "set {release}", "release").within("gpu1")
    assert error.text(ROLE) == "gpu1: release 'x' is not a k3s version; set gpu_node_release"
    assert isinstance(error, K3sGpuError) and error.variables == ("release",)
