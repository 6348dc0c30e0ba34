# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The test binaries' builder (tests/testbins.py): what it records, and how a build that fails is told.

- every built key has a record with module, version, the Go that built it and a sha256 per binary, and
  the binary carries the same module and version in its Go build information (`go version -m`);
- a binary whose bytes no longer match the record is not taken as built;
- a module version the proxy does not serve fails `require` with the module, the version and the
  builder's last error line, and leaves a failure record; it never skips.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.k3s_gpu.nvidia.tests import testbins


@pytest.mark.parametrize("key", sorted(key for key, build in testbins.BUILDS.items() if build.stage == "conformance"))
def test_built_binaries_carry_their_module_and_version(key):
    build = testbins.BUILDS[key]
    testbins.require(key, build.binaries[0])
    record = testbins.read_record(build)
    assert record["module"] == build.module and record["version"] == build.version
    assert record["go"] == testbins.go_version()
    assert sorted(record["sha256"]) == sorted(build.binaries)
    for name in build.binaries:
        path = testbins.path_of(key, name)
        assert testbins.sha256_of(path) == record["sha256"][name]
        info = subprocess.run([testbins.go_binary(), "version", "-m", path], capture_output=True, text=True,
                              check=True).stdout
        lines = [line.split() for line in info.splitlines()]
        if build.source:  # our program: Helm is a dependency at the pinned version
            assert ["dep", build.module, build.version] in [fields[:3] for fields in lines], info
        else:
            assert ["mod", build.module, build.version] in [fields[:3] for fields in lines], info
    with open(testbins.cache_root() / "versions.json", encoding="utf-8") as handle:
        versions = json.load(handle)
    assert versions["%s/%s" % (build.name, build.cache_version)]["sha256"] == record["sha256"]


def test_a_changed_binary_is_not_taken_as_built(tmp_path, monkeypatch):
    build = testbins.BUILDS["containerd-2.2"]
    testbins.require(build.key, "ctr")
    copy = tmp_path / build.name / build.cache_version
    shutil.copytree(testbins.build_dir(build), copy)
    monkeypatch.setenv("K3S_GPU_TEST_BINARIES", str(tmp_path))
    assert testbins.is_built(build)
    with open(copy / "bin" / "ctr", "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0xFF]))
    assert not testbins.is_built(build)


def test_a_module_version_that_cannot_be_built_fails_naming_module_version_and_error(tmp_path, monkeypatch):
    missing = dataclasses.replace(testbins.BUILDS["containerd-2.2"], key="containerd-missing", version="v2.2.999")
    monkeypatch.setitem(testbins.BUILDS, missing.key, missing)
    monkeypatch.setenv("K3S_GPU_TEST_BINARIES", str(tmp_path))
    with pytest.raises(pytest.fail.Exception) as failed:
        testbins.require(missing.key, "containerd")
    message = str(failed.value)
    assert "github.com/containerd/containerd/v2 v2.2.999" in message, message
    with open(testbins.failure_file(missing), encoding="utf-8") as handle:
        failure = json.load(handle)
    assert failure["module"] == missing.module and failure["version"] == "v2.2.999" and failure["exit"] != 0
    assert failure["error"] not in ("", "(no output)") and message.endswith(failure["error"]), (message, failure)
    assert not testbins.build_dir(missing).exists()
