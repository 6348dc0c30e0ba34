# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Host-side plumbing of the test nodes: per-node cgroups, systemd-nspawn start and stop, leftovers.

No host systemd is assumed (see docs in tests/nodes/README.md). Each node runs from its own
cgroup in the `unified` and `name=systemd` hierarchies, so that two nodes' PID 1s never share
`payload/` (with --keep-unit, nspawn puts the container under the CALLER's cgroup).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_HIERARCHIES = ("unified", "systemd")
CGROUP_PREFIX = "k3s-gpu-node-"
NSPAWN_RUN = Path("/run/systemd/nspawn")


def cgroup_dirs(name):
    """The node's own cgroup in every hierarchy it may appear in (v1 controllers included)."""
    return [h / (CGROUP_PREFIX + name) for h in sorted(CGROUP_ROOT.iterdir()) if h.is_dir()]


def start(name, rootfs, hostname, binds, log_path):
    """Start `systemd-nspawn -b` detached, from the node's own cgroup; return nspawn's PID."""
    dirs = [CGROUP_ROOT / h / (CGROUP_PREFIX + name) for h in CGROUP_HIERARCHIES]
    for directory in dirs:
        directory.mkdir(exist_ok=True)

    def enter_cgroup():
        for directory in dirs:
            (directory / "cgroup.procs").write_text(str(os.getpid()))

    argv = ["systemd-nspawn", "-b", "--register=no", "--keep-unit", "-q", "--console=pipe",
            "-M", name, "--hostname=" + hostname, "-D", str(rootfs)]
    argv += ["--bind-ro=%s:%s" % (src, dst) for src, dst in binds]
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        # detached: own session, no pipe to the caller (Ansible's command module waits on pipes);
        # preexec_fn is safe here: the CLI and the playbooks call this from a single thread
        proc = subprocess.Popen(  # pylint: disable=consider-using-with,subprocess-popen-preexec-fn
            argv, stdin=devnull, stdout=log, stderr=log, start_new_session=True, preexec_fn=enter_cgroup, close_fds=True)
    return proc.pid


def is_nspawn(pid, rootfs):
    """True if pid is still the systemd-nspawn that runs rootfs (guards against PID reuse)."""
    try:
        argv = Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"systemd-nspawn") and str(rootfs).encode() in argv


def container_pid1(nspawn_pid):
    """Host PID of the container's PID 1 (nspawn's child), or None."""
    for task in Path("/proc/%d/task" % nspawn_pid).glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:
            continue
        if children:
            return int(children[0])
    return None


def nsenter(pid1, argv, timeout=30, check=False):
    """Run a command inside the node (all namespaces of its PID 1)."""
    return subprocess.run(["nsenter", "-t", str(pid1), "-a"] + list(argv), capture_output=True, text=True,
                          timeout=timeout, check=check)


def mount_ns(pid):
    try:
        return os.stat("/proc/%d/ns/mnt" % pid).st_ino
    except OSError:
        return None


def port_open(port, host="127.0.0.1"):
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path("/proc/%d" % pid).exists():
            return True
        try:  # our own child when called from the process that started it
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return not Path("/proc/%d" % pid).exists()


def stop(pid, rootfs, timeout=20):
    """Clean poweroff: nspawn turns SIGTERM into SIGRTMIN+3 for PID 1; a 2nd TERM, then KILL, if stuck."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if not is_nspawn(pid, rootfs):
            return
        os.kill(pid, sig)
        if wait_gone(pid, wait):
            return


def node_processes(name, mntns):
    """PIDs still in the node's cgroups or in its mount namespace."""
    pids = set()
    for directory in cgroup_dirs(name):
        for procs in directory.rglob("cgroup.procs") if directory.is_dir() else ():
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
    if mntns:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and mount_ns(int(proc.name)) == mntns:
                pids.add(int(proc.name))
    pids.discard(os.getpid())
    return sorted(pids)


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        wait_gone(pid, 5)


def remove_cgroups(name):
    for directory in cgroup_dirs(name):
        if directory.is_dir():
            for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                sub.rmdir()
            directory.rmdir()


def mounts_under(path):
    """Mount points at or below path (host mount namespace), deepest first."""
    prefix = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_all(path):
    for point in mounts_under(path):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_run_dirs(name):
    """nspawn's empty per-machine dir under /run (it refuses to remove it itself: host /run is not tmpfs)."""
    for directory in (NSPAWN_RUN / "propagate" / name, NSPAWN_RUN / "unix-export" / name):
        try:
            directory.rmdir()
        except OSError:
            pass


def veths(name):
    """Host interfaces nspawn would have made for this node (none with host networking)."""
    prefix = "ve-" + name[:12]
    return sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(prefix))


def leftovers(name, node_dir, mntns=None, port=None):
    """Everything a stopped node must not leave behind; [] when clean."""
    found = ["process %d" % pid for pid in node_processes(name, mntns)]
    found += ["cgroup %s" % d for d in cgroup_dirs(name) if d.exists()]
    found += ["mount %s" % m for m in mounts_under(node_dir)]
    found += ["veth %s" % v for v in veths(name)]
    found += ["run dir %s" % d for d in (NSPAWN_RUN / "propagate" / name,) if d.exists()]
    if port and port_open(port):
        found.append("port 127.0.0.1:%d still listening" % port)
    if Path(node_dir).exists():
        found.append("directory %s" % node_dir)
    return found
