# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every template of the corpus (tests/corpus) gets exactly its expected outcome and finding codes, and
containerd_runtimes refuses (leaving the node byte-identical) exactly the cases the corpus refuses."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as check
from ansible_collections.k3s_gpu.nvidia.tests.corpus import corpus
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

CASES = corpus.load_cases()
BINARIES = dict(distro.NVIDIA_RUNTIMES)


def distribution_of(release):
    return distro.RKE2 if "+rke2" in release else distro.K3S


def node(sandbox, case):
    distribution = distribution_of(case["release"])
    sandbox.k3s(distribution)
    for name in case["detected"]:
        sandbox.binary("/usr/bin/" + BINARIES[name])
    if case["default_runtime"]:
        sandbox.write("/etc/rancher/%s/config.yaml" % distribution, "default-runtime: %s\n" % case["default_runtime"])
    path = "/var/lib/rancher/%s/agent/etc/containerd/%s" % (distribution, case["template_name"])
    sandbox.write(path, case["data"])
    return distribution, path


def report_of(sandbox, case):
    distribution, path = node(sandbox, case)
    facts = detect.gather(sandbox.root, distribution, case["release"])
    target = distro.profile(distribution, case["target_release"]) if case["target_release"] else None
    default = facts["default_runtime"]["value"]
    return facts, check.check_bytes(case["data"], path, NodeFacts.from_reading(facts), case["schema"], default_runtime=default, target_profile=target)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_outcome_and_codes(sandbox, case):
    _facts, report = report_of(sandbox, case)
    found = sorted(set(f.code for f in report.findings if f.when != check.UPGRADE))
    upgrade = sorted(set(f.code for f in report.upgrade) - set(found))
    assert (report.outcome, found) == (case["expect"]["outcome"], sorted(set(case["expect"]["codes"]))), \
        [f.text("") for f in report.findings]
    assert upgrade == sorted(set(case["expect"]["upgrade_codes"])), [f.text("") for f in report.upgrade]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_refusals_leave_the_node_as_it_was(sandbox, case):
    facts, _report = report_of(sandbox, case)
    before = sandbox.snapshot()
    params = {"target_release": case["target_release"]}
    if case["expect"]["outcome"] == "refuse":
        with pytest.raises(K3sGpuError) as info:
            changes.compute(NodeFacts.from_reading(facts), params)
        message = str(info.value)
        assert "othing was written" in message, message
        # the module's message names a code of the case (the UTF-16 case's runtime_info reading is not_utf8 only)
        assert any("[%s]" % code in message for code in case["expect"]["codes"]), message
    else:
        changes.compute(NodeFacts.from_reading(facts), params)
    assert sandbox.snapshot() == before
