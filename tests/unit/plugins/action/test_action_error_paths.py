# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every way the host step (gpu_node_host) and the cluster step (gpu_cluster) report a failure, each on a sandbox node:
the message names the host or cluster, the cause, the user's variable and what was (not) changed, the failed result
holds no internal state, and the node's files stay as they were. The modules these actions run on the node run in
this process (action_harness); only systemd, which a sandbox tree has not, answers from a recorded reply."""

from __future__ import annotations

import json
import os
import shutil
from unittest import mock

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_cluster, gpu_node_host
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import (
    RELEASE, cluster_plan, host_step, make, run_node_module)

DROPIN_RELEASE = "v1.33.10+k3s1"  # a release that writes a drop-in: no template of the user's is rendered
MISSING_ROOT = "/nonexistent/k3s-gpu-sandbox"


def refused(result, *words):
    """A failed result that is one message holding each of words, and no internal state."""
    assert result["failed"] and result["changed"] is False, result
    for word in words:
        assert word in result["msg"], result["msg"]
    assert "node" not in result and not [key for key in result if key.startswith("_")], sorted(result)
    return result["msg"]


# ---------------------------------------------------------------------------------------------- the host step
def test_a_host_state_that_is_not_the_host_steps_is_refused_before_the_node_is_read(sandbox):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = host_step(sandbox, {"phase": "configure", "node": {"plan": "mine"}})
    assert refused(result, "gpu1: the argument node holds no host state of the role's host step",
                   "gpu_node_result.node").endswith(". Nothing was changed.")
    assert sandbox.snapshot() == before


def test_a_plan_refusal_names_the_variable_and_changes_nothing(sandbox):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_device_plugin_config="big")
    assert refused(result, "gpu1: gpu_node_device_plugin_config is 'big', which is not a key of "
                   "gpu_node_device_plugin_configs").endswith("; add it there, or leave it empty for the cluster-wide "
                                                              "config. Nothing was changed.")
    assert sandbox.snapshot() == before


def test_the_configure_phase_refuses_the_node_labels_by_the_variable_before_writing(sandbox):
    sandbox.k3s("k3s", "package")
    planned = host_step(sandbox, check_mode=True)
    before = sandbox.snapshot()
    result = host_step(sandbox, {"phase": "configure", "node": planned["node"]}, gpu_node_device_plugin_config="big")
    assert refused(result, "gpu1: gpu_node_device_plugin_config is 'big'").endswith(". Nothing was changed.")
    assert sandbox.snapshot() == before


def test_a_runtime_entry_is_checked_by_the_modules_spec_under_the_role_variable(sandbox):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    unknown = host_step(sandbox, gpu_node_runtimes=[{"name": "nvidia", "binray": "/usr/bin/nvidia-container-runtime"}])
    # each by its index and key (issue 41), not in the words of Ansible's spec
    refused(unknown, "gpu1: ", "gpu_node_runtimes[0]: 'binray' is not a runtime setting (did you mean binary?)",
            "use name, binary, runtime_type, options, systemd_cgroup", "Nothing was changed.")
    nameless = host_step(sandbox, gpu_node_runtimes=[{"binary": "/usr/bin/nvidia-container-runtime"}])
    refused(nameless, "gpu_node_runtimes[0].name is missing; give each runtime a name")
    not_a_bool = host_step(sandbox, gpu_node_runtimes=[{"name": "nvidia", "systemd_cgroup": "maybe"}])
    refused(not_a_bool, "gpu_node_runtimes[0].systemd_cgroup: 'maybe' is not a boolean; set true or false")
    assert sandbox.snapshot() == before


def test_options_the_host_step_got_wrong_are_reported_as_its_defect(sandbox):
    # cannot happen from the user's variables (the tests above): the options the step builds are checked all the same
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    strict = dict(configure.SPEC, state=dict(type="str", choices=["gone"]))
    with mock.patch.object(configure, "SPEC", strict):
        result = host_step(sandbox)
    refused(result, "gpu1: the host step built options that containerd_runtimes refuses (", "value of state must be one of: gone, got: present",
            "a defect of k3s_gpu.nvidia, please report it. Nothing was changed.")
    assert sandbox.snapshot() == before


def test_a_reading_after_the_installs_that_fails_is_named(sandbox):
    sandbox.k3s("k3s", "package")
    planned = host_step(sandbox, check_mode=True)
    # between the two readings the node's k3s gave way to rke2: the second reading, for k3s, fails
    shutil.rmtree(sandbox.path("/var/lib/rancher/k3s"))
    sandbox.k3s("rke2", "package")
    result = host_step(sandbox, {"phase": "reread", "node": planned["node"]})
    refused(result, "gpu1: reading the node after the installs failed: k3s was asked for, but the node under %s has "
            "rke2" % sandbox.root)


def test_a_target_release_that_is_no_release_is_refused_on_a_node_without_a_template(sandbox):
    # a drop-in release and no template of the user's: nothing is rendered for the target, and yet it is refused by name
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_release=DROPIN_RELEASE, gpu_node_target_release="v1.34")
    refused(result, "gpu1: gpu_node_target_release: release 'v1.34' is not a k3s version", "; nothing was written")
    assert sandbox.snapshot() == before
    # the release the inventory asks for is the target where gpu_node_target_release is empty: refused the same way
    # (a plain containerd node of that inventory ignores it: the next test)
    from_inventory = host_step(sandbox, gpu_node_release=DROPIN_RELEASE, k3s_version="v1.34")
    refused(from_inventory, "gpu_node_target_release: release 'v1.34' is not a k3s version")
    assert sandbox.snapshot() == before


def test_a_plain_containerd_node_of_a_k3s_inventory_is_not_upgraded_by_the_inventorys_release(sandbox):
    sandbox.binary("/usr/bin/containerd")
    result = host_step(sandbox, check_mode=True, gpu_node_distribution="containerd", gpu_node_release="2.1.4",
                       k3s_version="v1.33.10+k3s1")
    assert not result.get("failed"), result.get("msg")
    assert result["upgrade_findings"] == []


def test_a_plain_containerd_node_names_the_release_variable_and_the_config_line(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    version = host_step(sandbox, gpu_node_distribution="containerd", gpu_node_release="two")
    refused(version, "gpu1: containerd version 'two' is not of the form 1.7.24 or v2.1.4; set gpu_node_release to the "
                     "version `containerd --version` prints on the node. Nothing was changed.")
    sandbox.write("/etc/containerd/config.toml", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n[plugins\n')
    before = sandbox.snapshot()
    broken = host_step(sandbox, gpu_node_distribution="containerd", gpu_node_release="2.1.4")
    refused(broken, "gpu1: /etc/containerd/config.toml: Expected ']' at the end of a table declaration (at line 3, "
                    "column 9) [toml_invalid]: containerd cannot load it either; fix that line; nothing was written")
    assert sandbox.snapshot() == before


def test_the_upgrade_check_refuses_a_target_release_in_the_role_variables_names(sandbox):
    sandbox.k3s("k3s", "package")
    bogus = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_release=DROPIN_RELEASE,
                      gpu_node_target_release="v1.34")
    # its ending once: the engine's "nothing was written", not also the action's "Nothing was changed." (issue 42)
    assert refused(bogus, "gpu1: gpu_node_target_release: release 'v1.34' is not a k3s version").endswith(
        "; nothing was written.")
    assert bogus["report"]["refused_now"].startswith("gpu_node_target_release: ")
    newer = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_target_release="v1.99.0+k3s1")
    message = refused(newer, "gpu_node_target_release: k3s v1.99.0+k3s1 belongs to release line 1.99",
                      "set gpu_node_newer_release=assume_newest_known",
                      "or set gpu_node_target_release to the closest known release")
    assert "set release" not in message and "newer_release=" not in message.replace("gpu_node_newer_release=", "")
    other = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_target_release="v1.33.10+rke2r1")
    refused(other, "gpu_node_target_release: release 'v1.33.10+rke2r1' is a rke2 release, but gpu_node_distribution is k3s")


def test_the_upgrade_check_says_when_the_node_has_no_template_to_render(sandbox):
    sandbox.k3s("k3s", "package")
    with mock.patch.object(gpu_node_host.display, "display") as shown:
        result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_release=DROPIN_RELEASE,
                           gpu_node_target_release="v1.34.6+k3s1")
        planned = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_target_release=DROPIN_RELEASE)
    assert not result.get("failed") and not planned.get("failed"), (result.get("msg"), planned.get("msg"))
    lines = [c.args[0] for c in shown.call_args_list]
    assert lines == ["gpu1: %s -> v1.34.6+k3s1: no containerd template on the node, nothing to render for the target "
                     "release" % DROPIN_RELEASE,
                     # a template release: the template the collection would write there is rendered
                     "gpu1: %s -> %s: the template renders and loads on the target release" % (RELEASE, DROPIN_RELEASE)]


def test_the_upgrade_check_fails_a_node_whose_target_release_reads_no_drop_in(sandbox):
    # the drop-in directory came in v1.33.10 and v1.34.6: v1.33.10 -> v1.34.5 is an upgrade that reads no drop-in
    sandbox.k3s("k3s", "package")
    configured = host_step(sandbox, gpu_node_release=DROPIN_RELEASE)
    assert configured["written"] == ["nvidia-legacy"] and not configured.get("failed"), configured.get("msg")
    before = sandbox.snapshot()
    result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_release=DROPIN_RELEASE,
                       gpu_node_target_release="v1.34.5+k3s1")
    dropin = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
    refused(result, "gpu1: %s: k3s v1.34.5+k3s1 does not import the drop-in directory, so the runtimes written here "
                    "(nvidia-legacy) are gone after the upgrade" % dropin, "[dropin_not_read]. Fix: run k3s_gpu.nvidia.site")
    assert [f["code"] for f in result["report"]["breaks_on_target"]] == ["dropin_not_read"]
    assert sandbox.snapshot() == before
    fine = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_release=DROPIN_RELEASE,
                     gpu_node_target_release="v1.34.6+k3s1")
    assert not fine.get("failed") and fine["report"]["breaks_on_target"] == [], fine.get("msg")


def test_the_upgrade_check_of_a_node_it_cannot_read_names_it(sandbox):
    result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_release="",
                       gpu_node_target_release=DROPIN_RELEASE)
    assert refused(result, "gpu1: neither k3s, rke2 nor containerd was found under %s" % sandbox.root,
                   "set gpu_node_distribution").endswith(". Nothing was checked.")


def test_the_upgrade_check_skips_a_plain_containerd_node(sandbox):
    sandbox.binary("/usr/bin/containerd")
    result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, gpu_node_distribution="containerd",
                       gpu_node_release="2.1.4", gpu_node_target_release=DROPIN_RELEASE)
    assert result["skipped"] and not result.get("failed")
    assert result["msg"] == "gpu1: containerd has no k3s/rke2 template to check"


def test_the_restart_handler_without_the_host_steps_state_restarts_nothing(sandbox):
    sandbox.k3s("k3s", "package")
    action = make(gpu_node_host, {"phase": "restart"})
    action._execute_module = mock.MagicMock(side_effect=AssertionError("nothing may run"))
    result = action.run(task_vars={"inventory_hostname": "gpu1", "gpu_node_root": sandbox.root,
                                   "gpu_node_result": {"changed": True}})
    refused(result, "gpu1: nothing to restart: gpu_node_result.node holds no host state of the role's host step")


def test_a_restart_that_systemd_refuses_is_named_with_its_message(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/etc/systemd/system/k3s.service", "[Service]\nExecStart=/usr/local/bin/k3s server\n")
    with mock.patch.object(restart, "notified", return_value=True):
        planned = host_step(sandbox)
        configured = host_step(sandbox, {"phase": "configure", "node": planned["node"]})
    assert configured["changed"] and not configured.get("failed"), configured.get("msg")
    asked = []

    def execute_module(module_name, module_args, task_vars):
        asked.append((module_name, module_args))
        if module_name == "ansible.builtin.systemd_service":  # the recorded reply of a unit systemd cannot restart
            return {"failed": True, "msg": "Unable to restart service k3s: Job for k3s.service failed"}
        return run_node_module(module_name, module_args, False)

    action = make(gpu_node_host, {"phase": "restart"})
    action._execute_module = execute_module
    with mock.patch.object(restart, "why_not", return_value=None):
        result = action.run(task_vars={"inventory_hostname": "gpu1", "gpu_node_root": sandbox.root,
                                       "gpu_node_release": RELEASE, "gpu_node_result": configured})
    assert result["failed"] and result["msg"] == (
        "gpu1: restarting k3s failed: Unable to restart service k3s: Job for k3s.service failed"), result["msg"]
    assert asked == [("ansible.builtin.systemd_service", {"name": "k3s", "state": "restarted"})]
    assert "node" not in result


# ---------------------------------------------------------------------------------------------- the cluster step
def written_cluster(sandbox):
    """(hostvars, cluster) of a one-node cluster whose host step ran."""
    sandbox.k3s("k3s", "package")
    hostvars = {"gpu1": {"gpu_node_root": sandbox.root, "gpu_node_release": RELEASE, "gpu_node_result": host_step(sandbox)}}
    return hostvars, cluster_plan(hostvars, skip_unchanged=False)["clusters"][0]


def test_the_read_phase_names_the_node_it_cannot_read(sandbox):
    result = make(gpu_cluster, {"phase": "read"}).run(task_vars={
        "inventory_hostname": "gpu1", "hostvars": {}, "gpu_node_root": sandbox.root})
    assert refused(result, "gpu1: neither k3s, rke2 nor containerd was found under %s" % sandbox.root).endswith(
        ". Nothing was changed.")


def test_a_cluster_whose_settings_the_cluster_step_refuses_is_named_and_nothing_is_written(sandbox):
    hostvars, cluster = written_cluster(sandbox)
    before = sandbox.snapshot()
    hostvars["gpu1"]["gpu_node_device_plugin_chart_version"] = "latest"
    result = make(gpu_cluster, {"cluster": cluster}).run(task_vars={"hostvars": hostvars})
    assert refused(result, "cluster default (written from gpu1): gpu_node_device_plugin_chart_version is 'latest'",
                   "use one of").endswith(". Nothing was changed.")
    assert sandbox.snapshot() == before


def test_a_server_the_cluster_step_cannot_read_is_named(sandbox):
    _hostvars, cluster = written_cluster(sandbox)
    # the writer without a reading of the role's in this run (the gpu_operator playbook): it is read now, and fails
    hostvars = {"gpu1": {"gpu_node_root": MISSING_ROOT, "gpu_node_release": RELEASE}}
    result = make(gpu_cluster, {"cluster": cluster}).run(task_vars={"hostvars": hostvars})
    refused(result, "cluster default: reading the server gpu1 failed: ", MISSING_ROOT, "Nothing was changed.")


def test_the_inspection_without_a_cluster_fails_where_nothing_advertises_a_gpu(sandbox):
    hostvars, cluster = written_cluster(sandbox)
    nothing = make(gpu_cluster, {"phase": "inspect", "cluster": cluster}).run(task_vars={"hostvars": hostvars})
    assert nothing["failed"] and set(nothing["manifests"].values()) == {None}
    assert "cluster default (gpu1): neither NVIDIA's device plugin nor the GPU Operator is deployed" in nothing["msg"][-1]
    make(gpu_cluster, {"cluster": cluster}).run(task_vars={"hostvars": hostvars})
    deployed = make(gpu_cluster, {"phase": "inspect", "cluster": cluster}).run(task_vars={"hostvars": hostvars})
    assert not deployed.get("failed"), deployed["msg"]
    assert any("k3s-gpu-nvidia-device-plugin.yaml - HelmChart nvidia-device-plugin" in line for line in deployed["msg"])
    assert deployed["not_checked"] and json.dumps(deployed).count(os.path.basename(sandbox.root)) == 0
