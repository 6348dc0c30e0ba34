# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The processes of a node that hold an NVIDIA device open, read from /proc.

PRIVATE to the collection. Stdlib only, read-only, Python 3.8+: this runs on every node.
A driver cannot be unloaded or replaced while a process keeps one of its devices open: the drain before a driver
change waits until this lists nobody. Processes come and go while it reads, so a pid or fd that vanishes (or that
the kernel hides) is skipped; only a proc directory that cannot be listed at all is an error.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import glob
import os
import re
import stat

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._detect import NVIDIA_CHAR_MAJOR
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, shown

# kubelet's pod cgroup: /kubepods/besteffort/pod<uid> (cgroupfs) or kubepods-besteffort-pod<uid with _>.slice
# (systemd); a static pod's uid is a hash without dashes
_POD = re.compile(r"(?:^|[/-])pod([0-9a-f]+(?:[-_][0-9a-f]+)*)(?:\.slice)?(?=/|$)")
# the container's own cgroup ends the path: <id>, cri-containerd-<id>.scope, docker-<id>.scope, crio-<id>.scope
_CONTAINER = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")
_GONE = (errno.ENOENT, errno.ESRCH)


def parse_majors(text):
    """The NVIDIA character majors: 195, plus every nvidia* name of /proc/devices' "Character devices:" list
    (nvidia-uvm, nvidia-caps, nvidia-nvswitch... are given a free major at module load)."""
    # NVIDIA_CHAR_MAJOR (nvidia<N>, nvidiactl, nvidia-modeset) is fixed by the driver; the others are dynamic
    majors, in_char = {NVIDIA_CHAR_MAJOR}, False
    for line in text.splitlines():
        line = line.strip()
        if line.endswith(":"):
            in_char = line == "Character devices:"
            continue
        fields = line.split(None, 1)
        if in_char and len(fields) == 2 and fields[0].isdigit() and fields[1].startswith("nvidia"):
            majors.add(int(fields[0]))
    return sorted(majors)


def parse_cgroup(text):
    """(pod_uid, container_id) from /proc/<pid>/cgroup text (v1 lines or v2's single 0::/ line); None where absent."""
    pod_uid = container_id = None
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        pod = _POD.search(path)
        if pod and pod_uid is None:
            pod_uid = pod.group(1).replace("_", "-")
        container = _CONTAINER.search(path)
        if container and container_id is None:
            container_id = container.group(1)
    return pod_uid, container_id


def _read(path):
    """A file's text, None when it is gone or hidden (the process ended, or the kernel refuses)."""
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _node_devices(root):
    """{(st_dev, st_ino): node path} of <root>/dev/nvidia* and the nvidia-caps nodes (a sandbox's "devices" are
    plain files; a bind-mounted device is the same inode), directories left out."""
    root = os.path.abspath(root or "/").rstrip("/")
    found = {}
    for host in sorted(glob.glob(root + "/dev/nvidia*") + glob.glob(root + "/dev/nvidia-caps/*")):
        try:
            st = os.stat(host)
        except OSError:
            continue  # a dangling link, or removed since the glob
        if not stat.S_ISDIR(st.st_mode):
            found[(st.st_dev, st.st_ino)] = host[len(root):]
    return found


def _holds(st, majors, identities):
    if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors:
        return True
    return (st.st_dev, st.st_ino) in identities


def _process(proc, pid, majors, identities):
    """The NVIDIA fds of one process as readlink paths; raises OSError when its fd directory cannot be listed."""
    fd_dir = os.path.join(proc, str(pid), "fd")
    paths = set()
    for name in os.listdir(fd_dir):
        fd = os.path.join(fd_dir, name)
        try:
            st = os.stat(fd)
        except OSError:
            continue  # closed since the listing, or a link the kernel will not follow for us
        if _holds(st, majors, identities):
            try:
                paths.add(os.readlink(fd))
            except OSError:
                paths.add("?")
    return sorted(paths)


def holders(root="/", proc="/proc"):
    """{holders, devices, majors, unreadable}: the processes that hold an NVIDIA device open (sorted by pid), the node
    paths of the NVIDIA device files, the majors counted as NVIDIA's, and the pids whose fds could not be read for
    lack of permission (a run without root privileges sees only its own user's processes)."""
    if not os.path.isdir(root or "/"):
        raise K3sGpuError("{root}: %s is not a directory on the node" % shown(root), variable="root",
                          fix="set {root} to / for the node itself, or to the sandbox tree")
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError as exc:
        raise K3sGpuError("{proc}: cannot list %s (%s)" % (shown(proc), exc.strerror), variable="proc",
                          fix="set {proc} to the directory where the node's procfs is mounted")
    majors = parse_majors(_read(os.path.join(proc, "devices")) or "")
    wanted = set(majors)
    identities = _node_devices(root)
    found, unreadable, own = [], [], os.getpid()
    for pid in pids:
        if pid == own:
            continue
        try:
            devices = _process(proc, pid, wanted, identities)
        except OSError as exc:
            if exc.errno not in _GONE:
                unreadable.append(pid)  # EACCES: this process may hold a device: the caller must know it was not read
            continue
        if devices:
            pod_uid, container_id = parse_cgroup(_read(os.path.join(proc, str(pid), "cgroup")) or "")
            command = (_read(os.path.join(proc, str(pid), "comm")) or "").strip()
            found.append(dict(pid=pid, command=command, devices=devices, pod_uid=pod_uid, container_id=container_id))
    return dict(holders=found, devices=sorted(identities.values()), majors=majors, unreadable=unreadable)
