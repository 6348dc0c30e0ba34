# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One failure boundary (issue 42): SpecAction.run turns a K3sGpuError raised anywhere below an action into the task's
failed result, its message rendered once with the ending the action (or its phase) declares. No action or wing catches
a K3sGpuError only to build a failed result itself: the catches left are listed here, each with its reason."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import NOTHING_CHANGED, K3sGpuError, ended
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_phases as cluster_phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _package_step as package_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_view as role_view
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import make_action
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.test_gpu_node_packages import FakeNode, run_action

ROOT = pathlib.Path(__file__).resolve().parents[4]
ACTIONS = sorted(p.stem for p in (ROOT / "plugins" / "action").glob("*.py") if p.stem != "__init__")
_ENDINGS = re.compile(r"(?i)\bnothing was (changed|written)\b")


def _action_modules():
    modules = [importlib.import_module("ansible_collections.k3s_gpu.nvidia.plugins.action." + name) for name in ACTIONS]
    return [m for m in modules if issubclass(m.ActionModule, SpecAction)]


def _refused(module, error):
    """module's action run with run_validated raising error."""
    action = make_action(module, {})
    action.validate_argument_spec = lambda **_kwargs: (None, {})

    def refuse(result, args, task_vars):
        raise error
    action.run_validated = refuse
    return action.run(task_vars={"inventory_hostname": "gpu1"})


def test_every_action_is_a_spec_action():
    assert [m.__name__.rsplit(".", 1)[-1] for m in _action_modules()] == ACTIONS


@pytest.mark.parametrize("module", _action_modules(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_a_refusal_is_one_failed_result_with_its_ending_once(module):
    ending = module.ActionModule.FAILURE_ENDING
    result = _refused(module, K3sGpuError("gpu1: the cause", fix="the fix"))
    assert result["failed"] is True and result["changed"] is False, result
    assert "gpu1: the cause" in result["msg"] and "the fix" in result["msg"], result["msg"]
    if ending:
        assert result["msg"] == ended("gpu1: the cause; the fix", ending)
    # a raise site whose fix already says that nothing was written gets no second ending
    said = _refused(module, K3sGpuError("gpu1: the cause", fix="the fix; nothing was written"))
    assert len(_ENDINGS.findall(said["msg"])) == 1, said["msg"]
    assert said["msg"].count("nothing was written") == 1, said["msg"]


def test_the_host_step_and_the_cluster_step_say_that_nothing_was_changed():
    for name in ("gpu_node_host", "gpu_cluster"):
        module = importlib.import_module("ansible_collections.k3s_gpu.nvidia.plugins.action." + name)
        assert module.ActionModule.FAILURE_ENDING == NOTHING_CHANGED, name
        assert _refused(module, K3sGpuError("cause", fix="fix"))["msg"] == "cause; fix. Nothing was changed."


def test_a_failed_module_of_the_package_step_names_the_host_the_module_and_its_subject():
    failure = package_step.StepFailed({"msg": "Request failed", "stderr": "timed out\n"}, "ansible.builtin.get_url",
                                      {"url": "http://alice:S3cr3t@proxy:3128/key"}, "gpu1")
    assert package_step.failure_message(failure) == (
        "gpu1: ansible.builtin.get_url (http://alice:********@proxy:3128/key) failed: Request failed timed out")
    assert package_step.failure_message(K3sGpuError("gpu1: the cause", "the fix")) == "gpu1: the cause; the fix"


def test_a_package_step_that_fails_after_a_change_reports_the_change():
    # the key and the repository are written, then apt fails: the undo leaves the key, and the result says changed
    node = FakeNode(check_mode=False, broken={"nvidia-container-toolkit"})
    result = run_action(node, {"source": "toolkit"})
    assert result["failed"] is True and result["changed"] is True, result
    assert result["msg"].startswith("gpu1: installing nvidia-container-toolkit=") and not _ENDINGS.search(result["msg"])


def test_the_role_view_is_what_the_cluster_step_reads():
    wanted = dict((name, inspect.signature(member)) for name, member in vars(cluster_phases.RoleView).items()
                  if inspect.isfunction(member) and not name.startswith("_"))
    assert wanted, "the cluster wing's RoleView declares no method"
    for name, signature in wanted.items():
        assert inspect.signature(getattr(role_view.RoleView, name)) == signature, name


# ---- the catches of K3sGpuError that are left: none of them renders a failed result ---------------------------------

# the directories of the controller's actions and the wings under them (the containerd engine's catches are its own)
SCANNED = ("plugins/action", "plugins/plugin_utils/role", "plugins/plugin_utils/cluster", "plugins/plugin_utils/diagnosis")
# "file:function" of each catch of K3sGpuError there, and why it is no failure boundary; a new one is added here with
# its reason, or raises to SpecAction.run instead
ALLOWED = {
    "plugins/plugin_utils/role/_role_var_checks.py:runtime_entries":
        "the engine's refusal as one refusal text in the role's variable names, collected with the other variables'",
    "plugins/plugin_utils/role/_role_var_checks.py:after_conversion":
        "the runtime name's refusal as one refusal text with the variable's hint, collected with the others",
    "plugins/plugin_utils/role/_role_var_checks.py:batch_size":
        "the batch size's refusal as one refusal text, collected with the other variables'",
    "plugins/plugin_utils/role/_host_step.py:device_plugin_labels": "raised again within the host (exc.within)",
    "plugins/plugin_utils/cluster/_runtimeclasses.py:_check_cluster": "raised again within cluster.release (exc.within)",
    "plugins/plugin_utils/cluster/_cluster_phases.py:_skip_if_unchanged":
        "a fallback: the plan leaves the cluster to its writer, whose own task reports the refusal",
    "plugins/plugin_utils/cluster/_cluster_phases.py:decide": "raised again within the cluster and its writer (exc.within)",
    "plugins/plugin_utils/diagnosis/_doctor_phase.py:diagnose":
        "a fallback: no labels; the doctor's plan refuses the same settings and reports that",
    "plugins/plugin_utils/diagnosis/_doctor_phase.py:_doctor_plan": "the role's refusal is a finding of the doctor's report",
    "plugins/plugin_utils/diagnosis/_rollout_plan.py:_cluster_nodes":
        "a fallback: a cluster the plan cannot read is batched without its Nodes, and the plan says so",
    "plugins/plugin_utils/diagnosis/_rollout_step.py:drain": "uncordons the node as it was, then raises the refusal again",
}
# what renders a failed result: the ending, the role's failed result, the boundary itself
_RENDERERS = ("ended", "failed", "render_failure", "failed_result")


def _catches(handler):
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(n, "id", getattr(n, "attr", None)) == "K3sGpuError" for n in names if n is not None)


def _renders_a_failure(handler):
    """Whether an except block builds a failed result: calls a renderer, or sets failed (failed=..., {"failed": ...})."""
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Call):
            if getattr(node.func, "id", getattr(node.func, "attr", None)) in _RENDERERS:
                return True
            if any(keyword.arg == "failed" for keyword in node.keywords):
                return True
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "failed" for k in node.keys):
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "failed":
            return True
    return False


def catches_of(source, name="<source>"):
    """[(file:function, renders a failure)] of each `except K3sGpuError` in the source."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.ExceptHandler) and _catches(child):
                found.append(("%s:%s" % (name, function), _renders_a_failure(child)))
            visit(child, function)
    visit(ast.parse(source), "<module>")
    return found


def test_the_check_finds_a_catch_that_renders_a_failure():
    source = '''
def boundary(result):
    try:
        work()
    except K3sGpuError as exc:
        result.update(failed=True, msg=ended(str(exc)))
        return result


def fallback():
    try:
        return work()
    except (KeyError, errors.K3sGpuError):
        return None


def other():
    try:
        work()
    except ValueError:
        return host_step.failed({}, "x")
'''
    assert catches_of(source) == [("<source>:boundary", True), ("<source>:fallback", False)]


def test_no_action_or_wing_catches_a_refusal_to_render_it():
    found = []
    for directory in SCANNED:
        for path in sorted((ROOT / directory).glob("*.py")):
            found.extend(catches_of(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()))
    rendering = [where for where, renders in found if renders]
    assert not rendering, "let the K3sGpuError reach SpecAction.run, the one failure boundary:\n" + "\n".join(rendering)
    sites = [where for where, _renders in found]
    assert len(sites) == len(set(sites)), sites
    unknown = sorted(set(sites) - set(ALLOWED))
    assert not unknown, "a new catch of K3sGpuError: raise to SpecAction.run, or add it to ALLOWED with its reason:\n" + (
        "\n".join(unknown))
    assert not set(ALLOWED) - set(sites), "gone from the code, take it out of ALLOWED: %s" % sorted(set(ALLOWED) - set(sites))
