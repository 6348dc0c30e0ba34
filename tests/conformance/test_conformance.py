# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every engine case loaded by real containerd, at three levels.

1. `containerd config dump` with the release's containerd major (1.6 and 1.7 for the schema-2
   k3s releases, 2.x for schema 3): exit 0, every expected handler with its runtime_type and
   BinaryName, and on 2.x no `Ignoring unknown key` warning.
2. The daemon (private root, state, short socket): CRI plugin `ok`, and CRI Status(verbose) lists
   every expected handler with its runtime type and BinaryName.
3. Pods through CRI with runtime_handler = each NVIDIA handler, once per way a handler comes to
   be (rendered by the base template, written by us into a template, a drop-in or a plain
   config) and per containerd major: the wrapper named by BinaryName logs the create call, and
   the container's output is read back.

Levels 2 and 3 load each distinct composed config once (identical text once the sandbox path is
factored out); the summary at the end maps release lines and layouts to what was checked, and
lists the keys the lab config adds only because of this machine.
"""

from __future__ import annotations

import collections

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan

from . import cases as engine_cases
from . import lab

CASES = engine_cases.all_cases()
NVIDIA = ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental")
REPORT = collections.defaultdict(list)


@pytest.fixture(scope="module")
def built(lab_versions):  # pylint: disable=unused-argument
    """Every case built once (engine run, files applied, config composed); removed at the end."""
    try:
        yield {case.id: case.build() for case in CASES}
    finally:
        for case in CASES:
            case.cleanup()


def runtimes_of(data):
    if int(data.get("version", 1)) >= 3:
        return data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    return data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


def distinct(built_cases):
    """One case per distinct composed config (and containerd lines), in case order."""
    seen = collections.OrderedDict()
    for case in CASES:
        case = built_cases[case.id]
        key = (tuple(case.containerd_lines), case.config_text.replace(case.root, "<root>"),
               case.dropin[1].replace(case.root, "<root>") if case.dropin else None)
        seen.setdefault(key, []).append(case)
    return list(seen.values())


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_level1_config_dump(built, case_id):
    case = built[case_id]
    for line in case.containerd_lines:
        result = lab.config_dump(line, case.config_text)
        assert result.rc == 0, "%s on containerd %s: %s" % (case_id, line, result.stderr[-2000:])
        if line == "2.x":
            assert "Ignoring unknown key" not in result.stderr, result.stderr
        runtimes = runtimes_of(result.data)
        assert "runc" in runtimes
        for name, (runtime_type, binary, _origin) in case.expected.items():
            assert runtimes[name]["runtime_type"] == runtime_type, (line, name)
            assert runtimes[name]["options"]["BinaryName"] == binary, (line, name)
        unexpected = set(runtimes) & set(NVIDIA) - set(case.expected)
        assert not unexpected, "handlers nobody asked for: %s" % unexpected
    REPORT["level1"].append(case_id)


def _cri_runtimes(daemon):
    config = daemon.cri_status()
    return config["containerd"]["runtimes"]


def test_level2_daemon_cri_status(built, lab_daemon):
    failures = []
    groups = distinct(built)
    for group in groups:
        case = group[0]
        for line in case.containerd_lines:
            config, _applied = lab.apply_lab_overrides(case.config_text, line, run_pods=False)
            daemon = lab_daemon(line, config)
            try:
                status = daemon.plugin_status("cri")
                if status.status != "ok":
                    failures.append("%s on %s: cri %s %s" % (case.id, line, status.status, status.error))
                    continue
                runtimes = _cri_runtimes(daemon)
                for name, (runtime_type, binary, _origin) in case.expected.items():
                    got = runtimes.get(name) or {}
                    if got.get("runtimeType") != runtime_type or (got.get("options") or {}).get("BinaryName") != binary:
                        failures.append("%s on %s: %s is %r" % (case.id, line, name, got))
            finally:
                daemon.close()
        REPORT["level2"].append("%s (also stands for %s)" % (case.id, ", ".join(c.id for c in group[1:]) or "-"))
    assert not failures, "\n".join(failures)
    REPORT["level2-count"].append("%d distinct configs for %d cases" % (len(groups), len(CASES)))


def pod_plan(built_cases):
    """(case, line, [handlers]) for every distinct config and containerd line: all its NVIDIA handlers."""
    covered, plan = set(), []
    for group in distinct(built_cases):
        case = group[0]
        for line in case.containerd_lines:
            handlers = [name for name in sorted(case.expected) if name in NVIDIA]
            covered.update((line, name, case.expected[name][2]) for name in handlers)
            if handlers:
                plan.append((case, line, handlers))
    return plan, covered


def _sandbox_image(line, config_text):
    data = lab.config_dump(line, config_text).data
    if int(data.get("version", 1)) >= 3:
        return data["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
    return data["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"]


def test_level3_pods_run_through_the_configured_binary(built, lab_daemon, lab_images):
    plan, covered = pod_plan(built)
    failures = []
    for case, line, handlers in plan:
        config, _applied = lab.apply_lab_overrides(case.config_text, line, run_pods=True)
        case.write_dropin(run_pods=True)
        daemon = lab_daemon(line, config)
        try:
            daemon.ensure_images(lab_images)
            wanted_pause = _sandbox_image(line, config)
            if wanted_pause != lab_images["names"]["pause"]:
                # a plain config without sandbox_image: containerd's default pause name, served by the lab image
                daemon.ctr("images", "tag", "--force", lab_images["names"]["pause"], wanted_pause, namespace="k8s.io")
            for handler in handlers:
                before = len(case.calls())
                result = daemon.run_pod(handler, ["/bin/echo", "hello-from-" + handler], images=lab_images)
                calls = case.calls()[before:]
                binary = case.expected[handler][1]
                if result.error or result.exit_code != 0 or "hello-from-" + handler not in result.stdout_text:
                    failures.append("%s on %s, %s: %r" % (case.id, line, handler, result))
                elif not any(call.startswith(binary + " ") and " create " in " %s " % call for call in calls):
                    failures.append("%s on %s, %s: %s never ran create: %s" % (case.id, line, handler, binary, calls))
                else:
                    REPORT["level3"].append((line, handler, case.expected[handler][2]))
        finally:
            daemon.close()
            case.write_dropin(run_pods=False)
    assert not failures, "\n".join(failures)
    # every way a handler comes to be, on every containerd line that loads it, ran a pod
    assert set(REPORT["level3"]) == covered
    assert {origin for _l, _n, origin in covered} == {"base", "template", "dropin", "config"}
    REPORT["level3-count"].append("%d pods in %d daemons" % (sum(len(h) for _c, _l, h in plan), len(plan)))


# --- negative controls: the checks above do bite -------------------------------------------------

def _case(built_cases, case_id):
    return built_cases[case_id]


@pytest.mark.parametrize("case_id,table", [
    ("k3s-v1.31.5-package", 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"'),
    ("k3s-v1.33.9-package", "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'runc'"),
])
def test_naive_composition_is_rejected_by_containerd_and_by_us(built, case_id, table):
    """base + a table base already emits: containerd refuses it; our engine never writes it."""
    case = _case(built, case_id)
    naive = case.base_text + "\n[%s]\n  runtime_type = \"io.containerd.runc.v2\"\n" % table
    for line in case.containerd_lines:
        result = lab.config_dump(line, naive)
        assert result.rc != 0, "containerd %s accepted a table base already emits" % line
        assert "already exists" in result.stderr or "duplicated tables" in result.stderr or "defined twice" in result.stderr
    template = '{{ template "base" . }}\n[%s]\n  runtime_type = "io.containerd.runc.v2"\n' % table
    plan = dict(case.plan, state="present", write=[])
    if "runc" in table:
        # a table that is not ours: refused, with the line
        with pytest.raises(K3sGpuError, match="line 2: .* already emitted by the base template"):
            toml.apply_plan(template, EditPlan.of(plan), "/x/config-v3.toml.tmpl", True, case.profile)
        return
    # an NVIDIA runtime table the release now renders itself: taken out, and the result loads
    applied = toml.edit_target(template, EditPlan.of(plan), "/x/config.toml.tmpl", True, case.profile)
    fixed = applied.text
    assert applied.removed_for_base == ("nvidia",)
    composed = engine_cases.base_fixtures.compose(fixed, case.base_text)
    for line in case.containerd_lines:
        assert lab.config_dump(line, composed).rc == 0


def test_misspelled_option_runs_on_plain_runc_and_is_caught_by_us(built, lab_daemon, lab_images):
    case = _case(built, "k3s-v1.31.6-package")
    legacy = case.expected["nvidia-legacy"][1]
    typo = case.config_text.replace('BinaryName = "%s"' % legacy, 'BinaryNme = "%s"' % legacy)
    assert typo != case.config_text
    config, _applied = lab.apply_lab_overrides(typo, "2.x", run_pods=True)
    daemon = lab_daemon("2.x", config)
    try:
        before = len(case.calls())
        result = daemon.run_pod("nvidia-legacy", ["/bin/echo", "typo"], images=lab_images)
        assert result.exit_code == 0 and "typo" in result.stdout_text  # containerd keeps quiet...
        assert not [c for c in case.calls()[before:] if c.startswith(legacy + " ")]  # ...and skips the wrapper
    finally:
        daemon.close()
    with pytest.raises(K3sGpuError, match="did you mean BinaryName"):
        planner.check_options("nvidia-legacy", "io.containerd.runc.v2", {"BinaryNme": legacy})


def without_tables(text, name):
    """The text minus the runtime tables of one runtime (found with the engine's own scanner)."""
    lines = text.split("\n")
    drop = set()
    for table in toml.scan_tables(lines):
        if len(table.path) >= 5 and table.path[3:5] == ("runtimes", name):
            drop.update(range(table.start, table.content_end))
    return "\n".join(line for number, line in enumerate(lines) if number not in drop)


@pytest.mark.parametrize("line", ["1.6", "1.7"])
def test_v2_without_runc_breaks_cri_and_our_output_never_does(built, lab_daemon, line):
    ours = _case(built, "containerd-1.6.20-minimal-v2").config_text
    daemon = lab_daemon(line, lab.apply_lab_overrides(ours, line, run_pods=False)[0])
    try:
        assert daemon.plugin_status("cri").status == "ok"
    finally:
        daemon.close()
    broken = without_tables(ours, "runc")
    assert "runtimes.runc" not in broken and "runtimes.nvidia]" in broken
    daemon = lab_daemon(line, lab.apply_lab_overrides(broken, line, run_pods=False)[0])
    try:
        status = daemon.plugin_status("cri")
        assert status.status == "error" and "runc" in (status.error or ""), status
    finally:
        daemon.close()
