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
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _toml as toml

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
    ("rke2", "v1.28.15+rke2r1", "path", True, 2, V2_TMPL),
    ("rke2", "v1.29.9+rke2r1", "fixed", False, 2, V2_TMPL),
    ("rke2", "v1.31.1+rke2r1", "fixed", False, 2, V2_TMPL),
    ("rke2", "v1.31.1+rke2r2", "path", True, 2, V2_TMPL),
    ("rke2", "v1.31.6+rke2r1", "path", True, 3, V3_TMPL),
    ("rke2", "v1.33.9+rke2r1", "path", True, 3, V3_TMPL),
    ("rke2", "v1.33.10+rke2r1", "path", True, 3, V3_DROPIN),
    ("rke2", "v1.36.2+rke2r1", "path", True, 3, V3_DROPIN),
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
        with pytest.raises(planner.PlanError, match="v1.28.1"):
            planner.make_plan(facts)
        return
    plan = planner.make_plan(facts)
    assert set(r["name"] for r in plan["write"]) == missing
    assert set(s["name"] for s in plan["skip"]) == set(nvidia_found) & wanted
    if where != NO_BASE:
        assert plan["target"]["path"].endswith("/agent/etc/containerd/" + where)

    target = plan["target"]
    text = toml.apply_plan(None, plan, target["path"], target["mode"] == planner.MODE_TEMPLATE, facts["profile"])
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
    assert toml.apply_plan(text, plan, target["path"], target["mode"] == planner.MODE_TEMPLATE, facts["profile"]) == text


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
    text = toml.apply_plan(None, plan, plan["target"]["path"], False, facts["profile"])
    assert "runtimes.nvidia-legacy]" in text
    assert "runtimes.nvidia]" not in text and "nvidia-cdi" not in text


@pytest.mark.parametrize("distribution,release,message", [
    ("k3s", "v1.27.16+k3s1", "older than the oldest release line"),
    ("k3s", "v1.37.0+k3s1", "does not know yet"),
    ("rke2", "v1.26.0+rke2r1", "older than"),
    ("k3s", "1.31", "not a k3s version"),
    ("k3s", "v1.31.6+rke2r1", "is a rke2 release"),
    ("containerd", "1.5.9", "outside the lines"),
    ("containerd", "3.0.0", "outside the lines"),
])
def test_unknown_or_old_release_is_refused(sandbox, distribution, release, message):
    sandbox.k3s("k3s", "package")
    with pytest.raises(distro.ReleaseError, match=message):
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
    ("v1.33.10+k3s1", "2.2", True), ("v1.36.0+k3s1", "2.3", True),
])
def test_containerd_line(release, containerd, dropin):
    profile = distro.profile("k3s", release)
    assert (profile["containerd"], profile["dropin_imports"]) == (containerd, dropin)


def test_known_bad_release_flagged():
    assert "8761" in distro.profile("k3s", "v1.28.3+k3s1")["known_bad"]
    assert distro.profile("k3s", "v1.28.3+k3s2")["known_bad"] is None
