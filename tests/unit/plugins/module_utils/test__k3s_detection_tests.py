# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s's own detection tests (pkg/agent/containerd/runtimes_test.go, Test_UnitFindContainerRuntimes),
replayed through the release table on the releases each version of the test belongs to.

The test puts empty executables in one directory, sets PATH to it and compares findContainerRuntimes()
with a map of handler -> (RuntimeType, BinaryName). Two versions of it exist for the detection the
feature table knows: before k3s #9519 (k3s-io/k3s@35508dfb: every wasm shim `-v1`, types `.v2`, spin
looked up as containerd-shim-spin-v1) and from it (k3s-io/k3s@90f403cb: `.v1` types, spin `-v2`).
Here the executables go into /usr/bin, a directory every LookPath-era release searches; BinaryName
is then /usr/bin/<name> instead of the test's /tmp/testExecutables/<name>.
"""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect

RUNC = "io.containerd.runc.v2"
WASM_NAMES = ("wasmtime", "lunatic", "slight", "spin", "wws", "wasmedge", "wasmer")


def _era(wasm_type, wasm_binary):
    """The cases of one era, its wasm shims as wasm_type(name) and wasm_binary(name) (lunatic's binary is the
    same in both)."""
    return {
        "no runtimes": ([], {}),
        "found crun, nvidia and wasm": (
            ["nvidia-container-runtime", "crun", "containerd-shim-lunatic-v1"],
            {"nvidia": (RUNC, "nvidia-container-runtime"), "crun": (RUNC, "crun"),
             "lunatic": (wasm_type("lunatic"), "containerd-shim-lunatic-v1")}),
        "found only wasm": (
            [wasm_binary(name) for name in WASM_NAMES],
            dict((name, (wasm_type(name), wasm_binary(name))) for name in WASM_NAMES)),
    }


def _v1_but_spin(name):
    return "v2" if name == "spin" else "v1"


# before #9519 every shim was containerd-shim-<name>-v1 of type io.containerd.<name>.v2; from it, K3S_RUNTIMES's rows
BEFORE_9519 = _era(lambda name: "io.containerd.%s.v2" % name, lambda name: "containerd-shim-%s-v1" % name)
FROM_9519 = _era(lambda name: "io.containerd.%s.%s" % (name, _v1_but_spin(name)),
                 lambda name: "containerd-shim-%s-%s" % (name, _v1_but_spin(name)))

# (release, the test version that release's code passes): LookPath-era releases on both sides of #9519
RELEASES = [
    ("v1.28.7+k3s1", BEFORE_9519), ("v1.29.2+k3s1", BEFORE_9519), ("v1.29.2+rke2r1", BEFORE_9519),
    ("v1.28.8+k3s1", FROM_9519), ("v1.29.3+k3s1", FROM_9519), ("v1.30.0+k3s1", FROM_9519),
    ("v1.33.10+k3s1", FROM_9519), ("v1.37.0+k3s1", FROM_9519), ("v1.29.3+rke2r1", FROM_9519),
]


def _detected(sandbox, release, executables):
    distribution = "rke2" if "+rke2" in release else "k3s"
    sandbox.k3s(distribution)
    for name in executables:
        sandbox.binary("/usr/bin/" + name)
    facts = detect.gather(sandbox.root, distribution, release)
    return dict((r["name"], (r["runtime_type"], r["binary"])) for r in facts["release_runtimes"])


@pytest.mark.parametrize("release,cases", RELEASES, ids=[r for r, _c in RELEASES])
@pytest.mark.parametrize("case", sorted(FROM_9519))
def test_k3s_find_container_runtimes(sandbox, release, cases, case):
    executables, want = cases[case]
    expected = dict((name, (runtime_type, "/usr/bin/" + binary)) for name, (runtime_type, binary) in want.items())
    assert _detected(sandbox, release, executables) == expected


@pytest.mark.parametrize("release,spin", [
    ("v1.28.4+k3s1", "containerd-shim-spin-v1"), ("v1.28.7+k3s1", "containerd-shim-spin-v1"),
    ("v1.29.0+k3s1", "containerd-shim-spin-v1"), ("v1.29.2+k3s1", "containerd-shim-spin-v1"),
    ("v1.28.8+k3s1", "containerd-shim-spin-v2"), ("v1.29.3+k3s1", "containerd-shim-spin-v2"),
])
def test_spin_shim_name_by_release(sandbox, release, spin):
    # a node with both shims: the release's own name is the one found; with only the other, no spin
    other = "containerd-shim-spin-v2" if spin.endswith("v1") else "containerd-shim-spin-v1"
    assert "spin" not in _detected(sandbox, release, [other])
    assert _detected(sandbox, release, [spin])["spin"][1] == "/usr/bin/" + spin
