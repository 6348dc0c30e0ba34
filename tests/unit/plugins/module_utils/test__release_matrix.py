# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Release lines x node layouts: what each release detects, and what we write.

The expectations here are written out by hand from docs/release-facts.md (k3s PRs and tags), not
computed from the engine's feature table, so a wrong row in the table makes these fail.
"""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan

V2_TMPL = "config.toml.tmpl"
V3_TMPL = "config-v3.toml.tmpl"
V3_DROPIN = "config-v3.toml.d/50-k3s-gpu-nvidia.toml"
NO_BASE = "no-base"

# release, detection era (stat | fixed | path), nvidia-cdi detected, schema, where we write
RELEASES = [
    ("k3s", "v1.28.0+k3s1", "stat", False, 2, NO_BASE),
    ("k3s", "v1.28.1+k3s1", "stat", False, 2, V2_TMPL),
    ("k3s", "v1.28.4+k3s2", "stat", False, 2, V2_TMPL),
    ("k3s", "v1.28.6+k3s2", "stat", False, 2, V2_TMPL),
    ("k3s", "v1.28.7+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.28.14+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.28.15+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.29.0+k3s1", "stat", False, 2, V2_TMPL),
    ("k3s", "v1.29.1+k3s2", "stat", False, 2, V2_TMPL),
    ("k3s", "v1.29.2+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.29.9+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.29.10+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.30.0+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.30.5+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.30.6+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.31.1+k3s1", "fixed", False, 2, V2_TMPL),
    ("k3s", "v1.31.2+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.31.5+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.31.6+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.32.0+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.32.1+k3s1", "path", True, 2, V2_TMPL),
    ("k3s", "v1.32.2+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.32.13+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.33.0+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.33.9+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.33.10+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.34.5+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.34.6+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.35.2+k3s1", "path", True, 3, V3_TMPL),
    ("k3s", "v1.35.3+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.36.0+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.36.1+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.36.2+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.37.0+k3s1", "path", True, 3, V3_DROPIN),
    ("k3s", "v1.37.2+k3s1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.28.15+rke2r1", "path", True, 2, V2_TMPL),
    ("rke2", "v1.29.9+rke2r1", "fixed", False, 2, V2_TMPL),
    ("rke2", "v1.31.1+rke2r1", "fixed", False, 2, V2_TMPL),
    ("rke2", "v1.31.1+rke2r2", "path", True, 2, V2_TMPL),
    ("rke2", "v1.31.6+rke2r1", "path", True, 3, V3_TMPL),
    ("rke2", "v1.33.9+rke2r1", "path", True, 3, V3_TMPL),
    ("rke2", "v1.33.10+rke2r1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.36.1+rke2r1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.36.2+rke2r1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.37.0+rke2r1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.37.1+rke2r1", "path", True, 3, V3_DROPIN),
]

OPERATOR_DIR = "/usr/local/nvidia/toolkit"


def expected_detected(layout, era, cdi):
    """name -> binary k3s renders itself, by the facts of each detection era."""
    dirs = {"package": "/usr/bin", "operator": OPERATOR_DIR, "custom_on_path": "/opt/nvidia/bin"}
    if layout not in dirs:
        return {}
    if layout == "custom_on_path" and era != "path":
        return {}  # only the Oct-2024 releases search the service PATH
    found = {"nvidia": dirs[layout] + "/nvidia-container-runtime"}
    if cdi:
        found["nvidia-cdi"] = dirs[layout] + "/nvidia-container-runtime.cdi"
    return found


def expected_available(layout):
    names = {"package": ("nvidia", "nvidia-cdi", "nvidia-legacy"), "operator": ("nvidia", "nvidia-cdi", "nvidia-legacy"),
             "custom_on_path": ("nvidia", "nvidia-cdi", "nvidia-legacy"), "custom_off_path": ("nvidia", "nvidia-cdi", "nvidia-legacy"),
             "legacy_only": ("nvidia-legacy",), "nothing": ()}
    return set(names[layout])


CASES = [(d, r, era, cdi, schema, where, layout) for (d, r, era, cdi, schema, where) in RELEASES
         for layout in ("package", "operator", "custom_on_path", "custom_off_path", "legacy_only", "nothing")]


@pytest.mark.parametrize("distribution,release,era,cdi,schema,where,layout", CASES,
                         ids=["%s-%s-%s" % (c[0], c[1], c[6]) for c in CASES])
def test_release_layout(sandbox, distribution, release, era, cdi, schema, where, layout):
    sandbox.k3s(distribution, layout)
    toolkit_dirs = ["/opt/nvidia/bin"] if layout == "custom_off_path" else []
    facts = detect.gather(sandbox.root, "auto", release, toolkit_dirs=toolkit_dirs)
    assert facts["distribution"] == distribution
    nvidia_found = dict((r["name"], r["binary"]) for r in facts["release_runtimes"] if r["name"].startswith("nvidia"))
    assert nvidia_found == expected_detected(layout, era, cdi)
    assert facts["profile"]["schema"] == schema

    wanted = expected_available(layout)
    missing = wanted - set(nvidia_found)
    if where == NO_BASE and missing:
        with pytest.raises(K3sGpuError, match="v1.28.1"):
            planner.make_plan(facts)
        return
    plan = planner.make_plan(facts)
    assert set(r["name"] for r in plan["write"]) == missing
    assert set(s["name"] for s in plan["skip"]) == set(nvidia_found) & wanted
    if where != NO_BASE:
        assert plan["target"]["path"].endswith("/agent/etc/containerd/" + where)

    target = plan["target"]
    text = toml.apply_plan(None, EditPlan.of(plan), target["path"], target["mode"] == planner.MODE_TEMPLATE, facts["profile"])
    if not missing:
        assert text is None  # nothing missing: nothing written
        return
    masked, _lines = toml.mask_template(text, target["path"])
    written = tomllib.loads(masked)
    runtimes = written["plugins"][distro.CRI_RUNTIME_PLUGIN[schema]]["containerd"]["runtimes"]
    assert set(runtimes) == missing
    for name in missing:
        assert runtimes[name]["runtime_type"] == "io.containerd.runc.v2"
        assert runtimes[name]["options"]["BinaryName"].endswith("/" + dict(distro.NVIDIA_RUNTIMES)[name])
    if target["mode"] == planner.MODE_TEMPLATE:
        assert text.splitlines()[1] == '{{ template "base" . }}'
        # what k3s loads: base tables + our body must be one valid document
        base = "\n".join("[%s]" % toml._key_text(tuple(t)) for t in plan["reserved_tables"])
        tomllib.loads(base + "\n" + masked)
        for name in nvidia_found:
            assert list(distro.runtime_table(schema, name)) in plan["reserved_tables"]
    # a second run on the written file changes nothing
    assert toml.apply_plan(text, EditPlan.of(plan), target["path"], target["mode"] == planner.MODE_TEMPLATE, facts["profile"]) == text


@pytest.mark.parametrize("release,expected", [
    ("v1.28.14+k3s1", {"nvidia-cdi", "nvidia-legacy"}),
    ("v1.28.15+k3s1", {"nvidia-legacy"}),
])
def test_nvidia_cdi_boundary_on_1_28(sandbox, release, expected):
    sandbox.k3s("k3s", "package")
    plan = planner.make_plan(detect.gather(sandbox.root, "k3s", release))
    assert set(r["name"] for r in plan["write"]) == expected


def test_template_name_follows_containerd_major(sandbox):
    sandbox.k3s("k3s", "legacy_only")
    assert planner.make_plan(detect.gather(sandbox.root, "k3s", "v1.31.5+k3s1"))["target"]["path"].endswith("/config.toml.tmpl")
    assert planner.make_plan(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1"))["target"]["path"].endswith("/config-v3.toml.tmpl")


def test_nothing_duplicated_on_dropin_release(sandbox):
    sandbox.k3s("k3s", "operator")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    plan = planner.make_plan(facts)
    text = toml.apply_plan(None, EditPlan.of(plan), plan["target"]["path"], False, facts["profile"])
    assert "runtimes.nvidia-legacy]" in text
    assert "runtimes.nvidia]" not in text and "nvidia-cdi" not in text


@pytest.mark.parametrize("distribution,release,message", [
    ("k3s", "v1.27.16+k3s1", "older than the oldest release line"),
    ("k3s", "v1.38.0+k3s1", "does not know yet"),
    ("rke2", "v1.40.1+rke2r1", "does not know yet"),
    ("rke2", "v1.26.0+rke2r1", "older than"),
    ("k3s", "1.31", "not a k3s version"),
    ("k3s", "v1.31.6+rke2r1", "is a rke2 release"),
    ("containerd", "1.5.9", "outside the lines"),
    ("containerd", "3.0.0", "outside the lines"),
])
def test_unknown_or_old_release_is_refused(sandbox, distribution, release, message):
    sandbox.k3s("k3s", "package")
    with pytest.raises(K3sGpuError, match=message):
        detect.gather(sandbox.root, distribution, release)


@pytest.mark.parametrize("distribution,release,expected", [
    ("k3s", "v1.28.4+k3s2", []),
    ("k3s", "v1.28.5+k3s1", ["nvidia", "nvidia-experimental"]),
    ("k3s", "v1.31.6+k3s1", ["nvidia", "nvidia-experimental"]),
    ("rke2", "v1.31.4+rke2r1", []),
    ("rke2", "v1.31.5+rke2r1", ["nvidia", "nvidia-experimental"]),
    ("rke2", "v1.28.15+rke2r1", []),
])
def test_runtimeclasses_shipped(distribution, release, expected):
    shipped = distro.profile(distribution, release)["runtimeclasses"]
    assert [n for n in shipped if n.startswith("nvidia")] == expected
    assert "nvidia-cdi" not in shipped


@pytest.mark.parametrize("release,containerd,dropin", [
    ("v1.30.6+k3s1", "1.7", False), ("v1.31.6+k3s1", "2.0", False), ("v1.31.13+k3s1", "2.1", False),
    ("v1.33.10+k3s1", "2.2", True), ("v1.36.0+k3s1", "2.2", True), ("v1.36.2+k3s1", "2.3", True),
])
def test_containerd_line(release, containerd, dropin):
    profile = distro.profile("k3s", release)
    assert (profile["containerd"], profile["dropin_imports"]) == (containerd, dropin)


# The 1.36 and 1.37 rows, by hand from ../shared/reference/facts-2026-12-detail.md (k3s-io/docs
# v1.36.X.md @c3766448, v1.37.X.md @5962ea1e; rancher/rke2-docs v1.36.X.md @32e95b43, v1.37.X.md
# @9780f575; rke2 go.mod at v1.36.0 9ffd0068 and v1.36.2 5c95ec95; k3s #14254):
# release -> (embedded containerd line, highest config version it reads, drop-in imports, nvidia-cdi
# detected, helm-controller)
LINES_2026 = [
    ("k3s", "v1.36.0+k3s1", "2.2", 3, True, True, "v0.17.1"),   # containerd v2.2.3-k3s1
    ("k3s", "v1.36.1+k3s1", "2.2", 3, True, True, "v0.17.1"),   # containerd v2.2.3-k3s1
    ("k3s", "v1.36.2+k3s1", "2.3", 4, True, True, "v0.17.1"),   # containerd v2.3.2-k3s2 (#14254)
    ("k3s", "v1.36.5+k3s1", "2.3", 4, True, True, "v0.17.7"),   # containerd 2.3.4 (3rd-party notes)
    ("k3s", "v1.37.0+k3s1", "2.3", 4, True, True, "v0.17.7"),   # containerd v2.3.4-k3s1
    ("k3s", "v1.37.1+k3s1", "2.3", 4, True, True, "v0.17.9"),   # containerd v2.3.4-k3s1
    ("k3s", "v1.37.2+k3s1", "2.3", 4, True, True, "v0.17.9"),   # containerd 2.3.7; controller bumped (#14814), assumed
    ("rke2", "v1.36.0+rke2r1", "2.2", 3, True, True, "v0.17.1"),  # v2.2.3-k3s1
    ("rke2", "v1.36.1+rke2r1", "2.2", 3, True, True, "v0.17.1"),  # v2.2.3-k3s1
    ("rke2", "v1.36.2+rke2r1", "2.3", 4, True, True, "v0.17.1"),  # v2.3.2-k3s2
    ("rke2", "v1.36.3+rke2r1", "2.3", 4, True, True, "v0.17.7"),  # image v2.3.3-k3s1
    ("rke2", "v1.37.0+rke2r1", "2.3", 4, True, True, "v0.17.7"),  # v2.3.4-k3s1
    ("rke2", "v1.37.1+rke2r1", "2.3", 4, True, True, "v0.17.9"),  # v2.3.4-k3s1
]


@pytest.mark.parametrize("distribution,release,containerd,version_max,dropin,cdi,controller", LINES_2026,
                         ids=[r[1] for r in LINES_2026])
def test_rows_1_36_and_1_37(distribution, release, containerd, version_max, dropin, cdi, controller):
    profile = distro.profile(distribution, release)
    assert profile["containerd"] == containerd
    assert profile["config_version_max"] == version_max
    assert profile["dropin_imports"] is dropin
    assert ("nvidia-cdi" in [r["name"] for r in profile["detected_runtimes"]]) is cdi
    assert release_rules.helm_controller_version(profile) == controller
    # k3s/rke2 write their config.toml as version 3 on every containerd 2 line, 2.3 included
    assert profile["schema"] == 3 and profile["templates"] == ["config-v3.toml.tmpl", "config.toml.tmpl"]
    assert profile["detection"] == "lookpath+service-path" and profile["base_template"] and profile["default_runtime"]
    assert profile["assumed_line"] is None and profile["assumed_warning"] is None
    shipped = {"k3s": ["nvidia", "nvidia-experimental", "crun", "lunatic", "slight", "spin", "wws", "wasmedge",
                       "wasmer", "wasmtime"], "rke2": ["nvidia", "nvidia-experimental", "crun"]}[distribution]
    assert profile["runtimeclasses"] == shipped


def test_plain_containerd_config_versions():
    """The highest `version` each containerd line reads (4 came with 2.3)."""
    assert [distro.profile("containerd", v)["config_version_max"] for v in
            ("1.6.20", "1.7.24", "2.0.5", "2.1.9", "2.2.7", "2.3.4")] == [2, 2, 3, 3, 3, 4]
    # a file the collection creates stays at 3 on containerd 2 (every 2.x reads it; 2.3 migrates it in memory)
    assert distro.profile("containerd", "2.3.4")["schema"] == 3
    assert distro.CRI_RUNTIME_PLUGIN[4] == distro.CRI_RUNTIME_PLUGIN[3] == "io.containerd.cri.v1.runtime"
    assert distro.runtime_table(4, "nvidia") == distro.runtime_table(3, "nvidia")
    assert distro.cri_table(4) == ("plugins", "io.containerd.cri.v1.runtime")


# --- a release newer than the table --------------------------------------------------------------

def test_newer_line_is_refused_by_default_and_names_the_opt_in(sandbox):
    sandbox.k3s("k3s", "package")
    for distribution, release in (("k3s", "v1.38.0+k3s1"), ("rke2", "v1.38.2+rke2r1"), ("containerd", "2.4.0")):
        with pytest.raises(K3sGpuError) as info:
            detect.gather(sandbox.root, distribution, release)
        message = str(info.value)
        assert release in message and "set newer_release=assume_newest_known" in message
        # the role's user reads the variable they set
        assert "set gpu_node_newer_release=assume_newest_known" in info.value.text({"newer_release": "gpu_node_newer_release"})
        with pytest.raises(K3sGpuError, match="newer_release=assume_newest_known"):
            distro.profile(distribution, release, "refuse")


@pytest.mark.parametrize("distribution,release,line,assumed,newest", [
    ("k3s", "v1.38.0+k3s1", "1.38", "1.37", "v1.37.2+k3s1"),
    ("rke2", "v1.40.3+rke2r2", "1.40", "1.37", "v1.37.1+rke2r1"),
])
def test_newer_line_assumed_as_the_newest_known(sandbox, distribution, release, line, assumed, newest):
    profile = distro.profile(distribution, release, "assume_newest_known")
    known = distro.profile(distribution, newest)
    assert profile["line"] == line and profile["assumed_line"] == assumed == distro.KNOWN_LINES[-1]
    same = ("containerd", "schema", "config_version_max", "templates", "base_template", "dropin_imports",
            "cdi_default_on", "default_runtime", "detection", "detected_runtimes", "runtimeclasses", "known_bad")
    assert dict((k, profile[k]) for k in same) == dict((k, known[k]) for k in same)
    assert release_rules.helm_controller_version(profile) == release_rules.helm_controller_version(known)
    warning = profile["assumed_warning"]
    assert release in warning and "line %s" % line in warning and "newest %s release" % assumed in warning
    assert "Risk:" in warning and "keep containerd from starting" in warning
    # the whole engine runs on it: detection and the drop-in plan of the newest known line
    sandbox.k3s(distribution, "package")
    facts = detect.gather(sandbox.root, distribution, release, newer_release="assume_newest_known")
    assert facts["profile"]["assumed_line"] == assumed
    plan = planner.make_plan(facts)
    assert plan["target"]["path"].endswith("/agent/etc/containerd/" + V3_DROPIN)
    assert [r["name"] for r in plan["write"]] == ["nvidia-legacy"]


def test_newer_containerd_line_assumed_as_2_3(sandbox):
    profile = distro.profile("containerd", "2.4.1", "assume_newest_known")
    assert (profile["line"], profile["containerd"], profile["assumed_line"]) == ("2.4", "2.3", "2.3")
    assert profile["config_version_max"] == 4
    assert "containerd 2.4.1" in profile["assumed_warning"] and "newest 2.3 release" in profile["assumed_warning"]
    assert distro.profile("containerd", "2.3.4", "assume_newest_known")["assumed_line"] is None


def test_newer_release_policy_never_rescues_an_old_or_malformed_release():
    for distribution, release, message in (("k3s", "v1.27.16+k3s1", "older than"), ("containerd", "1.5.9", "outside the lines"),
                                           ("k3s", "1.38", "not a k3s version")):
        with pytest.raises(K3sGpuError, match=message) as info:
            distro.profile(distribution, release, "assume_newest_known")
        assert "assume_newest_known" not in str(info.value)
    with pytest.raises(K3sGpuError, match="newer_release must be one of refuse, assume_newest_known"):
        distro.profile("k3s", "v1.38.0+k3s1", "guess")


def test_known_bad_release_flagged():
    assert "8761" in distro.profile("k3s", "v1.28.3+k3s1")["known_bad"]
    assert distro.profile("k3s", "v1.28.3+k3s2")["known_bad"] is None
