# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every raise site passes the cause and the fix apart (issue 29): no fix glued to its cause with "; "."""

from __future__ import annotations

import ast
import pathlib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as dp
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as op
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _render as render

PLUGINS = pathlib.Path(__file__).resolve().parents[4] / "plugins"

# One text with "; " where what follows is not the fix: the message has no fix, and the "; " adds a second cause or
# only that nothing was written. Splitting them would change the text the user reads.
ONE_TEXT = {
    "cluster must be the runtime_info result of a k3s or rke2 server (distribution, release, paths); %s deploys a "
    "k3s/rke2 HelmChart": "no fix",
    "internal: overlapping edits of lines %d-%d and %d-%d; nothing was written": "no fix",
    "%s: composed with the base template, the config would not load (%s); nothing was written": "no fix",
}


def _one_text(call):
    """The literal (format) string of a K3sGpuError(...) that passes one text, else None."""
    if len(call.args) != 1 or call.keywords:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod):
        arg = arg.left
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def glued(source, name="<source>"):
    """(where, text) of each `raise K3sGpuError("cause; fix" [% args])` in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                and getattr(node.exc.func, "id", None) == "K3sGpuError"):
            continue
        text = _one_text(node.exc)
        if text is not None and "; " in text:
            found.append(("%s:%d" % (name, node.lineno), text))
    return found


def test_the_check_finds_a_fix_glued_to_its_cause():
    source = '''
def check(value, where):
    if value is None:
        raise K3sGpuError("%s is not set; set it" % where)
    if value == "":
        raise K3sGpuError("value is empty; give one")
    raise K3sGpuError("%s is not set" % where, fix="set it")
'''
    assert [text for _where, text in glued(source)] == ["%s is not set; set it", "value is empty; give one"]


def test_every_raise_site_passes_the_fix_apart():
    paths = sorted(PLUGINS.rglob("*.py"))
    assert len(paths) > 40, PLUGINS
    found = []
    for path in paths:
        found.extend(glued(path.read_text(encoding="utf-8"), str(path.relative_to(PLUGINS.parent))))
    glued_sites = ["%s: %r" % (where, text) for where, text in found if text not in ONE_TEXT]
    assert not glued_sites, "pass the fix apart: K3sGpuError(cause, fix=...):\n" + "\n".join(glued_sites)
    # the exceptions are still there (a reworded one leaves this list)
    assert set(ONE_TEXT) <= {text for _where, text in found}


def _refusal(call, *args, **kwargs):
    with pytest.raises(K3sGpuError) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert error.fix and str(error) == "%s; %s" % (error.cause, error.fix)
    return error


def test_the_cluster_step_names_the_kubeconfig():
    error = _refusal(step.read_settings, {"runtimeclasses_method": "api"})
    assert error.cause == "runtimeclasses_method is api but runtimeclasses_kubeconfig is not set"
    assert error.fix.startswith("set it to the kubeconfig of the cluster")
    assert error.variable == "runtimeclasses_kubeconfig"


def test_the_gpu_operator_names_the_mode():
    error = _refusal(op.plan_cluster, NodeFacts.from_reading(server_reading()), {}, [{"host": "gpu1", "mode": "both"}])
    assert error.cause == "nodes[0] (gpu1): gpu_node_mode is 'both'"
    assert (error.fix, error.variable) == ("use host or operator", "gpu_node_mode")


def test_the_device_plugin_names_its_runtime_class():
    error = _refusal(dp.choose_runtime_class, ["nvidia"], [], wanted="nvidia-gpu")
    assert error.cause.startswith("gpu_node_device_plugin_runtime_class is 'nvidia-gpu', but the cluster has no")
    assert error.fix.startswith("create it with the k3s_gpu.nvidia.runtimeclasses playbook")
    assert error.variable == "gpu_node_device_plugin_runtime_class"


def test_a_label_value_says_how_to_write_it():
    error = _refusal(k8s_labels.check_node_selector, {"nvidia.com/gpu.present": True})
    assert error.cause == "node_selector['nvidia.com/gpu.present'] must be a string, got bool True"
    assert error.fix.startswith("quote it in YAML")
    assert error.variable is None


def test_a_release_says_its_form():
    error = _refusal(distro.profile, "k3s", "1.33")
    assert error.cause == "release '1.33' is not a k3s version"
    assert error.fix == "expected the form v1.31.6+k3s1"


@pytest.mark.parametrize("labels, fix", [
    (["gpu=yes no"], "nothing was written"),  # the label's error has no fix of its own
])
def test_a_node_label_keeps_its_cause_apart(labels, fix):
    error = _refusal(render._checked_labels, labels)
    assert error.cause.startswith("node_labels['gpu']: label value 'yes no' is not valid")
    assert error.fix == fix
