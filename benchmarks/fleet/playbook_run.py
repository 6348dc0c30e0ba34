# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run one ansible-playbook and measure it from outside: wall time, and the controller's memory
sampled every 100 ms: the RSS of ansible-playbook and all its descendants added up, of ansible-playbook
and its forked workers only (with the local connection, each host's module also runs as a descendant,
which on a real fleet runs on the node), and the peak RSS of the ansible-playbook process itself."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import threading
import time

SAMPLE_SECONDS = 0.1
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass
class PlaybookRun:
    returncode: int
    started: float  # time.monotonic(), the clock of the events file
    wall_seconds: float
    peak_tree_rss: int  # bytes, the largest sum over the process tree seen by the sampler
    peak_forks_rss: int  # bytes, the same over ansible-playbook and its workers (no module processes)
    peak_main_rss: int  # bytes, VmHWM of ansible-playbook itself (its last sample: the kernel keeps the peak)
    peak_processes: int  # the most processes in the tree at one sample (main + forks)
    samples: int


def _children(pid):
    # children are listed per thread (the thread that forked them)
    found = []
    for path in glob.glob("/proc/%d/task/*/children" % pid):
        try:
            with open(path, encoding="ascii") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            pass  # the thread or process just ended
    return found


def _rss(pid):
    try:
        with open("/proc/%d/statm" % pid, encoding="ascii") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0  # it just ended


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _high_water_mark(pid):
    try:
        with open("/proc/%d/status" % pid, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _MemorySampler(threading.Thread):
    """Every SAMPLE_SECONDS: the summed RSS of the process and its descendants. Forked workers share
    the parent's pages copy-on-write, so the sum counts shared pages once per process: an upper bound
    of what the tree really occupies, which is what matters for sizing a controller. A worker is a
    fork that never execs: its command line is the main process's."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.main_cmdline = None
        self.peak_tree_rss = 0
        self.peak_forks_rss = 0
        self.peak_main_rss = 0
        self.peak_processes = 0
        self.samples = 0

    def sample(self):
        tree, pending = [], [self.pid]
        while pending:
            pid = pending.pop()
            tree.append(pid)
            pending += _children(pid)
        rss = {pid: _rss(pid) for pid in tree}
        if self.main_cmdline is None:
            cmdline = _cmdline(self.pid)
            if cmdline and b"ansible-playbook" in cmdline:  # not yet: between fork and exec, it is this script
                self.main_cmdline = cmdline
        forks = [pid for pid in tree if _cmdline(pid) == self.main_cmdline]
        self.peak_tree_rss = max(self.peak_tree_rss, sum(rss.values()))
        self.peak_forks_rss = max(self.peak_forks_rss, sum(rss[pid] for pid in forks))
        self.peak_main_rss = max(self.peak_main_rss, _high_water_mark(self.pid))
        self.peak_processes = max(self.peak_processes, len(tree))
        self.samples += 1

    def run(self):
        self.sample()
        while not self.stop.wait(SAMPLE_SECONDS):
            self.sample()


def run_playbook(argv, env, log_path, cwd):
    """Run argv (an ansible-playbook command line), output to log_path; the wall time is taken around
    the process (interpreter start, parsing and every play), the sampler runs beside it."""
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        sampler = _MemorySampler(process.pid)
        sampler.start()
        returncode = process.wait()
        wall = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
    return PlaybookRun(returncode, started, wall, sampler.peak_tree_rss, sampler.peak_forks_rss,
                       sampler.peak_main_rss, sampler.peak_processes, sampler.samples)
