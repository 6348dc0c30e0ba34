# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run one ansible-playbook and measure it from outside: wall time, and the controller's memory
sampled every 100 ms: the RSS of ansible-playbook and all its descendants added up, of ansible-playbook
and its forked workers only (with the local connection, each host's module also runs as a descendant,
which on a real fleet runs on the node), the same two sums of PSS (every PSS_SAMPLE_SECONDS), and the
peak RSS of the ansible-playbook process itself."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import threading
import time

SAMPLE_SECONDS = 0.1
# PSS (/proc/<pid>/smaps_rollup) makes the kernel walk the page tables of the process: about 0.45 ms of CPU
# per ansible process, one pass over the ~40 processes of a 10-host run (10 forks) 19 ms of CPU and
# 130 ms of wall time on the 2-vCPU development VM (RSS from statm: about 1 ms); hence PSS less often
PSS_SAMPLE_SECONDS = 0.5
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass
class PlaybookRun:
    returncode: int
    started: float  # time.monotonic(), the clock of the events file
    wall_seconds: float
    peak_tree_rss: int  # bytes, the largest sum over the process tree seen by the sampler
    peak_forks_rss: int  # bytes, the same over ansible-playbook and its workers (no module processes)
    peak_main_rss: int  # bytes, VmHWM of ansible-playbook itself (its last sample: the kernel keeps the peak)
    # bytes, the largest PSS sums over the same two sets; None when smaps_rollup could not be read
    peak_tree_pss: int | None
    peak_forks_pss: int | None
    peak_processes: int  # the most processes in the tree at one sample (main + forks)
    samples: int
    pss_samples: int  # PSS passes (every PSS_SAMPLE_SECONDS) that read every process


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


def _pss(pid):
    """Proportional set size in bytes (a page shared by n processes counts 1/n in each); 0 for a process
    that ended, None when smaps_rollup is missing (kernel before 4.14) or unreadable (another user's)."""
    try:
        with open("/proc/%d/smaps_rollup" % pid, "rb") as handle:
            text = handle.read()
    except ProcessLookupError:
        return 0  # a zombie, or it ended while being read
    except FileNotFoundError:
        return None if os.path.exists("/proc/%d" % pid) else 0
    except OSError:
        return None
    start = text.find(b"\nPss:")
    if start < 0:
        return None
    try:
        return int(text[start + 5:text.index(b"kB", start)]) * 1024
    except ValueError:
        return None


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


class _Sampler(threading.Thread):
    """Every `interval` seconds until `stop` is set: one pass over ansible-playbook and its descendants.
    A worker is a fork that never execs: its command line is the main process's."""

    interval = SAMPLE_SECONDS

    def __init__(self, pid, stop):
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = stop
        self.main_cmdline = None
        self.samples = 0

    def processes(self):
        """The pids of the tree (main process first), and of ansible-playbook and its workers."""
        tree, pending = [], [self.pid]
        while pending:
            pid = pending.pop()
            tree.append(pid)
            pending += _children(pid)
        if self.main_cmdline is None:
            cmdline = _cmdline(self.pid)
            if cmdline and b"ansible-playbook" in cmdline:  # not yet: between fork and exec, it is this script
                self.main_cmdline = cmdline
        return tree, [pid for pid in tree if _cmdline(pid) == self.main_cmdline]

    def sample(self):
        raise NotImplementedError

    def run(self):
        self.sample()
        while not self.stop.wait(self.interval):
            self.sample()


class _RssSampler(_Sampler):
    """The summed RSS of the tree and of main + workers. Forked workers share the parent's pages
    copy-on-write, so the sum counts shared pages once per process: an upper bound of what the tree
    really occupies, which is what matters for sizing a controller."""

    def __init__(self, pid, stop):
        super().__init__(pid, stop)
        self.peak_tree = self.peak_forks = self.peak_main = self.peak_processes = 0

    def sample(self):
        tree, forks = self.processes()
        rss = {pid: _rss(pid) for pid in tree}
        self.peak_tree = max(self.peak_tree, sum(rss.values()))
        self.peak_forks = max(self.peak_forks, sum(rss[pid] for pid in forks))
        self.peak_main = max(self.peak_main, _high_water_mark(self.pid))
        self.peak_processes = max(self.peak_processes, len(tree))
        self.samples += 1


class _PssSampler(_Sampler):
    """The summed PSS of the same two sets: each shared page is split among the processes sharing it,
    so the sum is what they occupy together. Its own thread, so that a slow pass (see
    PSS_SAMPLE_SECONDS) does not space out the RSS samples. A sum with one unreadable PSS is unknown,
    and so is then the peak: peak() gives None."""

    interval = PSS_SAMPLE_SECONDS

    def __init__(self, pid, stop):
        super().__init__(pid, stop)
        self.peak_tree = self.peak_forks = 0
        self.unreadable = False

    def sample(self):
        if self.unreadable:
            return
        tree, forks = self.processes()
        pss = {pid: _pss(pid) for pid in tree}
        if None in pss.values():
            self.unreadable = True
            return
        self.peak_tree = max(self.peak_tree, sum(pss.values()))
        self.peak_forks = max(self.peak_forks, sum(pss[pid] for pid in forks))
        self.samples += 1

    def peak(self):
        """(tree, main + workers) in bytes, or (None, None)"""
        if self.unreadable or not self.samples:
            return None, None
        return self.peak_tree, self.peak_forks


def run_playbook(argv, env, log_path, cwd):
    """Run argv (an ansible-playbook command line), output to log_path; the wall time is taken around
    the process (interpreter start, parsing and every play), the samplers run beside it."""
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()
        rss, pss = _RssSampler(process.pid, stop), _PssSampler(process.pid, stop)
        rss.start()
        pss.start()
        returncode = process.wait()
        wall = time.monotonic() - started
        stop.set()
        rss.join()
        pss.join()
    return PlaybookRun(returncode, started, wall, rss.peak_tree, rss.peak_forks, rss.peak_main, *pss.peak(),
                       rss.peak_processes, rss.samples, pss.samples)
