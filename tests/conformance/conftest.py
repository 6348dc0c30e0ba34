# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures for the real-containerd lab (tests/conformance/lab.py). Session-scoped unless noted.

lab_versions       lab.versions(): {"1.6"|"1.7"|"2.x": {"version", "package", "bin_dir", ...}}.
                   FAILS (never skips) with the install hint when scripts/install-containerd.sh
                   has not run. Every other lab fixture depends on it.
lab_workdir        one work dir for the session: each line's daemon root/state live under it
                   (lab-16/, lab-17/, lab-2x/), so imported images persist between daemons.
lab_base_params    lab.lab_settings("2.x", lab_workdir): root, state, address, opt, pause_image,
                   snapshotter, cni_bin_dir, cni_conf_dir, registry_dir, systemd_cgroup (False).
                   The k3s base template parameters; a Daemon of any line runs on its own
                   root/state/socket whatever the config says (command-line flags, as k3s does).
lab_images         lab.build_images(lab_workdir): {"busybox": tar, "pause": tar, "names": {...}};
                   Daemon.run_pod imports them when the daemon lacks them.
lab_fake_runtime   FakeRuntime(path, log): a wrapper that logs its argv to `log` and execs runc;
                   put `path` as BinaryName. .calls() returns the logged lines, .clear() empties it.
lab_daemon         (function scope) factory: lab_daemon(line, config_text, **Daemon kwargs) ->
                   a started lab.Daemon, closed at the end of the test (also on failure/Ctrl-C).
lab_host_clean     (autouse) at the end of the session: fails if a lab daemon, shim, /run entry,
                   cgroup dir, socket dir or mount of this run is left behind.
"""

from __future__ import annotations

import os

import pytest

from . import lab


class FakeRuntime:
    def __init__(self, path, log):
        self.path, self.log = path, log

    def calls(self):
        try:
            with open(self.log, encoding="utf-8") as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []

    def clear(self):
        with open(self.log, "w", encoding="utf-8"):
            pass


@pytest.fixture(scope="session")
def lab_versions():
    try:
        return lab.versions()
    except lab.LabMissing as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)  # outside the except: no chained traceback in the report
    return None


@pytest.fixture(scope="session", autouse=True)
def lab_host_clean():
    before = lab.host_snapshot()
    yield
    left = lab.leftovers(before)
    if left:
        pytest.fail("the lab left things behind:\n  " + "\n  ".join(left), pytrace=False)


@pytest.fixture(scope="session")
def lab_workdir(tmp_path_factory, lab_versions):  # pylint: disable=unused-argument
    lab.cleanup_stale()
    return str(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="session")
def lab_base_params(lab_workdir):
    return lab.lab_settings("2.x", lab_workdir)


@pytest.fixture(scope="session")
def lab_images(lab_workdir):
    return lab.build_images(lab_workdir)


@pytest.fixture(scope="session")
def lab_fake_runtime(lab_workdir):
    fake_dir = os.path.join(lab_workdir, "fake")
    log = os.path.join(fake_dir, "calls.log")
    path = lab.write_fake_runtime(os.path.join(fake_dir, "nvidia-container-runtime"), log)
    return FakeRuntime(path, log)


@pytest.fixture
def lab_daemon(lab_workdir):
    started = []

    def start(line, config_text, **kwargs):
        daemon = lab.Daemon(line, config_text, lab_workdir, **kwargs)
        started.append(daemon)
        return daemon.__enter__()

    yield start
    for daemon in reversed(started):
        daemon.close()


def pytest_terminal_summary(terminalreporter):
    """What the conformance suite checked, and how the lab config differs from k3s's."""
    module = next((m for name, m in list(__import__("sys").modules.items()) if name.endswith("conformance.test_conformance")), None)
    report = getattr(module, "REPORT", None)
    if not report:
        return
    write = terminalreporter.write_line
    write("")
    write("conformance report")
    write("lab-only settings (the loaded config differs from what k3s writes only in these):")
    for line in lab.lab_only_overrides(3)[1].splitlines():
        write("  " + line)
    write("  BinaryName paths: the node paths relocated under each case's sandbox root, where the wrappers are")
    write("level 1 (config dump): %d cases" % len(report.get("level1") or []))
    for row in report.get("level2-count") or []:
        write("level 2 (daemon, CRI Status): " + row)
    for row in report.get("level3-count") or []:
        write("level 3 (pods): " + row)
    counts = __import__("collections").Counter(report.get("level3") or [])
    for (line, handler, origin), count in sorted(counts.items()):
        write("  containerd %-4s %-14s defined by %-9s %3d pods" % (line, handler, origin, count))
