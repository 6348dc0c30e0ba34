# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 27: a user's own table of a runtime the release renders is refused by name, never deleted; a template
without the base include is what k3s renders alone, so it is edited (with a warning), not refused for a base it
never executes; an absent run leaves the node as it was; new runtimes inherit from the default runtime."""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.modules import node_files
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _decide as decide_step
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write
from ansible_collections.k3s_gpu.nvidia.tests.containerd_tables import CRUN, NVIDIA_CTK_V2, RUNC_SYSTEMD, default_runtime
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import FileChange

RELEASE = "v1.30.6+k3s1"
TEMPLATE_V2 = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
V2 = 'plugins."io.containerd.grpc.v1.cri".containerd'
V3 = "plugins.'io.containerd.cri.v1.runtime'.containerd"

# k3s-io/k3s #11631: the user's own nvidia table, for SystemdCgroup = false
USER_NVIDIA = """{{ template "base" . }}

[%(t)s.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[%(t)s.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
  SystemdCgroup = false
""" % {"t": V2}


def k3s_node(sandbox, template, binaries=("nvidia-container-runtime", "nvidia-container-runtime.cdi",
                                          "nvidia-container-runtime.legacy"), systemd=True, release=RELEASE):
    sandbox.k3s("k3s")
    for binary in binaries:
        sandbox.binary("/usr/bin/" + binary)
    if systemd:
        sandbox.mkdir("/run/systemd/system")
    if template is not None:
        sandbox.write(TEMPLATE_V2, template)
    return detect.gather(sandbox.root, "k3s", release)


def runtimes_of(text, schema=2):
    data = tomllib.loads("\n".join(line for line in text.split("\n") if "{{" not in line))
    plugin = "io.containerd.grpc.v1.cri" if schema == 2 else "io.containerd.cri.v1.runtime"
    return data["plugins"][plugin]["containerd"]["runtimes"]


# --- 1. a user's own table of a runtime the release renders ------------------------------------------------

def test_a_users_table_of_a_rendered_runtime_is_refused_with_what_it_would_lose(sandbox):
    facts = k3s_node(sandbox, USER_NVIDIA)
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as info:
        changes.compute(NodeFacts.from_reading(facts), {"state": "present", "backup": True})
    message = str(info.value)
    assert "line 3: [%s.runtimes.nvidia]" % V2 in message
    assert "renders runtime nvidia itself (it detects /usr/bin/nvidia-container-runtime)" in message
    assert "options.SystemdCgroup false \u2192 true" in message  # the very reason the table was there
    assert "a runtime name of your own (such as nvidia-custom)" in message
    assert "release's own nvidia table" in message
    assert "[duplicate_table]" in info.value.cause and "[duplicate_table]" not in info.value.fix
    assert info.value.fix.startswith("this task does not delete a table you wrote")
    assert info.value.fix.endswith("nothing was written")
    assert sandbox.snapshot() == before


def test_the_rule_holds_for_every_runtime_the_release_renders(sandbox):
    # nvidia-cdi, detected like nvidia, with a key of the user's that the release never renders
    template = USER_NVIDIA.replace("runtimes.nvidia", "runtimes.nvidia-cdi").replace(
        "nvidia-container-runtime\"", "nvidia-container-runtime.cdi\"").replace(
        "SystemdCgroup = false", "SystemdCgroup = true\n  NoNewKeyring = true")
    with pytest.raises(K3sGpuError) as info:
        changes.compute(NodeFacts.from_reading(k3s_node(sandbox, template)), {"state": "present"})
    assert "runtime nvidia-cdi itself" in str(info.value)
    assert "options.NoNewKeyring true \u2192 (unset)" in str(info.value)


def test_on_a_dropin_release_the_refusal_names_the_settings_and_the_dropin_way(sandbox):
    # v1.33.10: only a drop-in is written, the template is checked whole; the same rule, the same facts
    sandbox.k3s("k3s", "package")
    sandbox.mkdir("/run/systemd/system")
    template = USER_NVIDIA.replace(V2, V3)
    sandbox.write("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", template)
    with pytest.raises(K3sGpuError) as info:
        changes.compute(NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")), {"state": "present"})
    message = str(info.value)
    assert "SystemdCgroup false \u2192 true" in message and "nvidia-custom" in message
    assert "put only those keys into a drop-in config-v3.toml.d/<name>.toml" in message


def test_a_block_exactly_as_this_module_writes_it_goes_when_the_release_renders_it(sandbox):
    # the mirror: our own block from before k3s detected the runtime (same values as the release's) is taken out
    ours = USER_NVIDIA.replace("SystemdCgroup = false", "SystemdCgroup = true")
    plan, file_changes = changes.compute(NodeFacts.from_reading(k3s_node(sandbox, ours)), {"state": "present"})
    assert plan["removed_for_base"] == ["nvidia"]
    assert "nvidia" not in runtimes_of(file_changes[0].after)


def test_a_users_existing_table_keeps_its_settings(sandbox):
    # a runtime the release does not render: only runtime_type and BinaryName are the task's; the user's
    # SystemdCgroup stays, and a value that has to change is named
    template = USER_NVIDIA.replace("runtimes.nvidia", "runtimes.nvidia-legacy").replace(
        '"/usr/bin/nvidia-container-runtime"', '"/opt/old/nvidia-container-runtime.legacy"')
    plan, file_changes = changes.compute(NodeFacts.from_reading(k3s_node(sandbox, template)), {"state": "present", "backup": True})
    legacy = runtimes_of(file_changes[0].after)["nvidia-legacy"]
    assert legacy["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime.legacy", "SystemdCgroup": False}
    warning = [w for w in plan["warnings"] if "[runtime_table_updated]" in w]
    assert len(warning) == 1
    assert 'BinaryName "/opt/old/nvidia-container-runtime.legacy" \u2192 "/usr/bin/nvidia-container-runtime.legacy"' in warning[0]
    assert "/var/backups/k3s-gpu-nvidia" + TEMPLATE_V2 + ".<time>~" in warning[0]


# --- 2. a template without the base include ------------------------------------------------------------------

@pytest.mark.parametrize("binaries", [
    ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy"),
    ("nvidia-container-runtime", "nvidia-container-runtime.legacy"),  # .cdi comes with the install: no base, no duplicate
])
def test_a_template_without_the_base_include_is_edited_and_warned(sandbox, binaries):
    facts = k3s_node(sandbox, NVIDIA_CTK_V2, binaries)
    assert decide_step.refusal_before_install(NodeFacts.from_reading(facts)) is None
    plan, file_changes = changes.compute(NodeFacts.from_reading(facts), {"state": "present"})
    after = file_changes[0].after
    assert after.startswith(NVIDIA_CTK_V2)  # every user line kept, byte for byte
    assert sorted(runtimes_of(after)) == ["nvidia", "nvidia-cdi", "nvidia-legacy", "runc"]
    assert "nvidia-legacy" in [r["name"] for r in plan["write"]]
    (warning,) = [w for w in plan["warnings"] if "[no_base]" in w]
    for named in ("the CNI bin and conf directories", "the sandbox (pause) image", "the registry config_path",
                  "runc's SystemdCgroup", 'add {{ template "base" . }} as the first line',
                  "remove the tables the base renders"):
        assert named in warning, named
    assert "missing: the registry config_path (registries.yaml)" in warning
    # idempotent
    sandbox.write(TEMPLATE_V2, after)
    assert changes.compute(NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", RELEASE)), {"state": "present"})[1] == []


def test_the_mirror_with_the_base_include_is_still_refused(sandbox):
    # with the include, the base really renders nvidia-cdi once the install brings its binary
    template = ('{{ template "base" . }}\n\n[%(t)s.runtimes.nvidia-cdi]\n  runtime_type = "io.containerd.runc.v2"\n'
                '[%(t)s.runtimes.nvidia-cdi.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime.cdi"\n' % {"t": V2})
    facts = k3s_node(sandbox, template, ("nvidia-container-runtime", "nvidia-container-runtime.legacy"))
    refusal = decide_step.refusal_before_install(NodeFacts.from_reading(facts))
    assert "already emitted by the base template of k3s %s" % RELEASE in refusal.cause
    assert "k3s renders runtime nvidia-cdi itself" in refusal.fix and refusal.fix.endswith("nothing was written")
    with pytest.raises(K3sGpuError):
        changes.compute(NodeFacts.from_reading(facts), {"state": "present"})


def test_default_runtime_and_enable_cdi_in_a_template_without_base(sandbox):
    # the schema-2 base emits the tables that hold them; a template without the base include does not
    facts = k3s_node(sandbox, NVIDIA_CTK_V2, release="v1.29.4+k3s1")
    plan, file_changes = changes.compute(NodeFacts.from_reading(facts), {"state": "present", "default_runtime": "nvidia-legacy",
                                                                         "enable_cdi": True})
    data = tomllib.loads(file_changes[0].after)
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "nvidia-legacy"
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    # the mirror, with the include: refused, naming the base
    with_base = '{{ template "base" . }}\n'
    facts = k3s_node(sandbox, with_base, release="v1.29.4+k3s1")
    with pytest.raises(K3sGpuError, match="base template already emits"):
        changes.compute(NodeFacts.from_reading(facts), {"state": "present", "default_runtime": "nvidia-legacy"})


# --- 3. gpu_node_state: absent gives the node back as it was ------------------------------------------------

def _node_files(capsys, entries):
    """Apply entries with node_files itself, as the role does (one execution)."""
    args = {"files": entries}
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            node_files.main()
    result = json.loads(capsys.readouterr().out)
    assert not result.get("failed"), result
    return result


def _role_run(sandbox, capsys, state, release, runtimes=None):
    facts = detect.gather(sandbox.root, "k3s", release, binaries=[r["binary"] for r in runtimes or []])
    params = {"state": state, "handler_labels": True, "backup": True, "runtimes": runtimes}
    plan, file_changes = changes.compute(NodeFacts.from_reading(facts), params, own_files=True)
    entries = [node_write.write_entry(c, dict(params, validate=None), own_files=True) for c in file_changes]
    return plan, file_changes, _node_files(capsys, entries) if entries else None


USER_V3 = ('{{ template "base" . }}\n\n# mine\n[%s.runtimes.mine]\n  runtime_type = "io.containerd.runc.v2"\n' % V3)


@pytest.mark.parametrize("release, user_files", [
    ("v1.33.10+k3s1", {}),  # the node: drop-ins only, nothing of the user's
    # the mirrors: a file of the user's before the first converge, one edited in place (v1.32.2 has no drop-ins)
    ("v1.33.10+k3s1", {"/etc/rancher/k3s/config.yaml.d/10-mine.yaml": "node-label: [site=a]\n"}),
    ("v1.32.2+k3s1", {"/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl": USER_V3}),
])
def test_absent_gives_the_node_back_byte_for_byte(sandbox, capsys, release, user_files):
    sandbox.k3s("k3s", "package")
    sandbox.mkdir("/run/systemd/system")
    for path, text in user_files.items():
        sandbox.write(path, text)
    before = sandbox.snapshot()
    _role_run(sandbox, capsys, "present", release)
    # a second converge that changes the files (one runtime less): backups are made, outside imported directories
    _plan, _changes, written = _role_run(sandbox, capsys, "present", release, runtimes=[
        {"name": "nvidia-legacy", "binary": "/usr/bin/nvidia-container-runtime.legacy"}])
    copies = [f["backup_file"] for f in written["files"] if f.get("backup_file")]
    assert copies and all(c.startswith(sandbox.root + "/var/backups/k3s-gpu-nvidia/") for c in copies)
    assert all(c.endswith("~") for c in copies)
    plan, file_changes, result = _role_run(sandbox, capsys, "absent", release)
    assert all(not f.get("backup_file") for f in result["files"])
    assert sandbox.snapshot() == before
    assert not sandbox.exists("/var/backups/k3s-gpu-nvidia")
    assert _role_run(sandbox, capsys, "absent", release)[1] == []


def test_removing_a_file_only_the_collection_wrote_keeps_no_copy(sandbox):
    change = FileChange(key="dropin_v3", node_path="/x/50-k3s-gpu-nvidia.toml", path="/r/x/50-k3s-gpu-nvidia.toml",
                        before=toml.MANAGED_HEADER + "\n", after=None, exists=True, parent_exists=True)
    entry = node_write.write_entry(change, {"backup": True, "validate": None})
    assert entry["backup"] is False
    user = change.replaced(key="config", node_path="/etc/containerd/config.toml", path="/r/etc/containerd/config.toml",
                           before="version = 2\n", after="version = 2\n[x]\n")
    entry = node_write.write_entry(user, {"backup": True, "validate": None})
    assert entry["backup"] is True and entry["backup_keep"] == 3
    assert entry["backup_to"] == "/r/var/backups/k3s-gpu-nvidia/etc/containerd/config.toml"


def test_backups_are_pruned_to_the_newest(tmp_path, capsys):
    target = tmp_path / "etc" / "config.toml"
    target.parent.mkdir()
    backup_to = str(tmp_path / "var" / "backups" / "k3s-gpu-nvidia" / "etc" / "config.toml")
    made = []
    for number in range(5):
        target.write_text("v%d\n" % number)
        result = _node_files(capsys, [{"path": str(target), "content": "v%d\n" % (number + 1), "backup": True,
                                       "backup_to": backup_to, "backup_keep": 3}])
        made.append(result["files"][0]["backup_file"])
        os.utime(made[-1], (number, number))  # distinct ages, whatever the clock's resolution
    kept = sorted(os.listdir(os.path.dirname(backup_to)))
    assert len(kept) == 3 and all(k.startswith("config.toml.") and k.endswith("~") for k in kept)


# --- 4. new runtimes inherit from the default runtime ---------------------------------------------------------

CONFIG = "/etc/containerd/config.toml"
NVIDIA = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy")
# crun (a runc shim with its own binary, SystemdCgroup off) as the default runtime, beside runc (SystemdCgroup on)
CRUN_DROPIN_K3S = (default_runtime("crun") + CRUN) % {"t": V3}
CRUN_DEFAULT = "version = 3\n" + CRUN_DROPIN_K3S + RUNC_SYSTEMD % {"t": V3}


def plain_node(sandbox, text, dropins=None, release="2.1.9"):
    sandbox.binary("/usr/bin/containerd")
    for binary in NVIDIA:
        sandbox.binary("/usr/bin/" + binary)
    sandbox.write(CONFIG, text)
    for name, dropin in (dropins or {}).items():
        sandbox.write("/etc/containerd/conf.d/" + name, dropin)
    return detect.gather(sandbox.root, "containerd", release)


def nvidia_tables(text, schema=3):
    runtimes = runtimes_of(text, schema)
    return dict((name, runtimes[name]) for name in ("nvidia", "nvidia-cdi", "nvidia-legacy") if name in runtimes)


@pytest.mark.parametrize("default, systemd, privileged, fallback", [
    ("crun", False, True, None),                                       # the node
    ("runc", True, None, None),                                        # the mirror: the default is runc
    ("kata", True, None, "the default runtime kata is not a runc shim"),
    ("missing", True, None, "the default runtime missing has no table"),
])
def test_plain_containerd_inherits_from_the_default_runtime(sandbox, default, systemd, privileged, fallback):
    text = CRUN_DEFAULT.replace('default_runtime_name = "crun"', 'default_runtime_name = "%s"' % default)
    if default == "kata":
        text += '[%s.runtimes.kata]\n  runtime_type = "io.containerd.kata.v2"\n  privileged_without_host_devices = true\n' % V3
    facts = NodeFacts.from_reading(plain_node(sandbox, text))
    plan, file_changes = changes.compute(facts, {"state": "present"})
    for name, table in nvidia_tables(file_changes[0].after).items():
        assert table["options"]["SystemdCgroup"] is systemd, name
        assert table["options"]["BinaryName"].startswith("/usr/bin/nvidia-container-runtime")  # never crun's
        assert table.get("privileged_without_host_devices") is privileged, name
    source = changes.result_fields(facts, plan)["inherited_from"]
    assert source["runtime"] == ("crun" if default == "crun" else "runc")
    assert source["default_runtime"] == default
    assert (source["fallback"] is None) == (fallback is None)
    if fallback:
        assert fallback in source["fallback"]
        assert any("runc's, because " + fallback in note for note in plan["notes"])


def test_a_plain_dropin_follows_another_dropin_that_names_the_default(sandbox):
    root = 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n' + CRUN_DEFAULT.split("\n", 1)[1].replace(
        'default_runtime_name = "crun"', 'default_runtime_name = "runc"')
    dropin = 'version = 3\n[%s]\n  default_runtime_name = "crun"\n' % V3
    plan, file_changes = changes.compute(NodeFacts.from_reading(plain_node(sandbox, root, {"10-default.toml": dropin})), {"state": "present"})
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    nvidia = nvidia_tables(file_changes[0].after)["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is False and nvidia["privileged_without_host_devices"] is True


def systemd_k3s_changes(sandbox, release, files=()):
    """changes.compute on a k3s node that systemd runs, with these (path, text) files written first."""
    sandbox.k3s("k3s", "package")
    sandbox.mkdir("/run/systemd/system")
    for path, text in files:
        sandbox.write(path, text)
    return changes.compute(NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", release)), {"state": "present"})


def test_k3s_dropin_follows_a_users_dropin_that_makes_another_runtime_the_default(sandbox):
    plan, file_changes = systemd_k3s_changes(sandbox, "v1.33.10+k3s1", [
        ("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/10-crun.toml", CRUN_DROPIN_K3S)])
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    legacy = nvidia_tables(file_changes[0].after)["nvidia-legacy"]
    assert legacy["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime.legacy", "SystemdCgroup": False}
    assert legacy["privileged_without_host_devices"] is True


def test_k3s_template_that_makes_another_runtime_the_default(sandbox):
    plan, file_changes = systemd_k3s_changes(sandbox, "v1.32.2+k3s1", [
        ("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", '{{ template "base" . }}\n\n' + CRUN_DROPIN_K3S)])
    assert plan["target"]["mode"] == planner.MODE_TEMPLATE
    legacy = nvidia_tables(file_changes[0].after)["nvidia-legacy"]
    assert legacy["options"]["SystemdCgroup"] is False and legacy["privileged_without_host_devices"] is True


def test_k3s_without_another_default_keeps_k3s_systemd_cgroup(sandbox):
    # the mirror: nothing names another default, so the new runtimes get SystemdCgroup as k3s gives its own
    plan, file_changes = systemd_k3s_changes(sandbox, "v1.33.10+k3s1")
    legacy = nvidia_tables(file_changes[0].after)["nvidia-legacy"]
    assert legacy["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime.legacy", "SystemdCgroup": True}
    assert "privileged_without_host_devices" not in legacy
