# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""TOML rendering, merge and removal: bytes outside our tables kept, template lines kept,
no table the base template emits, clear errors on bad input."""

from __future__ import annotations

import difflib
import os
import tomllib

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _render as render

LEGACY = "/usr/bin/nvidia-container-runtime.legacy"
TEMPLATE_V3 = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"

USER_TEMPLATE = """# site template: keep this comment
{{ template "base" . }}

# private mirror auth, with a Go value inside a string
[plugins.'io.containerd.cri.v1.images'.registry.configs."registry.local".auth]
  username = "{{ .NodeConfig.AgentConfig.NodeName }}"   # inline comment
{{- if .NodeConfig.AgentConfig.Snapshotter }}
# snapshotter-only tweak
{{- end }}

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia-legacy']
  runtime_type = "io.containerd.runc.v2"
  privileged_without_host_devices = true   # user's own key, kept
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia-legacy'.options]
  BinaryName = "/old/nvidia-container-runtime.legacy"

# trailing comment belongs to the user
"""


def facts_for(sandbox, release="v1.31.6+k3s1", layout="package", distribution="k3s", **kwargs):
    sandbox.k3s(distribution, layout) if distribution != "containerd" else None
    return detect.gather(sandbox.root, distribution, release, **kwargs)


def compute(facts, **params):
    return changes.compute(NodeFacts.from_reading(facts), params)


def changed_lines(before, after):
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_render_quotes_keys_with_the_library():
    text = toml.render_runtime_blocks(2, [{"name": "nvidia-legacy", "binary": LEGACY, "runtime_type": "io.containerd.runc.v2",
                                          "options": {"NoNewKeyring": True}, "systemd_cgroup": True}])
    assert text.splitlines() == [
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy]',
        '  runtime_type = "io.containerd.runc.v2"',
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy.options]',
        '  BinaryName = "/usr/bin/nvidia-container-runtime.legacy"',
        '  SystemdCgroup = true',
        '  NoNewKeyring = true',
    ]
    data = tomllib.loads(toml.render_runtime_blocks(3, [{"name": "x", "binary": '/a "b"\n', "runtime_type": "t", "options": {}}]))
    assert data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["x"]["options"]["BinaryName"] == '/a "b"\n'


def test_user_template_edited_in_place(sandbox):
    facts = facts_for(sandbox)
    sandbox.write(TEMPLATE_V3, USER_TEMPLATE)
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    plan, file_changes = compute(facts)
    assert plan["target"]["path"] == TEMPLATE_V3
    after = file_changes[0].after
    # only the managed table's own lines changed
    assert changed_lines(USER_TEMPLATE, after) == [
        '-  BinaryName = "/old/nvidia-container-runtime.legacy"',
        '+  BinaryName = "/usr/bin/nvidia-container-runtime.legacy"',
        '+  SystemdCgroup = false',
    ]
    # second run: nothing to change
    sandbox.write(TEMPLATE_V3, after)
    assert compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))[1] == []


def test_missing_options_table_goes_right_after_its_runtime(sandbox):
    facts_for(sandbox)
    text = ('{{ template "base" . }}\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy]\n'
            '  runtime_type = "io.containerd.runc.v2"\n\n# next\n[z]\n  a = 1\n')
    sandbox.write(TEMPLATE_V3, text)
    _plan, file_changes = compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))
    after = file_changes[0].after.splitlines()
    assert after[3] == '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy.options]'
    assert after[-3:] == ["# next", "[z]", "  a = 1"]


def test_absent_removes_only_our_tables(sandbox):
    facts_for(sandbox)
    sandbox.write(TEMPLATE_V3, USER_TEMPLATE)
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    _plan, file_changes = compute(facts, state="absent")
    after = file_changes[0].after
    removed = changed_lines(USER_TEMPLATE, after)
    assert all(line.startswith("-") for line in removed)
    assert len(removed) == 5
    assert "{{- if .NodeConfig.AgentConfig.Snapshotter }}" in after and "# trailing comment belongs to the user" in after
    assert after.startswith("# site template: keep this comment\n{{ template \"base\" . }}\n")


def test_created_template_removed_when_nothing_is_missing(sandbox):
    facts = facts_for(sandbox)
    _plan, file_changes = compute(facts)
    sandbox.write(TEMPLATE_V3, file_changes[0].after)
    sandbox.write("/usr/bin/nvidia-container-runtime.legacy", "")  # stays, but state=absent below
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    _plan, file_changes = compute(facts, state="absent")
    assert file_changes[0].after is None  # our own file, now empty: removed


def test_upgrade_to_dropin_release_moves_our_blocks(sandbox):
    facts = facts_for(sandbox)
    _plan, file_changes = compute(facts)
    sandbox.write(TEMPLATE_V3, file_changes[0].after)
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    plan, file_changes = compute(facts)
    assert plan["target"]["mode"] == "dropin"
    by_path = dict((c.node_path, c.after) for c in file_changes)
    assert by_path[TEMPLATE_V3] is None
    assert "nvidia-legacy" in by_path["/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"]


def test_table_base_now_emits_is_taken_out_of_our_template(sandbox):
    # written on v1.28.14 (no nvidia-cdi detection), then k3s upgraded to v1.28.15
    facts = facts_for(sandbox, "v1.28.14+k3s1")
    _plan, file_changes = compute(facts)
    path = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    first = file_changes[0].after
    assert "nvidia-cdi" in first
    sandbox.write(path, first)
    plan, file_changes = compute(detect.gather(sandbox.root, "k3s", "v1.28.15+k3s1"))
    after = file_changes[0].after
    assert "nvidia-cdi" not in after and "nvidia-legacy" in after
    assert plan["removed_for_base"] == ["nvidia-cdi"]


def test_user_table_that_base_emits_is_refused(sandbox):
    facts_for(sandbox)
    bad = '{{ template "base" . }}\n\n[plugins.\'io.containerd.cri.v1.runtime\'.containerd.runtimes.runc]\n  cgroup_writable = true\n'
    sandbox.write(TEMPLATE_V3, bad)
    with pytest.raises(K3sGpuError, match=r"line 3: .*already emitted by the base template of k3s v1.31.6\+k3s1"):
        compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))


def test_frozen_template_without_base(sandbox):
    facts_for(sandbox, layout="package")
    frozen = ('version = 3\n[plugins.\'io.containerd.cri.v1.runtime\'.containerd.runtimes.runc]\n'
              '  runtime_type = "io.containerd.runc.v2"\n')
    sandbox.write(TEMPLATE_V3, frozen)
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    plan, file_changes = compute(facts)
    # a frozen copy ignores drop-ins and renders no detected runtimes: edit it, with all three
    assert plan["target"]["mode"] == "template"
    assert set(r["name"] for r in plan["write"]) == {"nvidia", "nvidia-cdi", "nvidia-legacy"}
    assert file_changes[0].after.startswith(frozen)


def test_plain_containerd_1x_keeps_runc(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", "version = 2\n\n# ops team\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n")
    facts = detect.gather(sandbox.root, "containerd", "1.6.20")
    plan, file_changes = compute(facts, enable_cdi=None)
    data = tomllib.loads(file_changes[0].after)
    runtimes = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "nvidia"}
    assert any("runc block" in note for note in plan["notes"])
    assert file_changes[0].after.startswith(file_changes[0].before.rstrip("\n"))


def test_plain_containerd_default_runtime_and_cdi(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = false\n"
                  "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n"
                  "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
                  "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    facts = detect.gather(sandbox.root, "containerd", "1.7.24")
    _plan, file_changes = compute(facts, enable_cdi=True, default_runtime="nvidia")
    after = file_changes[0].after
    data = tomllib.loads(after)["plugins"]["io.containerd.grpc.v1.cri"]
    assert data["enable_cdi"] is True
    assert data["containerd"]["default_runtime_name"] == "nvidia"
    assert data["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True  # follows runc
    assert len(changed_lines(file_changes[0].before, after)) == 2 + 2 + 6


def test_plain_containerd_dropin_when_imported_and_deep_merge(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    plan, file_changes = compute(detect.gather(sandbox.root, "containerd", "2.1.4"))
    assert plan["target"]["path"] == "/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml"
    plan, _c = compute(detect.gather(sandbox.root, "containerd", "2.0.5"))
    assert plan["target"]["path"] == "/etc/containerd/config.toml"


BAD_INPUT = [
    ("malformed", "version = 3\n[plugins\n", "line 2"),
    ("unbalanced", '{{ template "base" .\n', "line 1: unclosed action .*parse_error"),
    ("duplicate", "[a]\nx = 1\n[a]\ny = 2\n", "line 3"),
]


@pytest.mark.parametrize("name,text,message", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_template_text(sandbox, name, text, message):
    facts_for(sandbox)
    sandbox.write(TEMPLATE_V3, text)
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError, match=message) as info:
        compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))
    assert TEMPLATE_V3 in str(info.value)
    assert sandbox.snapshot() == before


def test_template_action_inside_managed_table_is_refused(sandbox):
    facts_for(sandbox)
    sandbox.write(TEMPLATE_V3, '{{ template "base" . }}\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy]\n'
                  '  runtime_type = "io.containerd.runc.v2"\n{{ if .X }}\n  privileged_without_host_devices = true\n{{ end }}\n')
    with pytest.raises(K3sGpuError, match="line 4: a Go template action sits inside the table"):
        compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))


def test_scan_ignores_brackets_in_strings_and_arrays():
    lines = ['a = """', "[not.a.table]", '"""', "b = [", "  [1, 2]", "]", "[real.'one']", "x = '[x]'"]
    tables = toml.scan_tables(lines)
    assert [(t.path, t.start) for t in tables] == [(("real", "one"), 6)]


@pytest.mark.parametrize("text,expected", [
    ('plugins."io.containerd.grpc.v1.cri".containerd', ("plugins", "io.containerd.grpc.v1.cri", "containerd")),
    ("a . 'b.c' . d-e", ("a", "b.c", "d-e")),
    ('"a\\u0041"', ("aA",)),
])
def test_parse_key(text, expected):
    assert toml.parse_key(text) == expected


def test_overlapping_edits_are_refused_not_dropped():
    edit = toml.Edit(["[a]", "x = 1", "[b]"])
    edit.replace(0, 2, [])
    with pytest.raises(K3sGpuError, match="overlapping edits"):
        edit.replace(1, 2, ["x = 2"])


def test_absent_with_explicit_names_removes_our_file(sandbox):
    facts_for(sandbox)
    _plan, file_changes = compute(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))
    sandbox.write(TEMPLATE_V3, file_changes[0].after)
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    plan, file_changes = compute(facts, state="absent",
                                 runtimes=[{"name": "nvidia-legacy"}, {"name": "nvidia-cdi"}])
    assert file_changes[0].after is None


# --- node labels in the config.yaml.d file -------------------------------------------------------

def _yaml_change(file_changes, key="default_runtime_file"):
    return next((c for c in file_changes if c.key == key), None)


def test_handler_labels_share_the_file_with_the_default_runtime(sandbox):
    facts = facts_for(sandbox, release="v1.33.10+k3s1")
    plan, file_changes = compute(facts, default_runtime="nvidia", handler_labels=True)
    assert plan["node_labels"] == ["k3s-gpu.nvidia/handler.nvidia=true", "k3s-gpu.nvidia/handler.nvidia-cdi=true",
                                   "k3s-gpu.nvidia/handler.nvidia-legacy=true"]
    text = _yaml_change(file_changes).after
    assert text == (toml.MANAGED_YAML_HEADER + '\ndefault-runtime: "nvidia"\nnode-label+:\n'
                    '  - "k3s-gpu.nvidia/handler.nvidia=true"\n  - "k3s-gpu.nvidia/handler.nvidia-cdi=true"\n'
                    '  - "k3s-gpu.nvidia/handler.nvidia-legacy=true"\n')
    assert yaml.safe_load(text) == {"default-runtime": "nvidia", "node-label+": plan["node_labels"]}


def test_handler_labels_false_owns_the_file_and_removes_an_old_default(sandbox):
    facts = facts_for(sandbox, release="v1.33.10+k3s1")
    sandbox.write("/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml", toml.MANAGED_YAML_HEADER + '\ndefault-runtime: "nvidia"\n')
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    # unset: the default set earlier stays (the module's behaviour before labels)
    assert _yaml_change(compute(facts)[1]) is None
    change = _yaml_change(compute(facts, handler_labels=False)[1])
    assert change.after is None and change.exists
    labels_only = _yaml_change(compute(facts, handler_labels=True)[1]).after
    assert "default-runtime" not in labels_only and "node-label+:" in labels_only


def test_handler_labels_take_over_the_roles_old_labels_file(sandbox):
    facts_for(sandbox, release="v1.33.10+k3s1")
    old = "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia-labels.yaml"
    sandbox.write(old, "# Managed by k3s_gpu.nvidia (gpu_node): one label per NVIDIA runtime handler of this node.\n"
                       "node-label+:\n  - \"k3s-gpu.nvidia/handler.nvidia=true\"\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    change = _yaml_change(compute(facts, handler_labels=True)[1], "labels_file_legacy")
    assert change.node_path == old and change.after is None
    # a file of that name someone else wrote is left alone
    sandbox.write(old, "node-label+:\n  - mine=true\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert _yaml_change(compute(facts, handler_labels=True)[1], "labels_file_legacy") is None


def test_handler_labels_use_the_prefix_runtimeclasses_select():
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as rc
    plan = EditPlan.of({"target": {}, "write": [{"name": "nvidia-legacy"}], "skip": [{"name": "nvidia"}, {"name": "crun"}]})
    assert render.node_labels(plan) == ["%s=true" % rc.handler_label("nvidia"), "%s=true" % rc.handler_label("nvidia-legacy")]


def test_our_block_for_a_runtime_that_went_away_is_removed(sandbox):
    """Toolkit removed (operator mode) or a binary gone: our own file must not keep a block for a missing binary."""
    facts = facts_for(sandbox, release="v1.28.15+k3s1", layout="package")
    _plan, file_changes = compute(facts)
    template = file_changes[0]
    assert "nvidia-legacy" in template.after
    sandbox.write(template.node_path, template.after)
    for binary in ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
                   "/usr/bin/nvidia-container-runtime.legacy"):
        os.remove(sandbox.path(binary))
    plan, file_changes = compute(detect.gather(sandbox.root, "k3s", "v1.28.15+k3s1"))
    assert plan["removed_stale"] == ["nvidia-legacy"]
    assert [(c.node_path, c.after) for c in file_changes] == [(template.node_path, None)]
    assert changes.result_fields(NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", "v1.28.15+k3s1")), plan)["runtimes_removed"] == ["nvidia-legacy"]


def test_a_user_template_keeps_its_own_nvidia_block(sandbox):
    """Only a file we created is pruned; a user's template edited in place keeps what the user wrote."""
    facts_for(sandbox, release="v1.28.15+k3s1", layout="nothing")
    path = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    sandbox.write(path, '{{ template "base" . }}\n\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy]\n'
                        '  runtime_type = "io.containerd.runc.v2"\n')
    _plan, file_changes = compute(detect.gather(sandbox.root, "k3s", "v1.28.15+k3s1"))
    assert file_changes == []
