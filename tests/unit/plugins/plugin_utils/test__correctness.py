# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 27: a user's own table of a runtime the release renders is refused by name, never deleted; a template
without the base include is what k3s renders alone, so it is edited (with a warning), not refused for a base it
never executes; an absent run leaves the node as it was; new runtimes inherit from the default runtime."""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _toml as toml

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

# what `nvidia-ctk runtime configure --config config.toml.tmpl` writes: plain TOML, no base include
CTK_TEMPLATE = """version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "rancher/mirrored-pause:3.6"

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/var/lib/rancher/k3s/data/current/bin"
      conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi.options]
            BinaryName = "/usr/bin/nvidia-container-runtime.cdi"
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
"""


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
    with pytest.raises(toml.TomlEditError) as info:
        changes.compute(facts, {"state": "present", "backup": True})
    message = str(info.value)
    assert "line 3: [%s.runtimes.nvidia]" % V2 in message
    assert "renders runtime nvidia itself (it detects /usr/bin/nvidia-container-runtime)" in message
    assert "options.SystemdCgroup false \u2192 true" in message  # the very reason the table was there
    assert "a runtime name of your own (such as nvidia-custom)" in message
    assert "release's own nvidia table" in message
    assert "[duplicate_table]" in message and message.endswith("Nothing was written")
    assert sandbox.snapshot() == before


def test_the_rule_holds_for_every_runtime_the_release_renders(sandbox):
    # nvidia-cdi, detected like nvidia, with a key of the user's that the release never renders
    template = USER_NVIDIA.replace("runtimes.nvidia", "runtimes.nvidia-cdi").replace(
        "nvidia-container-runtime\"", "nvidia-container-runtime.cdi\"").replace(
        "SystemdCgroup = false", "SystemdCgroup = true\n  NoNewKeyring = true")
    with pytest.raises(toml.TomlEditError) as info:
        changes.compute(k3s_node(sandbox, template), {"state": "present"})
    assert "runtime nvidia-cdi itself" in str(info.value)
    assert "options.NoNewKeyring true \u2192 (unset)" in str(info.value)


def test_a_block_exactly_as_this_module_writes_it_goes_when_the_release_renders_it(sandbox):
    # the mirror: our own block from before k3s detected the runtime (same values as the release's) is taken out
    ours = USER_NVIDIA.replace("SystemdCgroup = false", "SystemdCgroup = true")
    plan, file_changes = changes.compute(k3s_node(sandbox, ours), {"state": "present"})
    assert plan["removed_for_base"] == ["nvidia"]
    assert "nvidia" not in runtimes_of(file_changes[0]["after"])


def test_a_users_existing_table_keeps_its_settings(sandbox):
    # a runtime the release does not render: only runtime_type and BinaryName are the task's; the user's
    # SystemdCgroup stays, and a value that has to change is named
    template = USER_NVIDIA.replace("runtimes.nvidia", "runtimes.nvidia-legacy").replace(
        '"/usr/bin/nvidia-container-runtime"', '"/opt/old/nvidia-container-runtime.legacy"')
    plan, file_changes = changes.compute(k3s_node(sandbox, template), {"state": "present", "backup": True})
    legacy = runtimes_of(file_changes[0]["after"])["nvidia-legacy"]
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
    facts = k3s_node(sandbox, CTK_TEMPLATE, binaries)
    assert changes.refusal_before_install(facts) is None
    plan, file_changes = changes.compute(facts, {"state": "present"})
    after = file_changes[0]["after"]
    assert after.startswith(CTK_TEMPLATE)  # every user line kept, byte for byte
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
    assert changes.compute(detect.gather(sandbox.root, "k3s", RELEASE), {"state": "present"})[1] == []


def test_the_mirror_with_the_base_include_is_still_refused(sandbox):
    # with the include, the base really renders nvidia-cdi once the install brings its binary
    template = ('{{ template "base" . }}\n\n[%(t)s.runtimes.nvidia-cdi]\n  runtime_type = "io.containerd.runc.v2"\n'
                '[%(t)s.runtimes.nvidia-cdi.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime.cdi"\n' % {"t": V2})
    facts = k3s_node(sandbox, template, ("nvidia-container-runtime", "nvidia-container-runtime.legacy"))
    refusal = changes.refusal_before_install(facts)
    assert "already emitted by the base template of k3s %s" % RELEASE in refusal
    with pytest.raises(toml.TomlEditError):
        changes.compute(facts, {"state": "present"})


def test_default_runtime_and_enable_cdi_in_a_template_without_base(sandbox):
    # the schema-2 base emits the tables that hold them; a template without the base include does not
    facts = k3s_node(sandbox, CTK_TEMPLATE, release="v1.29.4+k3s1")
    plan, file_changes = changes.compute(facts, {"state": "present", "default_runtime": "nvidia-legacy",
                                                 "enable_cdi": True})
    data = tomllib.loads(file_changes[0]["after"])
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "nvidia-legacy"
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    # the mirror, with the include: refused, naming the base
    with_base = '{{ template "base" . }}\n'
    facts = k3s_node(sandbox, with_base, release="v1.29.4+k3s1")
    with pytest.raises(planner.PlanError, match="base template already emits"):
        changes.compute(facts, {"state": "present", "default_runtime": "nvidia-legacy"})
