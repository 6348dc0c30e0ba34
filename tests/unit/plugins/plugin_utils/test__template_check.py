# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The template model's own rules: undecidable branches rendered both ways, the line a finding names,
the outcome table in the docs, the drop-in release checking the template it does not edit, and the
release rows (fields and functions) it reads."""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _gotemplate as gotemplate
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as check
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

V3 = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
RUNC = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
RENDERING = k3s_base.Rendering.__init__
DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "template-outcomes.md")


def facts(sandbox, release="v1.33.10+k3s1", template=None, layout="nothing"):
    sandbox.k3s("k3s", layout)
    if template is not None:
        sandbox.write(V3, template)
    return detect.gather(sandbox.root, "k3s", release)


def codes(report, when=None):
    return sorted(set(f.code for f in report.findings if when is None or f.when == when))


def test_a_branch_that_cannot_be_decided_is_rendered_both_ways(sandbox):
    # IsRunningInUserNS is false on most nodes: the typical rendering is fine, the other way is not
    text = '{{ template "base" . }}\n{{ if .IsRunningInUserNS }}\n' + RUNC + "{{ end }}\n"
    report = check.check(text, V3, NodeFacts.from_reading(facts(sandbox)), 3)
    assert codes(report) == ["duplicate_table"] and report.runs >= 2
    finding = report.refusals[0]
    assert finding.line == 3 and "when the condition on line 2 goes the other way" in finding.message


def test_a_branch_decided_by_what_the_node_detects_is_not_guessed(sandbox):
    # .ExtraRuntimes is known: k3s detects nothing, so the guarded table is rendered and is no duplicate
    text = '{{ template "base" . }}\n{{ if not (index .ExtraRuntimes "nvidia").BinaryName }}\n' \
           "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = \"x\"\n{{ end }}\n"
    report = check.check(text, V3, NodeFacts.from_reading(facts(sandbox)), 3)
    assert report.findings == [] and report.runs == 2  # now, and after the install (where the guard is false)


def test_explore_runs_every_combination_while_it_fits_and_says_when_not():
    conditions = "".join("{{ if .B%d }}%d{{ end }}" % (n, n) for n in range(6))
    type_ = {"kind": "struct", "name": "T", "open": False,
             "fields": dict(("B%d" % n, {"kind": "bool"}) for n in range(6))}
    data = gotemplate.Struct(type_, dict(("B%d" % n, gotemplate.Unknown({"kind": "bool"})) for n in range(6)))
    template = gotemplate.parse(conditions)
    runs, complete = gotemplate.explore(template, data, limit=64)
    assert complete and len(runs) == 64 and len(set(r.output.text() for r in runs)) == 64
    runs, complete = gotemplate.explore(template, data, limit=7)
    assert not complete and len(runs) == 7
    # the first n+1 runs take each branch of n independent conditions once
    assert set(r.output.text() for r in runs) >= {"012345"} and all(
        any(str(n) not in r.output.text() for r in runs) for n in range(6))


def test_the_base_included_twice_names_the_second_include(sandbox):
    text = '{{ template "base" . }}\n# {{ template "base" . }}\n'
    report = check.check(text, V3, NodeFacts.from_reading(facts(sandbox)), 3)
    assert codes(report) == ["action_in_comment", "duplicate_table"]
    assert [f.line for f in report.refusals] == [2]


def test_a_user_define_named_base_is_replaced_by_the_stock_base(sandbox):
    text = '{{ define "base" }}nothing{{ end }}{{ template "base" . }}\n'
    assert check.check(text, V3, NodeFacts.from_reading(facts(sandbox)), 3).findings == []


def test_fields_and_functions_follow_the_release():
    old = distro.profile("k3s", "v1.33.5+k3s1")
    new = distro.profile("k3s", "v1.33.10+k3s1")
    assert "NoFlannel" in check.data_type(old)["fields"]["NodeConfig"]["fields"]
    assert "NoFlannel" not in check.data_type(new)["fields"]["NodeConfig"]["fields"]
    assert "Flannel" in check.data_type(new)["fields"]["NodeConfig"]["fields"]
    assert "filepathjoin" not in check.k3s_funcs(old) and "filepathjoin" in check.k3s_funcs(new)
    assert check.k3s_funcs(distro.profile("k3s", "v1.29.0+k3s1")) == ()


def test_a_field_gone_from_the_release_is_refused_and_one_it_still_has_is_not(sandbox):
    text = '{{ template "base" . }}\n{{ if .NodeConfig.NoFlannel }}# no flannel{{ end }}\n'
    assert codes(check.check(text, V3, NodeFacts.from_reading(facts(sandbox, "v1.33.5+k3s1")), 3)) == []
    report = check.check(text, V3, NodeFacts.from_reading(facts(sandbox, "v1.33.7+k3s1")), 3)
    assert codes(report) == ["missing_field"] and report.refusals[0].line == 2


def test_upgrade_findings_never_refuse_the_current_run(sandbox):
    text = '{{ template "base" . }}\n{{ if .NodeConfig.NoFlannel }}# no flannel{{ end }}\n'
    node = facts(sandbox, "v1.33.5+k3s1", text)
    report = check.check(text, V3, NodeFacts.from_reading(node), 3, target_profile=distro.profile("k3s", "v1.34.3+k3s1"))
    assert report.refusals == [] and report.outcome == "warn"
    assert [(f.code, f.when, f.severity) for f in report.upgrade] == [("removed_field", "upgrade", "warn")]
    plan, _changes = changes.compute(NodeFacts.from_reading(node), {"target_release": "v1.34.3+k3s1"})
    assert [f["code"] for f in plan["upgrade_findings"]] == ["removed_field"]


def test_a_drop_in_release_checks_the_template_it_does_not_edit(sandbox):
    node = facts(sandbox, template='{{ template "base" . }}\n' + RUNC, layout="legacy_only")
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError, match=r"line 2: .*runtimes.runc\] is already emitted .*\[duplicate_table\]"):
        changes.compute(NodeFacts.from_reading(node), {})
    assert sandbox.snapshot() == before


def test_a_drop_in_release_with_a_broken_template_writes_no_drop_in(sandbox):
    node = facts(sandbox, template='{{ template "base" . }}\n[plugins\n', layout="legacy_only")
    with pytest.raises(K3sGpuError, match=r"not valid TOML.*\[toml_invalid\]; fix that line.*; nothing was written$"):
        changes.compute(NodeFacts.from_reading(node), {})


def test_the_module_refuses_before_the_install_what_the_install_breaks(sandbox):
    own_nvidia = '{{ template "base" . }}\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n' \
                 '  runtime_type = "io.containerd.runc.v2"\n'
    node = facts(sandbox, template=own_nvidia)  # no toolkit yet: k3s detects nothing
    with pytest.raises(K3sGpuError, match=r"\[after_install_duplicate\]; k3s renders runtime nvidia itself"):
        changes.compute(NodeFacts.from_reading(node), {})


def test_a_refusal_keeps_each_findings_fix_apart_from_the_causes():
    report = check.Report("/t.tmpl")
    report.add(check.Finding("parse_error", 3, "unexpected }}", "fix the action on that line"))
    assert report.refusal().cause == "/t.tmpl: line 3: unexpected }} [parse_error]"
    assert report.refusal().fix == "fix the action on that line; nothing was written"
    report.add(check.Finding("duplicate_table", 7, "the table nvidia is emitted twice", "remove your table"))
    error = report.refusal()
    assert error.cause == ("/t.tmpl: line 3: unexpected }} [parse_error]; "
                           "/t.tmpl: line 7: the table nvidia is emitted twice [duplicate_table]")
    assert error.fix == ("line 3 [parse_error]: fix the action on that line; line 7 [duplicate_table]: remove your table; "
                         "nothing was written")
    assert str(error) == "%s; %s" % (error.cause, error.fix)


def test_our_own_block_is_no_after_install_duplicate(sandbox):
    # a toolkit outside every searched dir: the module writes nvidia itself on a template release
    sandbox.k3s("k3s", "custom_off_path")
    node = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", toolkit_dirs=["/opt/nvidia/bin"])
    plan, file_changes = changes.compute(NodeFacts.from_reading(node), {})
    assert "nvidia" in [r["name"] for r in plan["write"]] and plan["template_outcome"] == "edit"
    sandbox.write(file_changes[0].node_path, file_changes[0].after)
    node = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", toolkit_dirs=["/opt/nvidia/bin"])
    assert changes.compute(NodeFacts.from_reading(node), {})[1] == []


@pytest.mark.parametrize("release,layout,template", [
    ("v1.31.6+k3s1", "custom_off_path", None),  # the template the module edits in place
    ("v1.33.10+k3s1", "package", '{{ template "base" . }}\n# the node team\n'),  # a drop-in beside the user's template
])
def test_the_base_is_worked_out_once_per_task(sandbox, monkeypatch, release, layout, template):
    # the template check, the release's own runtime tables and the layers under a drop-in read one rendering (the
    # node side's planner asks only which tables the base emits: _plan.reserved_tables)
    sandbox.k3s("k3s", layout)
    if template is not None:
        sandbox.write(V3, template)
    node = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", release, toolkit_dirs=["/opt/nvidia/bin"]))
    worked_out = []
    monkeypatch.setattr(k3s_base.Rendering, "__init__", lambda self, *args: worked_out.append(args) or RENDERING(self, *args))
    plan, _file_changes = changes.compute(node, {})
    assert plan["template_outcome"] in ("edit", "fine") and plan["write"], plan
    assert len(worked_out) == 1, worked_out


def test_a_users_own_keys_in_a_table_k3s_now_renders_are_not_dropped(sandbox):
    text = '{{ template "base" . }}\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n' \
           '  runtime_type = "io.containerd.runc.v2"\n  privileged_without_host_devices = true\n'
    node = facts(sandbox, "v1.31.6+k3s1", text, layout="package")
    with pytest.raises(K3sGpuError, match="line 2: .*runtimes.nvidia.* is already emitted"):
        changes.compute(NodeFacts.from_reading(node), {})


def test_normalize_encoding_is_an_explicit_opt_in(sandbox):
    text = '\ufeff{{ template "base" . }}\r\n# site\r\n'
    node = facts(sandbox, "v1.31.6+k3s1", text, layout="legacy_only")
    with pytest.raises(K3sGpuError, match=r"byte order mark.*\[encoding_bom\].*CR line endings.*\[encoding_crlf\]"):
        changes.compute(NodeFacts.from_reading(node), {})
    plan, file_changes = changes.compute(NodeFacts.from_reading(node), {"normalize_encoding": True})
    after = file_changes[0].after
    assert not after.startswith("\ufeff") and "\r" not in after and "# site\n" in after
    assert any("normalized the encoding" in note for note in plan["notes"])


def test_every_code_is_in_the_outcome_table_with_its_outcome():
    with open(DOCS, encoding="utf-8") as handle:
        rows = dict(re.findall(r"^\| `([a-z_0-9]+)` \| ([a-z]+)", handle.read(), re.M))
    assert set(rows) == set(check.CODES)
    for code, (severity, _what) in check.CODES.items():
        assert rows[code] == severity, code


def test_the_role_refuses_before_installing_the_toolkit(sandbox):
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
    from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
    settings = {"force": True, "root": "/", "mode": "host", "operator_toolkit": True, "operator_driver": "auto",
                "toolkit_install": True, "driver_install": False, "driver_reboot": "if_needed", "default_runtime": "",
                "remove_operator_leftovers": False, "local_connection": False}
    own_nvidia = '{{ template "base" . }}\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n' \
                 '  runtime_type = "io.containerd.runc.v2"\n'
    node = facts(sandbox, template=own_nvidia)
    node["files"]["template_v3"]["content"] = own_nvidia  # as runtime_info returns it with include_content
    with pytest.raises(K3sGpuError, match=r"gpu1: the NVIDIA toolkit is not installed, because .*line 2: .*"
                       r"\[after_install_duplicate\]"):
        host_step.plan_host(NodeFacts.from_reading(node), settings, "gpu1")
    fine = NodeFacts.from_reading(facts(sandbox, template='{{ template "base" . }}\n'))
    assert host_step.plan_host(fine, settings, "gpu1").mode.install_toolkit is True
    assert host_step.plan_host(NodeFacts.from_reading(node), dict(settings, toolkit_install=False), "gpu1").selected


def test_a_dra_node_is_refused_before_the_toolkit_install_where_a_file_turns_cdi_off(sandbox):
    """On a DRA node the files as they are now must not keep claims from CDI; only what a file sets counts there (the
    role's own edit turns CDI on later where the release has it off by default)."""
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
    settings = {"force": True, "root": "/", "mode": "host", "operator_toolkit": True, "operator_driver": "auto",
                "toolkit_install": True, "driver_install": False, "driver_reboot": "if_needed", "default_runtime": "",
                "remove_operator_leftovers": False, "local_connection": False, "allocation": "dra"}
    dropin = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/40-site.toml"
    facts(sandbox, release="v1.36.3+k3s1")
    sandbox.write(dropin, '[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n')
    node = detect.gather(sandbox.root, "k3s", "v1.36.3+k3s1")
    with pytest.raises(K3sGpuError, match=r"gpu1: the NVIDIA toolkit is not installed, because .*40-site.toml: line 2: "
                                          r"enable_cdi is false .*\[cdi_off_for_claims\]"):
        host_step.plan_host(NodeFacts.from_reading(node), settings, "gpu1")
    # the same node as a device-plugin node, and a DRA node whose files say nothing of CDI: no refusal
    assert host_step.plan_host(NodeFacts.from_reading(node), dict(settings, allocation="device_plugin"), "gpu1").selected
    sandbox.write(dropin, "# nothing of CDI\n")
    clean = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", "v1.36.3+k3s1"))
    assert claims_cdi.refusal_now(clean) is None and host_step.plan_host(clean, settings, "gpu1").mode.install_toolkit


def test_containerd_runtimes_allocation_dra_asks_cdi_on_of_a_containerd_that_has_it_off_by_default(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", "version = 2\n")
    node = NodeFacts.from_reading(detect.gather(sandbox.root, "containerd", "1.7.24",
                                                binaries=["/usr/bin/nvidia-container-runtime"]))
    runtimes = [{"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime"}]
    with pytest.raises(K3sGpuError, match=r"enable_cdi is off by default \(containerd 1.7\) .*\[cdi_off_for_claims\].*"
                                          r"turn CDI on \(gpu_node_enable_cdi: true"):
        changes.compute(node, {"runtimes": runtimes, "allocation": "dra"})
    _plan, file_changes = changes.compute(node, {"runtimes": runtimes, "allocation": "dra", "enable_cdi": True})
    assert "enable_cdi = true" in file_changes[0].after
    assert changes.compute(node, {"runtimes": runtimes})[1]  # a device-plugin node keeps containerd's default
