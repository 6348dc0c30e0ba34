# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab itself, on every containerd line, with a minimal hand-written config (no k3s fixtures):
config dump, daemon + CRI Status, a pod through the fake NVIDIA runtime, and the 1.6/1.7 trap
of a v2 runtimes map without runc."""

from __future__ import annotations

import pytest

from . import lab

V2 = 'plugins."io.containerd.grpc.v1.cri"'
V3 = "plugins.'io.containerd.cri.v1.runtime'"


def minimal_config(line, settings, binary, runc=True, schema=None):
    """A `nvidia` runtime with BinaryName and SystemdCgroup = true, in the line's own schema."""
    schema = schema or (3 if line == "2.x" else 2)
    if schema == 3:
        head = "version = 3\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"%s\"\n" % settings["pause_image"]
        runtimes = V3 + ".containerd.runtimes"
    else:
        head = "version = 2\n[%s]\n  sandbox_image = \"%s\"\n" % (V2, settings["pause_image"])
        runtimes = V2 + ".containerd.runtimes"
    text = head
    if runc:
        text += "[%s.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n" % runtimes
    text += ("[%s.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n"
             "[%s.nvidia.options]\n  BinaryName = \"%s\"\n  SystemdCgroup = true\n") % (runtimes, runtimes, binary)
    return text


def dump_runtimes(data):
    if data.get("version") == 3:
        return data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    return data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


@pytest.fixture(scope="module", params=lab.LINES)
def smoke(request, lab_versions, lab_workdir, lab_fake_runtime, lab_images):  # pylint: disable=unused-argument
    """One daemon per line for the whole module, on the minimal config."""
    line = request.param
    config = minimal_config(line, lab.lab_settings(line, lab_workdir), lab_fake_runtime.path)
    with lab.Daemon(line, config, lab_workdir) as daemon:
        print("lab-only overrides on %s:\n%s" % (line, lab.lab_only_overrides(3 if line == "2.x" else 2, line)[1]))
        yield line, config, daemon


def test_config_dump_shows_nvidia(smoke, lab_fake_runtime):
    line, config, _daemon = smoke
    result = lab.config_dump(line, config)
    assert result.rc == 0, result.stderr
    runtimes = dump_runtimes(result.data)
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == lab_fake_runtime.path
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    assert "runc" in runtimes


def test_cri_ok_and_status_lists_nvidia(smoke, lab_fake_runtime):
    line, _config, daemon = smoke
    status = daemon.plugin_status("cri")
    assert status.status == "ok", status.error
    runtimes = daemon.cri_status()["containerd"]["runtimes"]
    assert runtimes["nvidia"]["runtimeType"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == lab_fake_runtime.path
    assert {"nvidia", "runc"} <= set(daemon.runtime_handlers()), line


def test_pod_runs_through_fake_runtime(smoke, lab_fake_runtime, lab_images):
    line, _config, daemon = smoke
    lab_fake_runtime.clear()
    result = daemon.run_pod("nvidia", ["/bin/sh", "-c", "echo hello-from-$0", line], timeout=30, images=lab_images)
    assert result.error is None, "%s\n%s" % (result.error, daemon.log(tail=30))
    assert result.exit_code == 0
    assert result.stdout_text == "hello-from-%s\n" % line
    calls = lab_fake_runtime.calls()
    assert any(" create " in c for c in calls), calls


def test_unknown_handler_is_refused(smoke, lab_images):
    _line, _config, daemon = smoke
    result = daemon.run_pod("nope", ["/bin/true"], timeout=10, images=lab_images)
    assert result.exit_code is None
    assert 'no runtime for "nope"' in result.error


@pytest.mark.parametrize("line", lab.LINES)
def test_v2_without_runc_block(line, lab_versions, lab_workdir, lab_fake_runtime, lab_daemon):  # pylint: disable=unused-argument
    """1.6/1.7: a runtimes table replaces the default map, runc is gone and the CRI plugin is in
    error (the daemon still runs). 2.x merges the map and keeps runc."""
    config = minimal_config(line, lab.lab_settings(line, lab_workdir), lab_fake_runtime.path, runc=False, schema=2)
    daemon = lab_daemon(line, config)
    status = daemon.plugin_status("cri")
    if line == "2.x":
        assert status.status == "ok", status.error
        assert "runc" in daemon.runtime_handlers()
    else:
        assert status.status == "error"
        assert "no corresponding runtime configured" in status.error, status.error


def test_missing_lab_fails_with_install_hint(monkeypatch, tmp_path):
    monkeypatch.setattr(lab, "MANIFEST", str(tmp_path / "absent.json"))
    with pytest.raises(lab.LabMissing, match="install-containerd.sh"):
        lab.versions()
