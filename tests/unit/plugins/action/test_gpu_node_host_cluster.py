# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The role's host step (gpu_node_host) and the playbooks' cluster step (gpu_cluster) as actions, on sandbox nodes.

The collection's own node-side modules (runtime_info, node_files) run in-process as Ansible would run them on the
node, against the sandbox tree; nothing else is faked. Covered: a node configured then left alone, check mode, a
refusal whose result holds the message and no internal state, and every argument refused by name."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_cluster, gpu_node_host
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as cluster_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import (
    RELEASE, cluster_plan, host_step, make, run_node_module)

TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
SHA_A = "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"  # SHA-256 of "a\n"


def test_a_node_is_configured_once_then_left_as_it_is(sandbox):
    sandbox.k3s("k3s", "package")
    first = host_step(sandbox)
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] and first["install_due"] is False and "nvidia-legacy" in first["handlers"]
    assert sandbox.exists(TEMPLATE) or any(f["action"] == "created" for f in first["files"])
    snapshot = sandbox.snapshot()
    second = host_step(sandbox)
    assert second["changed"] is False and sandbox.snapshot() == snapshot


def test_the_result_holds_the_settings_the_role_tasks_read(sandbox):
    # the role's task files read gpu_node__settings (gpu_node_result.settings): the user's values, else the spec's defaults
    sandbox.k3s("k3s", "package")
    # never gpu_node_proxy_env (issue 41: its password was in every result): the package step reads it itself
    expected = {"root": sandbox.root, "cdi_spec_path": "/etc/cdi/nvidia.yaml", "driver_reboot_timeout_seconds": 900,
                "mode": "host", "driver_install": False, "allocation": "device_plugin"}
    first = host_step(sandbox, gpu_node_cdi_spec_path="/etc/cdi/nvidia.yaml")
    assert not first.get("failed"), first.get("msg")
    assert first["settings"] == expected
    # the configure phase reads fewer of the role's variables: the settings are the same
    again = host_step(sandbox, {"phase": "configure", "node": first["node"]},
                      gpu_node_cdi_spec_path="/etc/cdi/nvidia.yaml")
    assert again["settings"] == expected


def test_an_empty_target_release_is_the_inventorys(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True, k3s_version="v1.33.10+k3s1")
    assert not result.get("failed"), result.get("msg")
    assert result["report"]["release"] == "%s -> v1.33.10+k3s1" % RELEASE


def test_check_mode_writes_nothing_and_says_what_it_would_write(sandbox):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = host_step(sandbox, check_mode=True)
    assert result["changed"] and result["files"] and sandbox.snapshot() == before


@pytest.mark.parametrize("check_mode, reason", [(True, "check mode"), (False, "gpu_node_root is a sandbox tree")])
def test_a_change_no_handler_can_restart_is_written_by_the_host_step_which_says_so(sandbox, check_mode, reason):
    """Where nothing can restart, the first task writes (or in check mode, would write) and prints the handler's line
    itself, once, and only when something changed; the role's configure task and its handler do not run."""
    sandbox.k3s("k3s", "package")
    line = "gpu1: the containerd configuration changed; restart k3s to apply it (%s)." % reason
    with mock.patch.object(gpu_node_host.display, "display") as shown:
        first = host_step(sandbox, check_mode=check_mode)
    assert first["changed"] and first["configure_due"] is False
    assert [c.args[0] for c in shown.call_args_list].count(line) == 1
    if not check_mode:
        with mock.patch.object(gpu_node_host.display, "display") as shown:
            second = host_step(sandbox)
        assert second["changed"] is False and line not in [c.args[0] for c in shown.call_args_list]


def test_a_host_without_a_gpu_says_so_on_its_own_result_and_prints_nothing(sandbox):
    """Issue 44: the line of a host without a GPU was printed on every run, apart from the host; AWX/AAP could not attach
    it. It is the host step's msg now (shown with -v and in the host's event), and nothing is printed."""
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with mock.patch.object(gpu_node_host.display, "display") as shown:
        result = host_step(sandbox, gpu_node_force=False)
    assert result["status"] == "skipped" and not result.get("changed") and sandbox.snapshot() == before
    assert result["msg"].startswith("gpu1: no NVIDIA GPU on the PCI bus and no NVIDIA driver loaded; nothing is changed")
    assert shown.call_args_list == []


@pytest.mark.parametrize("check_mode", [True, False])
def test_the_line_of_a_restart_left_to_the_user_is_on_the_host_result_too(sandbox, check_mode):
    sandbox.k3s("k3s", "package")
    with mock.patch.object(gpu_node_host.display, "display"):
        result = host_step(sandbox, check_mode=check_mode)
    assert result["changed"] and "restart k3s to apply it" in result["msg"], result.get("msg")


def test_a_change_that_can_be_restarted_is_written_by_the_configure_task(sandbox):
    """On a node k3s/rke2 can restart (here: restart.notified made true, the sandbox standing for /), the first task
    writes nothing and says configure_due; the configure phase then writes from that reading (its task notifies the
    handler); a second run decides nothing is due."""
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with mock.patch.object(restart, "notified", return_value=True):
        first = host_step(sandbox)
        assert not first.get("failed"), first.get("msg")
        assert first["configure_due"] is True and first["changed"] is False and "diff" not in first
        assert sandbox.snapshot() == before
        configured = host_step(sandbox, {"phase": "configure", "node": first["node"]})
        assert not configured.get("failed"), configured.get("msg")
        assert configured["changed"] and configured["configure_due"] is False and sandbox.snapshot() != before
        again = host_step(sandbox)
    assert again["changed"] is False and again["configure_due"] is False


@pytest.mark.parametrize("check_mode", [True, False])
def test_the_probe_writes_and_prints_nothing_and_puts_a_host_with_work_into_the_due_group(sandbox, check_mode):
    """site's first pass (issue 44): where the plan phase would write itself (a sandbox tree, check mode), the probe
    writes nothing, shows no diff and prints nothing; it says configure_due and adds the host to k3s_gpu_nvidia_due the
    way group_by's result does. The role's configure phase then writes from its reading; a probe after that finds
    nothing due and adds the host to no group."""
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with mock.patch.object(gpu_node_host.display, "display") as shown:
        probed = host_step(sandbox, {"phase": "probe"}, check_mode=check_mode)
    assert not probed.get("failed"), probed.get("msg")
    assert (probed["configure_due"], probed["changed"], probed["add_group"], probed["work_due"]) == (
        True, False, "k3s_gpu_nvidia_due", True)
    assert "diff" not in probed and shown.call_args_list == [] and sandbox.snapshot() == before
    if check_mode:
        return
    configured = host_step(sandbox, {"phase": "configure", "node": probed["node"]})
    assert configured["changed"] and sandbox.snapshot() != before
    again = host_step(sandbox, {"phase": "probe"})
    assert again["configure_due"] is False and "add_group" not in again and "work_due" not in again


def test_the_handler_that_cannot_restart_says_so_once_and_on_the_host_result(sandbox):
    """Under site the sandbox's files are written by the configure task (after the probe), and the handler runs: it
    prints the line of a restart left to the user once, and keeps it on the host's result as the host step did."""
    sandbox.k3s("k3s", "package")
    probed = host_step(sandbox, {"phase": "probe"})
    configured = host_step(sandbox, {"phase": "configure", "node": probed["node"]})
    line = "gpu1: the containerd configuration changed; restart k3s to apply it"
    with mock.patch.object(gpu_node_host.display, "display") as shown:
        handled = host_step(sandbox, {"phase": "restart"}, gpu_node_result=configured)
    assert [c.args[0] for c in shown.call_args_list if c.args[0].startswith(line)] and len(shown.call_args_list) == 1
    assert handled["changed"] is False and handled["host_changed"] is True and line in handled["msg"], handled


def test_the_probe_of_a_host_without_a_gpu_adds_it_to_no_group(sandbox):
    sandbox.k3s("k3s", "package")
    probed = host_step(sandbox, {"phase": "probe"}, gpu_node_force=False)
    assert probed["status"] == "skipped" and "add_group" not in probed and not probed.get("changed")


def test_a_refusal_is_one_message_and_no_internal_state(sandbox):
    sandbox.k3s("k3s", "package")
    # a template k3s cannot parse: an {{ end }} without its {{ if }}
    sandbox.write(TEMPLATE, '{{ template "base" . }}\n{{ end }}\n')
    before = sandbox.snapshot()
    result = host_step(sandbox)
    assert result["failed"] and result["msg"].startswith("gpu1: ") and TEMPLATE in result["msg"], result
    assert not [key for key in result if key.startswith("_")], sorted(result)
    assert len(json.dumps(result, default=str)) < 4000
    assert sandbox.snapshot() == before


def test_a_role_variable_of_the_wrong_type_is_refused_by_its_name(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, gpu_node_force="maybe")
    assert result["failed"] and "gpu_node_force" in result["msg"] and "Nothing was changed" in result["msg"]


@pytest.mark.parametrize("module,args,words", [
    (gpu_node_host, {"phase": "bogus"}, "value of phase must be one of: plan, probe, reread, configure, restart, upgrade_check, doctor, got: bogus"),
    (gpu_node_host, {"phase": "configure"}, "phase is configure but all of the following are missing: node"),
    (gpu_node_host, {"phase": "plan", "fail": "perhaps"}, "fail"),
    (gpu_node_host, {"phases": "plan"}, "Unsupported parameters"),
    (gpu_cluster, {"phase": "bogus"}, "value of phase must be one of: plan, read, apply, inspect, got: bogus"),
    (gpu_cluster, {"phase": "apply"}, "phase is apply but all of the following are missing: cluster"),
    (gpu_cluster, {"phase": "plan", "objects": ["gpu_operator", "runtimeclass"]}, "value of objects must be one or more of"),
])
def test_every_argument_is_checked_before_anything_runs(module, args, words):
    action = make(module, args)
    action._execute_module = mock.MagicMock(side_effect=AssertionError("nothing may run"))
    with pytest.raises(AnsibleActionFail, match=words.replace("(", r"\(").replace(")", r"\)")):
        action.run(task_vars={"inventory_hostname": "gpu1", "hostvars": {}})


def test_the_cluster_plan_names_the_writer_of_each_cluster():
    hostvars = {"gpu1": {}, "gpu2": {"k3s_gpu_cluster": "east"}, "server1": {}, "server2": {"k3s_gpu_cluster": "east"}}
    action = make(gpu_cluster, {"phase": "plan", "hosts": ["gpu1", "gpu2"], "pattern_hosts": ["gpu1", "gpu2"],
                                "servers": ["server1", "server2"]})
    result = action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts": ["gpu1", "gpu2"]})
    assert not result.get("failed"), result.get("msg")
    assert sorted((c["name"], c["writer"], c["complete"]) for c in result["clusters"]) == [
        ("default", "server1", True), ("east", "server2", True)]


def test_a_cluster_whose_manifests_are_as_they_would_be_written_gets_no_writer(sandbox):
    # one node that is its cluster's server and GPU node: the role's host step reads it (its manifests' digests too)
    sandbox.k3s("k3s", "package")
    node_vars = {"gpu_node_root": sandbox.root, "gpu_node_release": RELEASE}

    def read_node():
        result = host_step(sandbox)
        assert not result.get("failed"), result.get("msg")
        return {"gpu1": dict(node_vars, gpu_node_result=result)}

    first = cluster_plan(read_node())
    assert first["clusters"][0]["leader"] == "gpu1" and "result" not in first["clusters"][0]
    assert first["hosts"]["gpu1"]["writes"] and first["objects"] == list(cluster_step.OBJECTS)
    hostvars = read_node()
    written = make(gpu_cluster, {"cluster": first["clusters"][0]}).run(task_vars={"hostvars": hostvars})
    assert written["changed"] and [f["action"] for f in written["files"]] == ["created", "created"], written
    snapshot = sandbox.snapshot()
    # the next run: the reading shows the manifest as the cluster step would write it
    again = cluster_plan(read_node())
    entry = again["clusters"][0]
    assert entry["leader"] is None and not again["hosts"]["gpu1"]["writes"]
    assert entry["result"]["changed"] is False and entry["result"]["files"] == []
    assert entry["result"]["msg"] == written["msg"] and entry["result"]["device_plugin"] == written["device_plugin"]
    # the node's mode came from its host step's settings: the cluster step read no variable of the host for it
    nodes, _complete = cluster_step.node_reports(["gpu1"], hostvars.get, lambda host: pytest.fail("read %s's variables" % host))
    assert (nodes[0]["mode"], nodes[0]["driver_install"]) == ("host", False)
    assert again["msg"] == ["cluster default: unchanged on gpu1"] and sandbox.snapshot() == snapshot
    # the summary takes the plan's decision for it: the same row as a write that changed nothing
    rows = summary.summarize([], clusters=[entry["result"]])["clusters"]
    assert rows[0]["status"] == "done" and not rows[0]["changed"] and rows[0]["device_plugin"]
    # without the option, and once the manifest differs from what would be written, the writer writes as before
    assert cluster_plan(read_node(), skip_unchanged=False)["clusters"][0]["leader"] == "gpu1"
    manifest = "/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-device-plugin.yaml"
    sandbox.write(manifest, sandbox.read(manifest).decode() + "# edited\n", mode=0o600)
    assert cluster_plan(read_node())["clusters"][0]["leader"] == "gpu1"


def test_the_runtimeclasses_playbooks_reading_skips_a_cluster_whose_manifest_is_as_it_would_be_written(sandbox):
    # the runtimeclasses playbook: no role in the run, each host read by gpu_cluster's read phase (runtimeclasses__info)
    sandbox.k3s("k3s", "package")
    node_vars = {"gpu_node_root": sandbox.root, "gpu_node_release": RELEASE}

    def read_node():
        reading = make(gpu_cluster, {"phase": "read"}).run(task_vars=dict(node_vars, inventory_hostname="gpu1", hostvars={}))
        assert not reading.get("failed"), reading.get("msg")
        return {"gpu1": dict(node_vars, **{cluster_step.READING_VAR: reading})}

    def plan(hostvars):
        action = make(gpu_cluster, {"phase": "plan", "hosts": ["gpu1"], "pattern_hosts": ["gpu1"], "servers": ["gpu1"],
                                    "objects": [cluster_step.RUNTIMECLASSES], "skip_unchanged": True})
        result = action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts": ["gpu1"]})
        assert not result.get("failed"), result.get("msg")
        return result["clusters"][0]

    first = plan(read_node())
    assert first["leader"] == "gpu1" and "result" not in first  # no manifest yet: the writer writes it
    written = make(gpu_cluster, {"cluster": first, "objects": [cluster_step.RUNTIMECLASSES]}).run(
        task_vars={"hostvars": read_node()})
    assert written["changed"] and [f["action"] for f in written["files"]] == ["created"], written
    snapshot = sandbox.snapshot()
    again = plan(read_node())
    assert again["leader"] is None and again["result"]["changed"] is False and again["result"]["files"] == []
    assert again["result"]["msg"] == written["msg"] and sandbox.snapshot() == snapshot
    # the writer itself, given the cluster all the same (the gpu_operator playbook plans no skip): it reads the server
    # and runs no node_files where the reading shows the manifest as it would be written
    writer = make(gpu_cluster, {"cluster": first, "objects": [cluster_step.RUNTIMECLASSES]})
    ran = []
    writer._execute_module = lambda module_name, module_args, task_vars: ran.append(module_name) or run_node_module(
        module_name, module_args, False)
    unchanged = writer.run(task_vars={"hostvars": read_node()})
    assert ran == ["k3s_gpu.nvidia.runtime_info"] and not unchanged["changed"] and unchanged["files"] == []
    assert unchanged["msg"] == written["msg"] and sandbox.snapshot() == snapshot
    # a manifest that differs from what would be written gets its writer again
    manifest = "/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml"
    sandbox.write(manifest, sandbox.read(manifest).decode() + "# edited\n", mode=0o600)
    assert plan(read_node())["leader"] == "gpu1"


def test_a_cluster_write_that_fails_reports_the_message_not_the_decision(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/var/lib/rancher/k3s/server", "not a directory\n")  # the manifests directory cannot be made
    hostvars = {"gpu1": {"gpu_node_root": sandbox.root, "gpu_node_release": RELEASE, "gpu_node_result": host_step(sandbox)}}
    cluster = cluster_plan(hostvars, skip_unchanged=False)["clusters"][0]
    result = make(gpu_cluster, {"cluster": cluster}).run(task_vars={"hostvars": hostvars})
    assert result["failed"] and result["msg"].startswith("cluster default: writing on gpu1 failed: "), result
    assert result["changed"] is False and result["files"] == [] and result["cluster"] == "default"
    assert not set(result) & {"gpu_operator", "runtimeclasses", "device_plugin", "nodes"}, sorted(result)
    assert "content" not in json.dumps(result)
    row = summary.cluster_row(result)
    assert row["status"] == "failed" and row["cluster"] == "default" and "writing on gpu1 failed" in row["reason"]


@pytest.mark.parametrize("entry, seen, unchanged", [
    ({"state": "absent"}, {"state": "absent"}, True),
    ({"state": "absent"}, {"state": "file", "mode": "0600", "sha256": "x"}, False),
    ({"state": "file", "content": "a\n", "mode": "0600"}, {"state": "file", "mode": "0600", "sha256": SHA_A}, True),
    ({"state": "file", "content": "a\n", "mode": "0600"}, {"state": "file", "mode": "0644", "sha256": SHA_A}, False),
    ({"state": "file", "content": "b\n", "mode": "0600"}, {"state": "file", "mode": "0600", "sha256": SHA_A}, False),
    ({"state": "file", "content": "a\n", "mode": "0600"}, {"state": "file", "mode": "0600"}, False),  # too large to digest
    ({"state": "file", "content": "a\n", "mode": "0600"}, {"state": "link"}, False),
    ({"state": "file", "content": "a\n", "mode": "0600"}, None, False),  # not in the reading
])
def test_a_manifest_is_unchanged_only_when_the_reading_shows_what_would_be_written(entry, seen, unchanged):
    path = "/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml"
    manifests = {} if seen is None else {"k3s-gpu-nvidia-runtimeclasses.yaml": dict(seen, path=path)}
    assert cluster_step.unchanged_on_server([dict(entry, path="/srv/node" + path)], manifests) is unchanged
    # another server's directory (another data-dir) is not the file the reading saw
    assert not cluster_step.unchanged_on_server([dict(entry, path="/srv/node/elsewhere/k3s-gpu-nvidia-runtimeclasses.yaml")],
                                                manifests)


# ------------------------------------------------------------------ the error paths each action reports
def test_a_node_that_cannot_be_read_is_named_and_nothing_changes(sandbox):
    result = host_step(sandbox)  # an empty tree: neither k3s, rke2 nor containerd
    assert result["failed"] and result["msg"].startswith("gpu1: neither k3s, rke2 nor containerd was found under ")
    assert result["msg"].endswith("Nothing was changed.") and "gpu_node_distribution" in result["msg"], result["msg"]
    assert not [key for key in result if key.startswith("_")]


def test_the_doctor_phase_refuses_to_run_outside_check_mode(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, {"phase": "doctor"})
    assert result["failed"] and "phase doctor only reads: run it with check_mode: true" in result["msg"]


def test_the_upgrade_check_asks_for_its_target_release(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, {"phase": "upgrade_check"}, check_mode=True)
    assert result["failed"] and result["msg"].startswith("Set gpu_node_target_release to the k3s or rke2 release")


def test_the_cluster_step_refuses_bad_settings_by_name_before_any_host():
    hostvars = {"gpu1": {}, "server1": {}}
    action = make(gpu_cluster, {"phase": "plan", "hosts": ["gpu1"], "pattern_hosts": ["gpu1"], "servers": ["server1"]})
    result = action.run(task_vars={"hostvars": hostvars, "runtimeclasses_method": "api"})
    assert result["failed"] and result["msg"] == (
        "runtimeclasses_method is api but runtimeclasses_kubeconfig is not set; set it to the kubeconfig of the cluster, "
        "or use runtimeclasses_method=manifest. Nothing was changed.")


def test_the_cluster_step_without_a_server_says_so():
    action = make(gpu_cluster, {"phase": "plan", "hosts": ["gpu1"], "pattern_hosts": ["gpu1"], "servers": []})
    result = action.run(task_vars={"hostvars": {"gpu1": {}}})
    assert result["failed"] and "Nothing was changed." in result["msg"] and "k3s_gpu_servers" in result["msg"], result


def test_a_handler_the_role_wrote_as_a_dropin_before_the_first_start_gets_its_runtimeclass(sandbox):
    # a drop-in release, k3s never started: no config.toml whose imports the reading follows
    sandbox.k3s("k3s", "package")
    configured = host_step(sandbox, gpu_node_release="v1.33.10+k3s1")
    assert not configured.get("failed"), configured.get("msg")
    assert configured["written"] == ["nvidia-legacy"] and any("config-v3.toml.d/" in f["node_path"] for f in configured["files"])
    # the runtimeclasses playbook: its read phase on the node, then the cluster step's plan
    reading = make(gpu_cluster, {"phase": "read"}).run(task_vars={
        "inventory_hostname": "gpu1", "hostvars": {}, "gpu_node_root": sandbox.root, "gpu_node_release": "v1.33.10+k3s1"})
    assert reading["loaded_config"]["exists"] is False
    nodes, complete = cluster_step.node_reports(["gpu1"], {"gpu1": {cluster_step.READING_VAR: reading}}.get,
                                                lambda host: {"mode": "host", "driver_install": False})
    assert complete and nodes[0]["handlers"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    cluster = {"name": "default", "writer": "gpu1", "hosts": ["gpu1"], "complete": True}
    operator = role_vars.read({}, lambda value: value, cluster_step.OPERATOR_VARS)
    decided = cluster_step.decide(cluster, NodeFacts.from_reading(reading), nodes, cluster_step.read_settings({}), operator,
                                  (cluster_step.RUNTIMECLASSES,), sandbox.root)
    assert "nvidia-legacy" in decided["runtimeclasses"]["written"]


@pytest.mark.parametrize("role_vars_set, words", [
    # runtime_info's refusal (node side): the release the role's user sets is gpu_node_release
    ({"gpu_node_release": "", "gpu_node_root": None}, "set gpu_node_release"),
    # containerd_runtimes' refusal (the engine): the default runtime the role's user sets
    ({"gpu_node_default_runtime": "nvidia-experimental"}, "gpu_node_default_runtime nvidia-experimental is neither"),
    ({"gpu_node_newer_release": "refuse", "gpu_node_release": "v1.38.0+k3s1"},
     "set gpu_node_newer_release=assume_newest_known"),
])
def test_an_option_named_by_an_error_is_the_role_variable_the_user_sets(sandbox, role_vars_set, words):
    sandbox.k3s("k3s", "package")
    settings = dict((k, sandbox.root if v is None else v) for k, v in role_vars_set.items())
    result = host_step(sandbox, **settings)
    assert result["failed"] and words in result["msg"]
    # written once: no option name left where the role's variable is meant, no placeholder, no doubled full stop
    assert "{" not in result["msg"].replace("{{", "") and ".." not in result["msg"] and "pass release=" not in result["msg"]
    assert "node" not in result and not [key for key in result if key.startswith("_")]  # no internal state
