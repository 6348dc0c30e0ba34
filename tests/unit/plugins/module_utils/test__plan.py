# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Plan decisions and every bad input: a clear message naming the file/key/fix, nothing written."""

from __future__ import annotations

import os
import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

LEGACY = "/usr/bin/nvidia-container-runtime.legacy"
CONTAINERD_DIR = "/var/lib/rancher/k3s/agent/etc/containerd"


def run(sandbox, release="v1.31.6+k3s1", binaries=(), path=None, **params):
    facts = detect.gather(sandbox.root, "k3s", release, binaries=binaries, path=path)
    params.setdefault("path", path)
    return changes.compute(NodeFacts.from_reading(facts), params)


BAD_NAMES = ['nvidia"x', "nvidia.legacy", "nvidia\nx", "Nvidia", "", "a" * 64, "-nvidia", "nvidia x", "nvidia\n"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["quote", "dot", "newline", "upper", "empty", "long", "dash", "space", "trailing-newline"])
def test_bad_runtime_name(sandbox, name):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError, match="lowercase DNS label"):
        run(sandbox, runtimes=[{"name": name, "binary": LEGACY}])
    assert sandbox.snapshot() == before


@pytest.mark.parametrize("binary,message", [
    ("usr/bin/nvidia-container-runtime.legacy", r"runtimes\[0\].binary: 'usr/bin/nvidia-container-runtime.legacy' is not an absolute path"),
    ("/usr/bin/missing", "does not exist on the node"),
    ("/usr/bin", "is a directory"),
])
def test_bad_binary(sandbox, binary, message):
    sandbox.k3s("k3s", "package")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", binaries=[binary] if binary.startswith("/") else [])
    with pytest.raises(K3sGpuError, match=message):
        changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "custom", "binary": binary}]})


def test_non_executable_and_dangling_binary(sandbox):
    sandbox.k3s().binary("/opt/x/rt", mode=0o644)
    sandbox.symlink("/opt/x/dangling", "/opt/x/nowhere")
    for binary, message in (("/opt/x/rt", "not executable"), ("/opt/x/dangling", "dangling symlink")):
        facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", binaries=[binary])
        with pytest.raises(K3sGpuError, match=message):
            changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "custom", "binary": binary}]})


def test_a_refusal_gives_its_fix_apart_from_its_cause(sandbox):
    """cri_disabled and a binary that is not executable: the cause says what is wrong, the fix what to do (the
    doctor and a task's `error` read the fix on its own), and the refusal that writes nothing says so last."""
    sandbox.binary("/usr/bin/containerd")
    sandbox.write("/etc/containerd/config.toml", 'version = 2\ndisabled_plugins = ["cri"]\n')
    before = sandbox.snapshot()
    facts = detect.gather(sandbox.root, "containerd", "2.1.4")
    with pytest.raises(K3sGpuError) as raised:
        changes.compute(NodeFacts.from_reading(facts), {})
    error = raised.value
    assert error.cause.endswith("for Docker alone) [cri_disabled]")
    assert "Fix" not in error.cause and "written" not in error.cause
    assert error.fix.startswith("write containerd's own config (`containerd config default > /etc/containerd/config.toml`")
    assert error.fix.endswith('or remove "cri" from disabled_plugins, then run the role again; nothing was written')
    assert str(error) == "%s; %s" % (error.cause, error.fix)
    assert sandbox.snapshot() == before

    sandbox.k3s().binary("/opt/x/rt", mode=0o644)
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", binaries=["/opt/x/rt"])
    with pytest.raises(K3sGpuError) as raised:
        changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "custom", "binary": "/opt/x/rt"}]})
    error = raised.value
    assert (error.cause, error.fix) == ("runtime custom: binary /opt/x/rt is not executable", "chmod 0755 it")
    assert str(error) == "runtime custom: binary /opt/x/rt is not executable; chmod 0755 it"


def test_option_typo_is_caught(sandbox):
    sandbox.k3s("k3s", "package")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", binaries=[LEGACY])
    with pytest.raises(K3sGpuError, match=r"'systemdcgroup' is not an option .* \(did you mean SystemdCgroup\?\)"):
        changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "nvidia-legacy", "binary": LEGACY, "options": {"systemdcgroup": True}}]})
    with pytest.raises(K3sGpuError, match=r"'BinaryNme' .*did you mean BinaryName"):
        changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "nvidia-legacy", "binary": LEGACY, "options": {"BinaryNme": "/x"}}]})


def test_enable_cdi_on_containerd_17_release_is_refused(sandbox):
    sandbox.k3s("k3s", "package")
    with pytest.raises(K3sGpuError, match=r"k3s v1.31.5\+k3s1 ships containerd 1.7.*base template already emits"):
        run(sandbox, "v1.31.5+k3s1", enable_cdi=True)


def test_enable_cdi_on_containerd_2_is_the_default(sandbox):
    sandbox.k3s("k3s", "package")
    plan, _c = run(sandbox, "v1.31.6+k3s1", enable_cdi=True)
    assert any("already has enable_cdi = true by default" in n for n in plan["notes"])
    plan, file_changes = run(sandbox, "v1.33.10+k3s1", enable_cdi=True)  # drop-in: set explicitly
    assert "enable_cdi = true" in file_changes[0].after


def test_default_runtime_detected_goes_to_config_yaml(sandbox):
    sandbox.k3s("k3s", "package")
    plan, file_changes = run(sandbox, default_runtime="nvidia")
    assert plan["default_runtime"]["how"] == "config_yaml"
    yaml = [c for c in file_changes if c.node_path.endswith(".yaml")][0]
    assert yaml.node_path == "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"
    assert yaml.after.splitlines()[1] == 'default-runtime: "nvidia"'


def test_default_runtime_not_detected(sandbox):
    sandbox.k3s("k3s", "package")
    plan, file_changes = run(sandbox, "v1.31.6+k3s1", default_runtime="nvidia-legacy")
    assert plan["default_runtime"]["how"] == "toml"
    assert 'default_runtime_name = "nvidia-legacy"' in file_changes[0].after
    with pytest.raises(K3sGpuError, match="schema-2 base template already emits"):
        run(sandbox, "v1.31.5+k3s1", default_runtime="nvidia-legacy")
    with pytest.raises(K3sGpuError, match="neither detected by .* nor written"):
        run(sandbox, "v1.31.6+k3s1", default_runtime="kata")
    with pytest.raises(K3sGpuError, match="no default-runtime setting"):
        run(sandbox, "v1.28.4+k3s2", default_runtime="nvidia")


def test_default_runtime_runc_is_refused_on_k3s(sandbox):
    sandbox.k3s("k3s", "package")
    with pytest.raises(K3sGpuError, match="never include runc"):
        run(sandbox, default_runtime="runc")


def test_default_runtime_moves_from_our_config_yaml_to_toml(sandbox):
    # first nvidia (detected: config.yaml.d), then nvidia-legacy (ours: TOML); our yaml file goes away
    sandbox.k3s("k3s", "package")
    _plan, file_changes = run(sandbox, default_runtime="nvidia")
    for change in file_changes:
        sandbox.write(change.node_path, change.after)
    plan, file_changes = run(sandbox, default_runtime="nvidia-legacy")
    by_path = dict((c.node_path, c.after) for c in file_changes)
    assert by_path["/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"] is None
    assert 'default_runtime_name = "nvidia-legacy"' in by_path[CONTAINERD_DIR + "/config-v3.toml.tmpl"]
    assert ["plugins", "io.containerd.cri.v1.runtime", "containerd"] not in plan["reserved_tables"]


def test_default_runtime_set_by_the_site_reserves_the_v3_containerd_table(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/etc/rancher/k3s/config.yaml", "default-runtime: nvidia\n")
    plan, _c = run(sandbox)
    assert ["plugins", "io.containerd.cri.v1.runtime", "containerd"] in plan["reserved_tables"]


def test_default_runtime_toml_conflicts_with_config_yaml(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/etc/rancher/k3s/config.yaml", "default-runtime: nvidia\n")
    with pytest.raises(K3sGpuError, match="/etc/rancher/k3s/config.yaml sets default-runtime: nvidia"):
        run(sandbox, "v1.31.6+k3s1", default_runtime="nvidia-legacy")


def test_explicit_runtime_that_base_renders_with_another_binary(sandbox):
    sandbox.k3s("k3s", "package").binary("/opt/x/nvidia-container-runtime")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", binaries=["/opt/x/nvidia-container-runtime"])
    with pytest.raises(K3sGpuError, match="cannot declare its table a second time"):
        changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "nvidia", "binary": "/opt/x/nvidia-container-runtime"}]})
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1", binaries=["/opt/x/nvidia-container-runtime"])
    plan, _c = changes.compute(NodeFacts.from_reading(facts), {"runtimes": [{"name": "nvidia", "binary": "/opt/x/nvidia-container-runtime"}]})
    assert plan["write"][0]["name"] == "nvidia" and "overrides" in plan["notes"][0]


@pytest.mark.parametrize("kind", ["symlink", "directory", "large", "not_utf8", "fifo"])
def test_unusable_target_file(sandbox, kind):
    sandbox.k3s("k3s", "package")
    target = CONTAINERD_DIR + "/config-v3.toml.tmpl"
    if kind == "symlink":
        sandbox.write(CONTAINERD_DIR + "/real.tmpl", '{{ template "base" . }}\n')
        sandbox.symlink(target, CONTAINERD_DIR + "/real.tmpl")
        message = "is a symlink; refusing to write through it"
    elif kind == "directory":
        sandbox.mkdir(target)
        message = "is a directory"
    elif kind == "large":
        sandbox.write(target, "# x\n" * (5 * 1024 * 1024 // 4))
        message = "larger than the 1 MiB"
    elif kind == "fifo":
        os.mkfifo(sandbox.path(target))
        message = r"is not a regular file \(a device, socket or FIFO\); containerd and k3s read only regular files"
    else:
        sandbox.write(target, b'{{ template "base" . }}\n# caf\xe9\n')
        message = r"not valid UTF-8 \(first bad byte on line 2\)"
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError, match=message) as info:
        run(sandbox)
    assert target in str(info.value)
    assert sandbox.snapshot() == before


def test_a_file_the_task_cannot_read_asks_for_root():
    # root reads every file of a sandbox tree: the reading's fact stands for a node file the connection's user cannot read
    info = {"state": "file", "path": CONTAINERD_DIR + "/config-v3.toml.tmpl", "error": "unreadable"}
    with pytest.raises(K3sGpuError, match=r"^template .*config-v3.toml.tmpl cannot be read by the user the task runs as; "
                                          r"run the task as root \(become: true\), .*; nothing was written$"):
        planner._refuse_unusable(info, "template")


@pytest.mark.parametrize("entry, words", [
    ({"name": "nvidia-experimental"}, "runtime nvidia-experimental in {runtimes}: no binary given and none detected on the "
                                      "node; give its binary"),
    ({"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "options": {"BinaryName": "/usr/bin/x"}},
     "runtime nvidia in {runtimes}: options.BinaryName is set; give the path as the runtime's binary instead"),
])
def test_a_runtime_entry_the_plan_cannot_take_names_the_option_and_the_fix(sandbox, entry, words):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as raised:
        run(sandbox, binaries=["/usr/bin/nvidia-container-runtime"], runtimes=[entry])
    assert raised.value.variables == ("runtimes",) and raised.value.fix.endswith("; nothing was written")
    assert words in "%s; %s" % (raised.value.cause, raised.value.fix)
    assert raised.value.text({"runtimes": "gpu_node_runtimes"}).startswith(words.split(":")[0].replace(
        "{runtimes}", "gpu_node_runtimes"))
    assert sandbox.snapshot() == before


def test_path_override(sandbox):
    sandbox.k3s("k3s", "package")
    with pytest.raises(K3sGpuError, match="must be absolute"):
        run(sandbox, path="relative/x.toml")
    plan, file_changes = run(sandbox, path="/etc/containerd/conf.d/gpu.toml")
    assert plan["target"]["mode"] == "dropin" and file_changes[0].node_path == "/etc/containerd/conf.d/gpu.toml"
    plan, file_changes = run(sandbox, path=CONTAINERD_DIR + "/config.toml.tmpl")
    assert plan["target"]["schema"] == 2 and file_changes[0].after.splitlines()[1] == toml.BASE_LINE


def test_plain_containerd_v1_config_is_refused(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", '[plugins.cri]\n  sandbox_image = "x"\n')
    facts = detect.gather(sandbox.root, "containerd", "1.7.24")
    with pytest.raises(K3sGpuError, match="has no `version` line"):
        changes.compute(NodeFacts.from_reading(facts), {})


def test_containerd_16_has_no_cdi(sandbox):
    sandbox.binary("/usr/bin/containerd")
    facts = detect.gather(sandbox.root, "containerd", "1.6.20")
    with pytest.raises(K3sGpuError, match="containerd 1.6 .* has no CDI support"):
        changes.compute(NodeFacts.from_reading(facts), {"enable_cdi": True})


def test_runtime_info_plan_summary(sandbox):
    sandbox.k3s("k3s", "package")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    summary = planner.summarize(planner.make_plan(facts))
    assert summary["mode"] == "template" and [w["name"] for w in summary["write"]] == ["nvidia-legacy"]
    assert sorted(s["name"] for s in summary["skip"]) == ["nvidia", "nvidia-cdi"]


# --- plain containerd config `version = 4` (containerd 2.3) ------------------------------------------

NVIDIA = "/usr/bin/nvidia-container-runtime"
V3_RUNTIMES = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
# what `containerd config migrate` of 2.3 writes, cut down: server settings in plugins, CRI paths as in v3
V4_CONFIG = ("version = 4\n"
             "imports = [\"/etc/containerd/conf.d/*.toml\"]\n\n"
             "[plugins.'io.containerd.server.v1.grpc']\n  address = \"/run/containerd/containerd.sock\"\n\n"
             "[%s.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
             "[%s.runc.options]\n  SystemdCgroup = true\n") % (V3_RUNTIMES, V3_RUNTIMES)


def containerd_node(sandbox, config=None):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary(NVIDIA)
    if config is not None:
        sandbox.write("/etc/containerd/config.toml", config)
    return sandbox


def plain(sandbox, version, **params):
    facts = detect.gather(sandbox.root, "containerd", version, path=params.get("path"))
    return changes.compute(NodeFacts.from_reading(facts), params)


def test_v4_config_edited_stays_v4(sandbox):
    no_imports = V4_CONFIG.replace('imports = ["/etc/containerd/conf.d/*.toml"]\n', "")
    containerd_node(sandbox, no_imports)
    plan, file_changes = plain(sandbox, "2.3.4")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("config", 4)
    [change] = file_changes
    after = change.after
    assert change.node_path == "/etc/containerd/config.toml" and after.startswith(no_imports)  # every byte kept
    assert after.splitlines()[0] == "version = 4" and after.count("version =") == 1
    data = tomllib.loads(after)
    nvidia = data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": NVIDIA, "SystemdCgroup": True}}
    assert "io.containerd.grpc.v1.cri" not in data["plugins"]  # never the v2 path
    sandbox.write("/etc/containerd/config.toml", after)
    assert plain(sandbox, "2.3.4")[1] == []  # second run: nothing


def test_v4_config_removal_keeps_v4(sandbox):
    containerd_node(sandbox, V4_CONFIG.replace('imports = ["/etc/containerd/conf.d/*.toml"]\n', ""))
    _plan, [change] = plain(sandbox, "2.3.4")
    sandbox.write("/etc/containerd/config.toml", change.after)
    _plan, [removed] = plain(sandbox, "2.3.4", state="absent")
    assert removed.after.splitlines()[0] == "version = 4" and "nvidia" not in removed.after


@pytest.mark.parametrize("version", ["2.2.7", "2.1.9", "2.0.5"])
def test_v4_config_on_a_node_that_cannot_read_it_is_refused(sandbox, version):
    containerd_node(sandbox, V4_CONFIG)
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as info:
        plain(sandbox, version)
    message = str(info.value)
    assert "/etc/containerd/config.toml declares `version = 4`" in message
    assert "containerd %s cannot read" % version[:3] in message
    assert "expected containerd config version equal to or less than `3`, got `4`" in message
    assert "version 4 came with containerd 2.3" in info.value.cause
    assert info.value.fix.startswith("write the file as version 3")
    assert info.value.fix.endswith("or upgrade containerd to 2.3; nothing was changed")
    assert sandbox.snapshot() == before
    # runtime_info reports it as the plan's error instead of failing
    facts = detect.gather(sandbox.root, "containerd", version)
    with pytest.raises(K3sGpuError, match="version = 4"):
        planner.make_plan(facts)


@pytest.mark.parametrize("version,config_version", [("1.7.24", 3), ("1.7.24", 4), ("2.3.4", 5), ("2.3.4", 1)])
def test_other_unreadable_versions_are_refused(sandbox, version, config_version):
    containerd_node(sandbox, "version = %d\n[plugins.x]\n  a = 1\n" % config_version)
    with pytest.raises(K3sGpuError, match=r"declares `version = %d`, which containerd %s" % (config_version, version[:3])):
        plain(sandbox, version)


@pytest.mark.parametrize("root_version,plugin", [
    (4, "io.containerd.cri.v1.runtime"), (3, "io.containerd.cri.v1.runtime"), (2, "io.containerd.grpc.v1.cri")])
def test_dropin_declares_the_root_config_version(sandbox, root_version, plugin):
    """containerd 2.3 refuses a drop-in whose version is above the root's (#12891): ours is never above it."""
    root = {4: V4_CONFIG,
            3: 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n',
            2: 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'}[root_version]
    containerd_node(sandbox, root)
    plan, [change] = plain(sandbox, "2.3.4")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("dropin", root_version)
    assert change.node_path == "/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml"
    data = tomllib.loads(change.after)
    assert data["version"] == root_version
    assert data["plugins"][plugin]["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA


def test_dropin_written_at_4_earlier_follows_a_root_now_at_3(sandbox):
    """A drop-in of ours (or nvidia-ctk 1.19's pattern) at 4 under a v3 root stops containerd 2.3: rewritten at 3."""
    containerd_node(sandbox, 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    sandbox.write("/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml",
                  toml.MANAGED_HEADER + "\nversion = 4\n\n[%s.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n" % V3_RUNTIMES)
    _plan, [change] = plain(sandbox, "2.3.4")
    assert tomllib.loads(change.after)["version"] == 3


def test_dropin_path_override_follows_the_root(sandbox):
    containerd_node(sandbox, V4_CONFIG)
    plan, [change] = plain(sandbox, "2.3.4", path="/etc/containerd/conf.d/99-nvidia.toml")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("dropin", 4)
    assert tomllib.loads(change.after)["version"] == 4
    containerd_node(sandbox, 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    _plan, [change] = plain(sandbox, "2.3.4", path="/etc/containerd/conf.d/99-nvidia.toml")
    assert tomllib.loads(change.after)["version"] == 3


def test_config_path_override_at_4(sandbox):
    containerd_node(sandbox)
    sandbox.write("/etc/containerd/other.toml", V4_CONFIG)
    plan, [change] = plain(sandbox, "2.3.4", path="/etc/containerd/other.toml")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("config", 4)
    assert change.after.startswith(V4_CONFIG)
    with pytest.raises(K3sGpuError, match="declares `version = 4`, which containerd 2.2 cannot read"):
        plain(sandbox, "2.2.7", path="/etc/containerd/other.toml")


def test_new_config_on_containerd_23_is_version_3(sandbox):
    containerd_node(sandbox)
    plan, [change] = plain(sandbox, "2.3.4")
    assert plan["target"]["schema"] == 3 and tomllib.loads(change.after)["version"] == 3


def test_k3s_dropin_stays_3_on_containerd_23_releases(sandbox):
    """k3s/rke2 generate config.toml at version 3 on 1.36.2+/1.37 (containerd 2.3): their drop-in says 3."""
    sandbox.k3s("k3s", "package")
    for release in ("v1.36.2+k3s1", "v1.37.2+k3s1"):
        plan, file_changes = run(sandbox, release)
        assert (plan["target"]["mode"], plan["target"]["schema"]) == ("dropin", 3)
        assert tomllib.loads(file_changes[0].after)["version"] == 3


# ---- issue 41: a runtimes entry is refused by its index and key, for the module's user and the role's ----------------

ROLE_NAMES = {"runtimes": "gpu_node_runtimes"}


@pytest.mark.parametrize("entries, module_text", [
    ([{"name": "nvidia-x", "binary": LEGACY, "runtime_type": "not a type"}],
     "runtimes[0].runtime_type: 'not a type' is not a containerd runtime type"),
    ([{"name": "nvidia-x", "binary": LEGACY}, {"name": "Bad", "binary": LEGACY}],
     "runtimes[1].name: 'Bad' is not a valid runtime name"),
    ([{"name": "nvidia-x", "binary": LEGACY, "runtime_type": "io.containerd.runc.v2\n"}],
     "runtimes[0].runtime_type: 'io.containerd.runc.v2\\n' is not a containerd runtime type"),
])
def test_a_runtime_entry_is_refused_by_index_and_key(sandbox, entries, module_text):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as raised:
        run(sandbox, runtimes=entries)
    assert raised.value.text().startswith(module_text), raised.value.text()
    assert raised.value.text(ROLE_NAMES).startswith("gpu_node_" + module_text)
    assert sandbox.snapshot() == before


@pytest.mark.parametrize("runtime_type", ["io.containerd.kata-qemu.v2", "io.containerd.runc.v2", "/opt/shim/containerd-shim-x-v2"])
def test_a_containerd_runtime_type_is_taken(sandbox, runtime_type):
    sandbox.k3s("k3s", "package")
    planned = planner.normalize_runtimes({"runtimes": [], "binaries": {LEGACY: {"state": "file", "executable": True}}},
                                         [{"name": "x", "binary": LEGACY, "runtime_type": runtime_type}])
    assert planned[0]["runtime_type"] == runtime_type
