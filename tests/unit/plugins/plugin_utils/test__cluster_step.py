# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The cluster step: which clusters a run touches and who writes, what the nodes report, and the files of a cluster
(a partial run only adds)."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

CLUSTERS = {"gpu1": "a", "gpu2": "a", "server1": "a", "gpu3": "b", "server2": "b", "server3": "b"}
SETTINGS = step.read_settings({})
OPERATOR = {"operator_state": "present", "operator_chart_version": "", "operator_chart_repo": "", "operator_chart_archive": "",
            "operator_namespace": "gpu-operator", "operator_cdi": None, "operator_driver": "auto", "operator_toolkit": True,
            "operator_values": {}, "operator_helmchart_spec": {}}
MANIFESTS = "/var/lib/rancher/k3s/server/manifests"


def server(release="v1.33.10+k3s1"):
    """runtime_info's reading of the cluster's writer."""
    return server_reading("k3s", release)


def clusters(run, active=None, pattern=None, servers=("server1", "server2", "server3")):
    return step.clusters(CLUSTERS.get, list(run), list(active or run), list(pattern or run), list(servers), "server")


def test_each_cluster_is_written_by_its_first_server():
    found = clusters(["gpu1", "gpu2", "gpu3"])
    assert [(c["name"], c["writer"], c["hosts"], c["complete"]) for c in found] == [
        ("a", "server1", ["gpu1", "gpu2"], True), ("b", "server2", ["gpu3"], True)]


def test_a_failed_server_passes_the_pen_to_the_next():
    found = clusters(["gpu3", "server2", "server3"], active=["gpu3", "server3"])
    assert found[0]["writer"] == "server3"


def test_each_cluster_is_written_by_the_worker_of_its_first_live_host():
    found = clusters(["gpu1", "gpu2", "gpu3"], active=["gpu2", "gpu3"], pattern=["gpu1", "gpu2", "gpu3"])
    assert [(c["name"], c["leader"], c["complete"]) for c in found] == [("a", "gpu2", False), ("b", "gpu3", True)]
    hosts = step.assignments(found, ["gpu1", "gpu2", "gpu3"])
    assert hosts["gpu1"] == {"writes": False, "cluster": None, "delegate": "gpu1"}
    assert hosts["gpu2"] == {"writes": True, "cluster": found[0], "delegate": "server1"}
    assert hosts["gpu3"]["delegate"] == "server2"


def test_a_cluster_whose_servers_all_failed_is_a_failed_row_and_the_others_are_written():
    """One cluster's unreachable servers never keep another cluster's objects from being written."""
    found = clusters(["gpu1", "server1", "gpu3"], active=["gpu1", "gpu3"])
    assert found[0]["leader"] is None and found[0]["result"]["failed"]
    assert found[0]["result"]["msg"] == ("not written: every server of cluster a in k3s_gpu_servers (server1) failed or was "
                                         "unreachable in this run; the next run writes its objects")
    assert (found[1]["name"], found[1]["writer"], found[1]["leader"]) == ("b", "server2", "gpu3")
    assert not step.assignments(found, ["gpu1", "server1", "gpu3"])["gpu1"]["writes"]


def test_a_limited_run_is_partial():
    found = clusters(["gpu1"], pattern=["gpu1", "gpu2", "gpu3"])
    assert found == [{"name": "a", "hosts": ["gpu1"], "writer": "server1", "complete": False, "leader": "gpu1"}]


@pytest.mark.parametrize("servers, words", [
    ((), "k3s_gpu_servers (now server) matches no host of the inventory"),
    (("server2",), "cluster a (hosts gpu1) has no server in k3s_gpu_servers (server); add its servers to that group, "
                   "or set k3s_gpu_cluster on them to a"),
])
def test_a_cluster_without_a_server_is_refused_by_name(servers, words):
    with pytest.raises(K3sGpuError, match=words.replace("(", r"\(").replace(")", r"\)")):
        clusters(["gpu1"], servers=servers)


@pytest.mark.parametrize("values, words", [
    ({"runtimeclasses_state": "gone"}, "runtimeclasses_state must be one of: present, absent"),
    ({"runtimeclasses_method": "api"}, "runtimeclasses_method is api but runtimeclasses_kubeconfig is not set"),
    ({"runtimeclasses_select_nodes": "maybe"}, "runtimeclasses_select_nodes"),
    ({"runtimeclasses_overhead": {"cpu": "lots"}}, "cpu"),
])
def test_bad_cluster_settings_are_refused_by_name(values, words):
    with pytest.raises(ValueError, match=words):
        step.read_settings(values)


def test_text_booleans_are_booleans():
    assert step.read_settings({"runtimeclasses_select_nodes": "false"})["runtimeclasses_select_nodes"] is False


# the sections of runtime_info's reading that the node reports do not look at
OTHER_SECTIONS = {"distribution": "k3s", "release": "v1.33.10+k3s1", "root": "/", "profile": {}, "paths": {}, "runtimes": [],
                  "driver": {}, "toolkit": {}, "cdi": {}, "units": [], "files": {}}


def reports(vars_by_host, modes=None):
    modes = modes or {}
    return step.node_reports(list(vars_by_host), vars_by_host.get,
                             lambda host: {"mode": modes.get(host, "host"), "driver_install": False})


def test_node_reports_from_the_role_and_from_a_reading():
    nodes, complete = reports({
        "gpu1": {"gpu_node_result": {"status": "configured", "handlers": ["nvidia", "nvidia-legacy"], "gpu_operator": False,
                                     "cdi": {"enabled": True, "spec": True}, "device_plugin_config": "shared"}},
        "cpu1": {"gpu_node_result": {"status": "skipped"}},
        "gpu2": {step.READING_VAR: dict(OTHER_SECTIONS, release_runtimes=[{"name": "nvidia"}, {"name": "crun"}],
                                        loaded_config={"runtimes": ["nvidia-cdi", "runc"]}, gpu_operator={"present": True})},
    })
    assert complete is True
    assert nodes == [{"host": "gpu1", "handlers": ["nvidia", "nvidia-legacy"], "gpu_operator": False, "mode": "host",
                      "driver_install": False, "cdi_enabled": True, "cdi_spec": True, "config": "shared", "dra": None,
                      "allocation": "device_plugin"},
                     {"host": "gpu2", "handlers": ["nvidia", "nvidia-cdi"], "gpu_operator": True, "mode": "host",
                      "driver_install": False, "cdi_enabled": False, "cdi_spec": False, "config": "", "dra": None,
                      "allocation": "device_plugin"}]


def test_a_node_left_to_the_rollout_play_makes_the_picture_incomplete():
    """site's first pass: a disruptive node ends its role before its handlers are known; the cluster step of that pass
    must not take its missing handlers for none (it would remove what the node still serves)."""
    result = {"status": "configured", "handlers": [], "gpu_operator": False}
    nodes, complete = reports({"gpu1": {"gpu_node_result": result, "gpu_node__disruption": {"deferred": True}}})
    assert (nodes, complete) == ([], False)
    nodes, complete = reports({"gpu1": {"gpu_node_result": result, "gpu_node__disruption": {"deferred": False}}})
    assert complete is True and [n["host"] for n in nodes] == ["gpu1"]


def test_a_node_whose_batch_was_stopped_after_the_first_reading_makes_the_picture_incomplete():
    """site's first pass read it (work_due) and its batches stopped before the role changed it: its handlers are those
    of before the change the run meant to make, so the cluster gets objects added, never removed."""
    result = {"status": "configured", "handlers": ["nvidia"], "gpu_operator": False, "configure_due": True,
              "work_due": True}
    assert reports({"gpu1": {"gpu_node_result": result}}) == ([], False)


# the drop-in the collection writes for a handler the release does not render (containerd 2, config version 3)
DROPIN = """version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes."nvidia-cdi"]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes."nvidia-cdi".options]
BinaryName = "/usr/bin/nvidia-container-runtime.cdi"
"""


def dropin_reading(config=None, dropin=DROPIN):
    """runtime_info's reading of a k3s node where the collection wrote its drop-in; config: k3s's config.toml (None: k3s
    has not started since it was installed)."""
    paths = distro.distribution_paths("k3s")
    files = {"generated_config": {"state": "file", "content": config} if config is not None else {"state": "absent"},
             "dropin_v3": {"state": "file", "content": dropin} if dropin else {"state": "absent"},
             "dropin_v2": {"state": "absent"}}
    loaded = ["nvidia", "nvidia-cdi", "runc"] if config is not None and dropin else ["nvidia", "runc"] if config else []
    return dict(OTHER_SECTIONS, release_runtimes=[{"name": "nvidia"}, {"name": "nvidia-experimental"}], paths=paths, files=files,
                profile={"schema": 3}, loaded_config={"exists": config is not None, "runtimes": loaded},
                other_dropins=[], gpu_operator={"present": False})


def test_a_dropin_written_before_the_first_start_counts():
    nodes, complete = reports({"gpu1": {step.READING_VAR: dropin_reading()}})
    assert complete and nodes[0]["handlers"] == ["nvidia", "nvidia-cdi", "nvidia-experimental"]
    result = decide(nodes, objects=(step.RUNTIMECLASSES,))
    assert result["runtimeclasses"]["written"] == ["nvidia-cdi"]
    assert [f["path"] for f in result["files"]] == ["/srv/node%s/%s" % (MANIFESTS, step.RUNTIMECLASS_MANIFEST)]


@pytest.mark.parametrize("config,dropin,handlers", [
    ("version = 3\n", DROPIN, ["nvidia", "nvidia-cdi", "nvidia-experimental"]),  # after the start: through the imports
    (None, None, ["nvidia", "nvidia-experimental"]),  # nothing written: the release's handlers
    (None, "not = [toml", ["nvidia", "nvidia-experimental"]),  # a drop-in containerd could not load counts nothing
])
def test_the_handlers_of_a_reading_otherwise_unchanged(config, dropin, handlers):
    nodes, _complete = reports({"gpu1": {step.READING_VAR: dropin_reading(config, dropin)}})
    assert nodes[0]["handlers"] == handlers


@pytest.mark.parametrize("section, value, found", [("files", [], "a list"), ("profile", None, "a NoneType"),
                                                   ("paths", "x", "a str")])
def test_a_reading_that_is_not_runtime_infos_is_refused_by_name(section, value, found):
    reading = dropin_reading()
    reading[section] = value
    with pytest.raises(K3sGpuError, match=r"^gpu1: runtimeclasses__info: %s is %s, not a .*read phase" % (section, found)):
        reports({"gpu1": {step.READING_VAR: reading}})


@pytest.mark.parametrize("seen", [
    {"gpu_node_result": {"failed": True, "msg": "x"}},
    {step.READING_VAR: {"failed": True, "msg": "x"}},
])
def test_a_failed_node_makes_the_picture_partial(seen):
    nodes, complete = reports({"gpu1": seen})
    assert nodes == [] and complete is False


def test_taken_back_nodes_are_not_gpu_nodes():
    nodes, complete = reports({"gpu1": {"gpu_node_result": {"status": "absent", "changed": True}}})
    assert nodes == [] and complete is True


def node(host, handlers, mode="host", cdi=False):
    return {"host": host, "handlers": handlers, "gpu_operator": False, "mode": mode, "driver_install": False,
            "cdi_enabled": cdi, "cdi_spec": cdi, "config": ""}


PLUGIN = {"device_plugin_state": "present", "gpu_sharing": {}, "device_plugin_configs": {}}


def decide(nodes, complete=True, objects=(step.GPU_OPERATOR, step.RUNTIMECLASSES), settings=None, operator=None,
           earlier=None, plugin=None):
    cluster = {"name": "a", "writer": "server1", "hosts": [n["host"] for n in nodes], "complete": complete}
    return step.decide(cluster, NodeFacts.from_reading(server()), nodes, settings or SETTINGS, operator or OPERATOR, objects, "/srv/node", earlier,
                       plugin_settings=plugin)


def test_host_mode_writes_the_missing_classes_and_removes_the_operator_manifest():
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi", "nvidia-legacy"])])
    paths = [(f["path"], f["state"]) for f in result["files"]]
    assert paths == [("/srv/node" + MANIFESTS + "/" + step.OPERATOR_MANIFEST, "absent"),
                     ("/srv/node" + MANIFESTS + "/" + step.RUNTIMECLASS_MANIFEST, "file")]
    assert result["runtimeclasses"]["written"] == ["nvidia-cdi", "nvidia-legacy"]  # k3s ships nvidia
    assert 'handler: "nvidia-legacy"' in result["files"][1]["content"]


def test_operator_mode_writes_the_helmchart_and_leaves_its_classes_to_it():
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi", "nvidia-legacy"], mode="operator")])
    operator_file, classes_file = result["files"]
    assert operator_file["state"] == "file" and "kind: \"HelmChart\"" in operator_file["content"]
    assert result["gpu_operator"]["wanted"] is True and result["runtimeclasses"]["written"] == []
    assert classes_file["state"] == "absent"


def test_two_modes_in_one_cluster_are_refused():
    with pytest.raises(K3sGpuError, match="one cluster, two modes"):
        decide([node("gpu1", ["nvidia"], mode="operator"), node("gpu2", ["nvidia"])])


def test_a_partial_run_keeps_earlier_classes_and_removes_nothing():
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi"])], complete=False, earlier=["nvidia-legacy"])
    assert result["runtimeclasses"]["written"] == ["nvidia-cdi", "nvidia-legacy"]
    assert [f["state"] for f in result["files"]] == ["file"]  # no removal of the operator manifest either
    absent = dict(SETTINGS, runtimeclasses_state="absent")
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi"])], complete=False, settings=absent)
    assert result["files"] == [] and "left as it is" in result["messages"][-1]


def test_state_absent_on_a_whole_cluster_removes_both_manifests():
    absent = dict(SETTINGS, runtimeclasses_state="absent")
    result = decide([node("gpu1", ["nvidia-cdi"], mode="operator")], settings=absent,
                    operator=dict(OPERATOR, operator_state="absent"))
    assert [f["state"] for f in result["files"]] == ["absent", "absent"]


def test_the_api_method_writes_no_manifest_and_returns_the_objects():
    api = dict(SETTINGS, runtimeclasses_method="api", runtimeclasses_kubeconfig="/k")
    result = decide([node("gpu1", ["nvidia-cdi"])], objects=[step.RUNTIMECLASSES], settings=api)
    assert result["files"] == [] and [m["handler"] for m in result["runtimeclasses"]["manifests"]] == ["nvidia-cdi"]


def test_earlier_handlers_are_read_from_our_manifest():
    text = runtimeclasses.render_manifest_yaml([runtimeclasses.runtimeclass_manifest(h) for h in ("nvidia-legacy", "nvidia-cdi")])
    assert step.earlier_handlers(text) == ["nvidia-cdi", "nvidia-legacy"]
    assert step.earlier_handlers("{not yaml: [") == [] and step.earlier_handlers("") == []


def plugin_file(result):
    return next(f for f in result["files"] if f["path"].endswith("/k3s-gpu-nvidia-device-plugin.yaml"))


def test_host_mode_gets_the_device_plugin_under_an_nvidia_runtimeclass():
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi", "nvidia-legacy"])], objects=step.OBJECTS, plugin=PLUGIN)
    written = plugin_file(result)
    assert written["state"] == "file" and 'chart: "nvidia-device-plugin"' in written["content"]
    assert result["device_plugin"]["runtime_class"] == "nvidia" and result["device_plugin"]["device_list_strategy"] == "envvar"


def test_cdi_everywhere_hands_devices_through_cri():
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi"], cdi=True), node("gpu2", ["nvidia", "nvidia-cdi"], cdi=True)],
                    objects=step.OBJECTS, plugin=PLUGIN)
    assert result["device_plugin"]["device_list_strategy"] == "cdi-cri"
    result = decide([node("gpu1", ["nvidia", "nvidia-cdi"], cdi=True), node("gpu2", ["nvidia", "nvidia-cdi"])],
                    objects=step.OBJECTS, plugin=PLUGIN)
    assert result["device_plugin"]["device_list_strategy"] == "envvar"


def test_time_slicing_goes_into_the_plugin_config():
    shared = dict(PLUGIN, gpu_sharing={"strategy": "time-slicing", "replicas": 4})
    result = decide([node("gpu1", ["nvidia"])], objects=step.OBJECTS, plugin=shared)
    assert "replicas: 4" in plugin_file(result)["content"]
    assert result["device_plugin"]["sharing"] == {"strategy": "time-slicing", "replicas": 4}


def test_bad_sharing_is_refused_by_its_variable():
    with pytest.raises(K3sGpuError, match="gpu_node_gpu_sharing.replicas is 1"):
        decide([node("gpu1", ["nvidia"])], objects=step.OBJECTS, plugin=dict(PLUGIN, gpu_sharing={"strategy": "mps", "replicas": 1}))


@pytest.mark.parametrize("mode, plugin, why", [
    ("operator", PLUGIN, "the GPU Operator brings its own"),
    ("host", dict(PLUGIN, device_plugin_state="absent"), "gpu_node_device_plugin_state=absent"),
])
def test_operator_mode_and_state_absent_remove_our_plugin(mode, plugin, why):
    result = decide([node("gpu1", ["nvidia"], mode=mode)], objects=step.OBJECTS, plugin=plugin)
    assert plugin_file(result)["state"] == "absent" and any(why in m for m in result["messages"])


def test_a_partial_run_never_removes_the_plugin():
    result = decide([node("gpu1", ["nvidia"], mode="operator")], complete=False, objects=step.OBJECTS, plugin=PLUGIN)
    assert not any(f["path"].endswith("device-plugin.yaml") for f in result["files"])


def test_without_a_cluster_a_missing_device_plugin_is_a_problem_and_the_unchecked_is_said():
    cluster = {"name": "a", "writer": "server1"}
    lines, problems = step.inspection_lines(cluster, {})
    assert problems and "stays Pending" in problems[0]
    assert lines[-1].startswith("cluster a (server1): not checked without a cluster: ")
    found = {step.device_plugin.MANIFEST_FILE: {"kinds": ["HelmChart"], "names": ["nvidia-device-plugin"],
                                                "chart": "nvidia-device-plugin", "version": "0.20.0", "runtimeClassName": "nvidia"}}
    lines, problems = step.inspection_lines(cluster, found)
    assert problems == [] and any("HelmChart nvidia-device-plugin 0.20.0, runtimeClassName nvidia" in line for line in lines)


# --- gpu_node_allocation: NVIDIA's DRA driver on the nodes that choose it, the device plugin on the others (issue 45)

def dra_node(host, handlers=("nvidia", "nvidia-cdi"), **dra):
    return dict(node(host, list(handlers)), allocation="dra", dra=dict({"kubelet_root_dir": "/var/lib/kubelet",
                                                                        "operator_driver": False}, **dra))


def decide_on(release, nodes, plugin=None, complete=True):
    plugin = PLUGIN if plugin is None else plugin
    cluster = {"name": "a", "writer": "server1", "hosts": [n["host"] for n in nodes], "complete": complete}
    return step.decide(cluster, NodeFacts.from_reading(server(release)), nodes, SETTINGS, OPERATOR, step.OBJECTS,
                       "/srv/node", None, plugin_settings=plugin)


def manifest_of(result, name):
    return next((f for f in result["files"] if f["path"].endswith("/" + name)), None)


def test_dra_nodes_get_the_dra_driver_and_the_device_plugin_keeps_off_them():
    result = decide_on("v1.36.3+k3s1", [node("gpu1", ["nvidia", "nvidia-cdi"]), dra_node("gpu2", kubelet_root_dir="/data/k")])
    dra_file = manifest_of(result, "k3s-gpu-nvidia-dra-driver.yaml")
    assert dra_file["state"] == "file" and dra_file["mode"] == "0600"
    values = yaml.safe_load(next(d for d in yaml.safe_load_all(dra_file["content"]) if d)["spec"]["valuesContent"])
    assert values["kubeletPlugin"]["kubeletPluginsDirectoryPath"] == "/data/k/plugins"
    assert result["dra_driver"]["nodes"] == ["gpu2"] and result["dra_driver"]["driver_root"] == "/"
    plugin_text = manifest_of(result, "k3s-gpu-nvidia-device-plugin.yaml")["content"]
    plugin = yaml.safe_load(next(d for d in yaml.safe_load_all(plugin_text) if d)["spec"]["valuesContent"])
    assert plugin["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
                              {"key": "k3s-gpu.nvidia/gpu-allocation", "operator": "NotIn", "values": ["dra"]}]}]
    assert any(m.startswith("NVIDIA DRA driver 0.4.1 on gpu2") for m in result["messages"])


def test_a_cluster_without_dra_nodes_keeps_its_device_plugin_manifest_and_removes_the_driver():
    before = decide_on("v1.36.3+k3s1", [node("gpu1", ["nvidia"])])
    assert manifest_of(before, "k3s-gpu-nvidia-dra-driver.yaml") == {
        "path": "/srv/node" + MANIFESTS + "/k3s-gpu-nvidia-dra-driver.yaml", "state": "absent"}
    assert "k3s-gpu.nvidia/gpu-allocation" not in manifest_of(before, "k3s-gpu-nvidia-device-plugin.yaml")["content"]
    assert any("no DRA driver from this collection (no node with gpu_node_allocation=dra)" in m for m in before["messages"])


def test_every_node_on_dra_leaves_no_device_plugin_and_a_partial_run_removes_nothing():
    result = decide_on("v1.36.3+k3s1", [dra_node("gpu1"), dra_node("gpu2")])
    assert manifest_of(result, "k3s-gpu-nvidia-device-plugin.yaml")["state"] == "absent"
    assert manifest_of(result, "k3s-gpu-nvidia-dra-driver.yaml")["state"] == "file"
    partial = decide_on("v1.36.3+k3s1", [node("gpu1", ["nvidia"])], complete=False)
    assert manifest_of(partial, "k3s-gpu-nvidia-dra-driver.yaml") is None
    absent = decide_on("v1.36.3+k3s1", [dra_node("gpu1")], plugin=dict(PLUGIN, dra_driver_state="absent"))
    assert manifest_of(absent, "k3s-gpu-nvidia-dra-driver.yaml")["state"] == "absent"


def test_the_dra_driver_on_a_release_before_1_34_2_is_refused():
    with pytest.raises(K3sGpuError, match=r"runs k3s v1\.33\.10\+k3s1, which NVIDIA's DRA driver does not support"):
        decide_on("v1.33.10+k3s1", [dra_node("gpu1")])
