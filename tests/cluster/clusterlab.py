# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Kubernetes lab: a one-node cluster on 127.0.0.1 with a real API server and a real kubelet.

    scripts/cluster-lab.sh up [--kubernetes 1.34|1.36] [--release R] [--gpus N] [--strategy envvar|cdi-cri]
                              [--node-root DIR] [--allocation device_plugin|dra]
    scripts/cluster-lab.sh up --release v1.36.3+rke2r1    (an rke2 node: its paths, base and RuntimeClasses)
    scripts/cluster-lab.sh down | status

Everything runs from binaries the tests build from the Go module proxy (tests/testbins.py): kine on
SQLite (k3s's datastore), kube-apiserver, kube-controller-manager, kube-scheduler and kubelet of the
chosen Kubernetes line, the containerd line the release embeds, NVIDIA's real runtime wrappers
(nvidia-container-runtime, .cdi, .legacy) as the handlers' BinaryName, and a device plugin TEST DOUBLE
(tests/device_plugin_testdouble) that speaks kubelet's real v1beta1 API for fake character devices.

containerd's config is what the node gets for the release (a k3s or an rke2 release: the release's suffix
says which): the collection's own module (k3s_gpu.nvidia.containerd_runtimes, run by ansible-playbook) writes
its drop-in or template on a sandbox node root of that distribution (/var/lib/rancher/k3s or .../rke2) where
NVIDIA's binaries are installed, and the release's base is composed with it as k3s or rke2 does
(tests/conformance/cases.compose_node; rke2 runs k3s's agent code, with its own paths and header). The lab then adds only what this machine needs
(tests/conformance/lab.apply_lab_overrides: no CAP_SYS_RESOURCE, no systemd; plus its private CDI spec
dir) and prints them.

Faked, because it cannot run here: the GPU (fake devices made with mknod, major 195 as NVIDIA's), the
k3s/rke2 binary (its template step, the RuntimeClasses it ships and its --node-labels are done by the lab as
k3s or rke2 does them: k3s's runtimes.yaml as plain objects, rke2's rke2-runtimeclasses chart as objects its
Helm release owns), and NVIDIA's device plugin (the test double). The NVIDIA runtime runs in its `cdi`
mode from a private config file (NVIDIA_CTK_CONFIG_FILE_PATH, never /etc): its legacy mode needs
libnvidia-container and a driver. The driver's user-space in the CDI spec is two test doubles: an
nvidia-smi script that answers -L for the devices the container got, and a libnvidia-ml.so.1 that is a
text file.

Nothing outside the lab dir is kept after `down`: processes (found by the K3S_GPU_CLUSTER_LAB marker in
their environment, shims included), mounts under the lab dir, the cgroup tree /k3s-gpu-lab, the
/var/log/containers links kubelet made, and the /run/containerd and /run/netns entries of the run.
A killed run is cleaned by the next `up`.

With --allocation dra the node is a DRA node (gpu_node_allocation=dra: the collection's module writes its label
k3s-gpu.nvidia/gpu-allocation=dra) and no device plugin runs on it. Two DRA kubelet plugins run as plain processes
against the lab's kubelet registration dir and CDI dir instead: Kubernetes' own DRA test driver
(k8s.io/kubernetes/test/e2e/dra/test-driver, of the lab's Kubernetes module and version; driver
test-driver.cdi.k8s.io, env-only CDI edits) and our DRA TEST DOUBLE of NVIDIA's driver (tests/dra_plugin_testdouble:
driver gpu.nvidia.com, NVIDIA's attribute names, a claim's CDI spec with its fake /dev/nvidia<N>). The DeviceClasses
are NVIDIA's own, rendered from NVIDIA's chart (../shared/charts, $K3S_GPU_SHARED) with the values of the collection's
HelmChart, and the test driver's.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import textwrap
import tomllib
import time
import urllib.request

import yaml

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, ".tmp", "collections"))

# pylint: disable=wrong-import-position
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra_driver  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.tests import testbins  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.tests.conformance import cases, lab  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.tests.nodes.nspawn import mounts_under  # noqa: E402

LAB_DIR = os.environ.get("K3S_GPU_CLUSTER_LAB", "/tmp/k3s-gpu-cluster-lab")
MARKER = "K3S_GPU_CLUSTER_LAB"
NODE_NAME = "lab-node"
COLLECTIONS_PATH = os.pathsep.join((os.path.join(ROOT, ".tmp", "collections"), os.path.join(ROOT, ".tmp", "extra-collections")))
CGROUP_NAME = "k3s-gpu-lab"
CGROUP_ROOT = "/sys/fs/cgroup"
CONTAINER_LOG_LINKS = "/var/log/containers"
RUN_DIRS = ("/run/containerd", "/run/netns")
# kubelet's device manager ignores --root-dir: its registration socket is always here (pluginapi.KubeletSocket)
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
PORTS = {"kine": 23790, "kube-apiserver": 26443, "kube-controller-manager": 20257, "kube-scheduler": 20259,
         "kubelet": 20250, "kubelet-healthz": 20248}
# the Kubernetes line -> its build and the default k3s and rke2 releases (the same minor; 1.34.6 is the first of its
# line with containerd 2.2 and drop-ins; 1.36.2 the first with 2.3)
KUBERNETES = {"1.34": ("kubernetes-v1.34", {"k3s": "v1.34.6+k3s1", "rke2": "v1.34.6+rke2r1"}),
              "1.36": ("kubernetes-v1.36", {"k3s": "v1.36.3+k3s1", "rke2": "v1.36.3+rke2r1"})}
DEFAULT_KUBERNETES = "1.36"
# what rke2's rke2-runtimeclasses chart leaves on its objects: Helm's ownership (helm-controller installs the chart as
# release rke2-runtimeclasses in kube-system); k3s's deploy controller applies runtimes.yaml as plain objects
RKE2_RUNTIMECLASS_CHART = "rke2-runtimeclasses"
NVIDIA_BINARIES = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy")
NVIDIA_MAJOR = 195  # the character major of /dev/nvidia<N> (NVIDIA's driver)
CDI_KIND = "nvidia.com/gpu"
CDI_SPEC_NAME = "nvidia-lab.json"
SERVICE_CIDR = "10.43.0.0/16"
START_TIMEOUT = 120
POD_SUBNET = "10.42.77.0/24"
# kubelet refuses a loopback node IP: the node gets a documentation address (TEST-NET-2, never routed) on
# lo for the run, so that nothing of the lab listens beyond this machine
NODE_IP = "198.51.100.77"


class LabError(RuntimeError):
    """A refusal or failure, with what to do."""


def log(message):
    print(message, flush=True)


def path(*parts):
    return os.path.join(LAB_DIR, *parts)


# ------------------------------------------------------------------ state
def read_state():
    try:
        with open(path("state.json"), encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def write_state(state):
    tmp = path(".state.json.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
    os.replace(tmp, path("state.json"))


def _proc_start(pid):
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(record):
    return record and _proc_start(record["pid"]) == record["start"]


def marked_pids(lab_dir=None):
    """Every process whose environment carries this lab's marker (the daemons, shims and their children)."""
    want = ("%s=%s" % (MARKER, lab_dir or LAB_DIR)).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                if want in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill(pids, sig):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [pid for pid in pids if _proc_start(pid) is not None and not _zombie(pid)]
        if not pids:
            return []
        time.sleep(0.1)
    return pids


def _zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ refusals
def port_taken(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_free():
    """Refuse, naming it, a port, socket or directory that something else holds."""
    taken = ["port 127.0.0.1:%d (%s)" % (port, name) for name, port in PORTS.items() if port_taken(port)]
    if taken:
        raise LabError("cannot start the lab: %s already in use; stop what listens there (ss -ltnp)"
                       % ", ".join(taken))
    if os.path.lexists(os.path.join(DEVICE_PLUGIN_DIR, "kubelet.sock")):
        raise LabError("cannot start the lab: %s/kubelet.sock exists: another kubelet (or one a killed lab left without "
                       "its state file) owns the device plugin directory; stop it or remove the socket" % DEVICE_PLUGIN_DIR)
    if node_ip_present():
        raise LabError("cannot start the lab: address %s is already on an interface (ip -br addr); `down` removes the "
                       "lab's own" % NODE_IP)
    if os.path.lexists(LAB_DIR):
        raise LabError("cannot start the lab: %s exists and is not a lab this script left; remove it or set "
                       "K3S_GPU_CLUSTER_LAB to another directory" % LAB_DIR)
    cgroup = os.path.join(CGROUP_ROOT, "memory", CGROUP_NAME)
    if os.path.exists(cgroup):
        raise LabError("cannot start the lab: cgroup %s exists (another lab?); `down` removes a stale one" % cgroup)


def node_ip_present():
    proc = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=False)
    return (" %s/32 " % NODE_IP) in proc.stdout


# ------------------------------------------------------------------ teardown
def _umount_all(prefix):
    for _attempt in range(5):
        points = sorted(set(mounts_under(prefix)), key=len, reverse=True)
        if not points:
            return []
        for point in points:
            subprocess.run(["umount", point], capture_output=True, check=False)
        time.sleep(0.1)
    points = sorted(set(mounts_under(prefix)), key=len, reverse=True)
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return mounts_under(prefix)


def _cgroup_dirs():
    return sorted(glob.glob(os.path.join(CGROUP_ROOT, "*", CGROUP_NAME)))


def _remove_cgroups(timeout=20):
    """Kill what is left in the lab's cgroup tree, then rmdir it deepest first. A killed process leaves its cgroup
    only once it has exited, which on a loaded machine (a process in uninterruptible I/O) can take seconds."""
    left = []
    for top in _cgroup_dirs():
        for _attempt in range(timeout * 10):
            dirs = sorted((d for d, _s, _f in os.walk(top)), key=len, reverse=True)
            for directory in dirs:
                with contextlib.suppress(OSError):
                    with open(os.path.join(directory, "cgroup.procs"), encoding="utf-8") as handle:
                        _kill([int(p) for p in handle.read().split()], signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
            if not os.path.exists(top):
                break
            time.sleep(0.1)
        if os.path.exists(top):
            left.append(top)
    return left


def _run_entries():
    entries = []
    for directory in RUN_DIRS:
        if os.path.isdir(directory):
            entries += [os.path.join(directory, name) for name in os.listdir(directory)]
            for sub in ("s", "runc", "fifo", "io.containerd.runtime.v2.task"):
                sub_dir = os.path.join(directory, sub)
                if os.path.isdir(sub_dir):
                    entries += [os.path.join(sub_dir, name) for name in os.listdir(sub_dir)]
    return sorted(entries)


def _dead_socket(entry):
    """A unix socket nobody listens on (a shim of this lab that is gone); a live one may be another lab's."""
    if not stat.S_ISSOCK(os.lstat(entry).st_mode):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(entry)
        except OSError:
            return True
    return False


def _remove_run_entries(before):
    """New entries under /run/containerd (the shims' sockets, runc's state dirs are paths they hard-code) that
    are dead sockets or empty dirs; a live socket or a busy dir is another containerd's and stays."""
    kept = set(before.get("run_entries", []))
    for entry in sorted(set(_run_entries()) - kept, key=len, reverse=True):
        with contextlib.suppress(OSError):
            if os.path.islink(entry) or not os.path.exists(entry):
                continue
            if os.path.isdir(entry):
                os.rmdir(entry)  # only when empty
            elif _dead_socket(entry):
                os.unlink(entry)
    for directory in RUN_DIRS:
        if directory not in before.get("run_dirs", []) and os.path.isdir(directory):
            for sub in ("s", "runc", "fifo", "io.containerd.runtime.v2.task"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(directory, sub))
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _remove_device_plugin_dir(before):
    """kubelet's sockets and checkpoint in the fixed device plugin dir, and the dirs when the lab made them."""
    if not os.path.isdir(DEVICE_PLUGIN_DIR):
        return
    for name in os.listdir(DEVICE_PLUGIN_DIR):
        if name in ("kubelet.sock", "kubelet_internal_checkpoint") or name.startswith("k3s-gpu-testdouble"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(DEVICE_PLUGIN_DIR, name))
    kept = before.get("kubelet_dirs", [])
    for directory in (DEVICE_PLUGIN_DIR, os.path.dirname(DEVICE_PLUGIN_DIR)):
        if directory not in kept:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _remove_log_links():
    if not os.path.isdir(CONTAINER_LOG_LINKS):
        return
    for link in os.listdir(CONTAINER_LOG_LINKS):
        full = os.path.join(CONTAINER_LOG_LINKS, link)
        with contextlib.suppress(OSError):
            if os.path.islink(full) and os.readlink(full).startswith(LAB_DIR + "/"):
                os.unlink(full)


def _stop_pods(state):
    """Stop and remove every pod sandbox through CRI, so that the shims exit and unmount their rootfs."""
    sock = state.get("containerd_socket") if state else None
    if not sock or not os.path.exists(sock):
        return
    try:
        import grpc  # pylint: disable=import-outside-toplevel
        from cri_api.v1 import api_pb2 as cri  # pylint: disable=import-outside-toplevel
        from cri_api.v1 import api_pb2_grpc as cri_grpc  # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    with grpc.insecure_channel("unix://" + sock) as channel:
        runtime = cri_grpc.RuntimeServiceStub(channel)
        with contextlib.suppress(grpc.RpcError):
            for sandbox in runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items:
                with contextlib.suppress(grpc.RpcError):
                    runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=30)
                    runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=30)


def down(quiet=False):
    """Stop everything the lab started (by PID, then by marker) and remove everything it made."""
    state = read_state()
    if state is None and not os.path.exists(LAB_DIR) and not _cgroup_dirs() and not marked_pids():
        if not quiet:
            log("cluster lab: nothing to stop (%s absent)" % LAB_DIR)
        return []
    order = ("device-plugin", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "kine")
    processes = (state or {}).get("processes", {})
    for name in order:
        record = processes.get(name)
        if _alive(record):
            _kill([record["pid"]], signal.SIGTERM)
            if _wait_gone([record["pid"]], 15):
                _kill([record["pid"]], signal.SIGKILL)
    _stop_pods(state)
    record = processes.get("containerd")
    if _alive(record):
        _kill([record["pid"]], signal.SIGTERM)
        if _wait_gone([record["pid"]], 15):
            _kill([record["pid"]], signal.SIGKILL)
    left = marked_pids()
    _kill(left, signal.SIGKILL)
    still = _wait_gone(left, 10)
    problems = ["process %d still runs" % pid for pid in still]
    problems += ["cgroup %s could not be removed" % d for d in _remove_cgroups()]
    problems += ["mount %s could not be removed" % m for m in _umount_all(LAB_DIR)]
    _remove_log_links()
    _remove_device_plugin_dir((state or {}).get("before", {}))
    if (state or {}).get("node_ip_added") and node_ip_present():
        subprocess.run(["ip", "addr", "del", NODE_IP + "/32", "dev", "lo"], capture_output=True, check=False)
    if node_ip_present() and (state or {}).get("node_ip_added"):
        problems.append("address %s still on lo" % NODE_IP)
    _remove_run_entries((state or {}).get("before", {}))
    if not problems:
        shutil.rmtree(LAB_DIR, ignore_errors=True)
        if os.path.exists(LAB_DIR):
            problems.append("%s could not be removed" % LAB_DIR)
    if not quiet:
        log("cluster lab: stopped and removed%s" % ("" if not problems else ": " + "; ".join(problems)))
    return problems


# ------------------------------------------------------------------ certificates
def _openssl(*args, stdin=None):
    proc = subprocess.run(["openssl"] + list(args), input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError("openssl %s failed: %s" % (" ".join(args[:2]), proc.stderr.strip()))
    return proc.stdout


def make_certificates():
    """A CA, the API server's serving cert, client certs per identity, the service-account key pair."""
    pki = path("pki")
    os.makedirs(pki, mode=0o700)
    ca_key, ca_crt = os.path.join(pki, "ca.key"), os.path.join(pki, "ca.crt")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-keyout", ca_key, "-out", ca_crt, "-subj", "/CN=k3s-gpu-lab-ca")
    ext = os.path.join(pki, "ext.cnf")

    def issue(name, subject, extensions):
        key, csr, crt = (os.path.join(pki, name + suffix) for suffix in (".key", ".csr", ".crt"))
        with open(ext, "w", encoding="utf-8") as handle:
            handle.write(extensions)
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", csr, "-subj", subject)
        _openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
                 "-out", crt, "-extfile", ext)
        os.unlink(csr)
        return key, crt

    issue("apiserver", "/CN=kube-apiserver",
          "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
          "subjectAltName=IP:127.0.0.1,IP:10.43.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
          "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    issue("kubelet-serving", "/CN=%s" % NODE_NAME,
          "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
          "subjectAltName=IP:%s,IP:127.0.0.1,DNS:%s,DNS:localhost\n" % (NODE_IP, NODE_NAME))
    client = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    identities = {
        "admin": "/O=system:masters/CN=k3s-gpu-lab-admin",
        "kube-controller-manager": "/CN=system:kube-controller-manager",
        "kube-scheduler": "/CN=system:kube-scheduler",
        "kubelet": "/O=system:nodes/CN=system:node:%s" % NODE_NAME,
        "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
    }
    for name, subject in identities.items():
        issue(name, subject, client)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out",
             os.path.join(pki, "sa.key"))
    _openssl("pkey", "-in", os.path.join(pki, "sa.key"), "-pubout", "-out", os.path.join(pki, "sa.pub"))
    os.unlink(ext)
    for name in identities:
        write_kubeconfig(name)


def write_kubeconfig(name):
    pki = path("pki")

    def b64(file_name):
        with open(os.path.join(pki, file_name), "rb") as handle:
            return base64.b64encode(handle.read()).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": "https://127.0.0.1:%d" % PORTS["kube-apiserver"],
                                                 "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": name, "user": {"client-certificate-data": b64(name + ".crt"),
                                          "client-key-data": b64(name + ".key")}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": name}}],
    }
    target = path("kubeconfig" if name == "admin" else "%s.kubeconfig" % name)
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    os.chmod(target, 0o600)


# ------------------------------------------------------------------ processes
def start(state, name, argv, env=None, cwd=None):
    log_path = path("logs", name + ".log")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "CONTAINERD_", "NOTIFY_SOCKET"))}
    full_env.update(env or {})
    full_env[MARKER] = LAB_DIR
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                cwd=cwd or LAB_DIR, start_new_session=True)  # pylint: disable=consider-using-with
    state["processes"][name] = {"pid": proc.pid, "start": _proc_start(proc.pid), "argv": argv, "env": env or {},
                                "log": log_path}
    write_state(state)
    return proc


def wait_for(what, probe, state, name, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(state["processes"].get(name)):
            raise LabError("%s exited while starting (%s); last lines of %s:\n%s"
                           % (name, what, state["processes"][name]["log"], tail(state["processes"][name]["log"])))
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.25)
    raise LabError("%s: %s not reached in %d s; last lines of its log:\n%s"
                   % (name, what, timeout, tail(state["processes"][name]["log"])))


def tail(log_path, lines=25):
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _https_ok(url, ca=None):
    context = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()  # noqa: S323
    if ca:
        context.load_cert_chain(path("pki", "admin.crt"), path("pki", "admin.key"))
    with urllib.request.urlopen(url, context=context, timeout=2) as response:  # noqa: S310
        return response.status == 200


def kubectl(state, *args, stdin=None, check=True):
    proc = subprocess.run([state["binaries"]["kubectl"], "--kubeconfig", path("kubeconfig")] + list(args),
                          input=stdin, capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise LabError("kubectl %s failed: %s" % (" ".join(args), proc.stderr.strip()))
    return proc.stdout


# ------------------------------------------------------------------ the node
def distribution_of(release):
    """k3s or rke2, by the release's suffix (+k3sN, +rke2rN); the refusal names the form."""
    distribution = distro.RKE2 if "+rke2r" in release else distro.K3S if "+k3s" in release else None
    if distribution is None:
        raise LabError("--release %s: expected a k3s or rke2 release such as v1.36.3+k3s1 or v1.36.3+rke2r1" % release)
    return distribution


def check_node_root(node_root, distribution):
    """A converged node tree of the release's distribution: its data or config dir is there, the other one's is not."""
    own = distro.distribution_paths(distribution)
    other_distribution = distro.RKE2 if distribution == distro.K3S else distro.K3S
    other = distro.distribution_paths(other_distribution)
    has_own = any(os.path.isdir(node_root + own[key]) for key in ("data_dir", "config_yaml_d"))
    has_other = any(os.path.isdir(node_root + other[key]) for key in ("data_dir", "config_yaml_d"))
    if has_other and not has_own:
        raise LabError("--node-root %s is a node of %s (it has %s) but the release is %s's: pass a %s release with "
                       "--release, or a node the role converged for %s" % (node_root, other_distribution, other["data_dir"],
                                                                           distribution, other_distribution, distribution))
    if not has_own:
        raise LabError("--node-root %s has neither %s nor %s: not a %s node the gpu_node role converged"
                       % (node_root, own["data_dir"], own["config_yaml_d"], distribution))


def sandbox_node(state, release, toolkit_bin, node_root=None):
    """The node as the collection sees it: NVIDIA's binaries installed, then the collection's module run. With
    node_root (a node the gpu_node role converged, its binaries NVIDIA's real ones), a copy of that node instead:
    the lab writes its own keys into the copy's drop-in, never into the caller's tree."""
    node = path("node")
    distribution = state["distribution"]
    paths = distro.distribution_paths(distribution)
    if node_root:
        shutil.copytree(node_root, node, symlinks=True)
        os.makedirs(node + "/cni/bin", exist_ok=True)
        os.makedirs(node + "/cni/net.d", exist_ok=True)
        return _compose_node(state, node, release, paths)
    for name in NVIDIA_BINARIES:
        target = node + "/usr/bin/" + name
        os.makedirs(os.path.dirname(target), exist_ok=True)
        # a copy, not a symlink: under the node's root an absolute link target points into the node
        try:
            os.link(os.path.join(toolkit_bin, name), target)
        except OSError:
            shutil.copy2(os.path.join(toolkit_bin, name), target)
    os.makedirs(node + paths["containerd_dir"], exist_ok=True)
    os.makedirs(node + "/cni/bin")
    os.makedirs(node + "/cni/net.d")
    node_gpu_files(node, state["gpus"])
    playbook = path("converge.yml")
    with open(playbook, "w", encoding="utf-8") as handle:
        handle.write(textwrap.dedent("""\
            - name: The collection writes the NVIDIA runtimes of the lab's sandbox node
              hosts: localhost
              gather_facts: false
              tasks:
                - name: Write what the release lacks
                  k3s_gpu.nvidia.containerd_runtimes:
                    root: "{root}"
                    distribution: {distribution}
                    release: "{release}"
                    handler_labels: true
                    node_labels: {labels}
                  register: written
                - name: Show it
                  ansible.builtin.debug:
                    var: written
            """).format(root=node, release=release, distribution=distribution,
                        labels=json.dumps(node_labels_for(state.get("allocation", ALLOCATION_DEVICE_PLUGIN)))))
    env = ansible_env()
    playbook_bin = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook_bin, "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
                           playbook], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    with open(path("logs", "converge.log"), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise LabError("the collection's module failed on the sandbox node:\n%s" % (proc.stdout[-3000:] + proc.stderr[-2000:]))
    return _compose_node(state, node, release, paths)


def _compose_node(state, node, release, paths):
    """k3s's (rke2's) start-up step on the node: its config.toml composed from the release's base and what is on the
    node."""
    binaries = ["/usr/bin/" + name for name in NVIDIA_BINARIES if os.path.exists(node + "/usr/bin/" + name)]
    # k3s writes the composed config.toml into the node's containerd dir at each start: so does the lab, so that
    # what the collection reads on the node afterwards (the loaded config) is what the node would have
    loaded = cases.start_node(node, state["distribution"], release, binaries)
    labels = node_labels_of(node, paths)
    state["node"] = {"root": node, "schema": loaded.schema, "labels": labels, "config": paths["config"],
                     "dropin": loaded.dropin[0] if loaded.dropin else None,
                     "runtimes": runtimes_of(loaded)}
    return loaded


def node_labels_for(allocation):
    """The labels the gpu_node role gives a GPU node of this allocation (_host_step.device_plugin_labels)."""
    labels = ["nvidia.com/gpu.present=true"]
    if allocation == k8s_labels.ALLOCATION_DRA:
        labels.append("%s=%s" % (k8s_labels.ALLOCATION_LABEL, k8s_labels.ALLOCATION_DRA))
    return sorted(labels)  # in the role's order: the doctor compares the file the role would write


LAB_DRIVER = "580.95.05"
LAB_TOOLKIT = "1.20.0-1"  # the gpu_node role's pin, and the version the lab builds (v1.20.0)


def node_gpu_files(node, gpus):
    """What the collection reads of a GPU node in the node's tree (its reading, not the containers): GPUs on the PCI bus,
    the driver loaded with its device nodes and /dev/char links, the toolkit's package record and its
    nvidia-cdi-refresh.path enabled (as the role leaves it), a CDI spec for the driver. The devices the containers get
    are the lab's own (fake_devices)."""
    files = {"/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build "
                                            "(k3s_gpu.nvidia lab: a test double)\n" % LAB_DRIVER,
             "/dev/nvidiactl": "",
             "/var/lib/dpkg/status": "Package: nvidia-container-toolkit-base\nStatus: install ok installed\nVersion: %s\n"
                                     % LAB_TOOLKIT,
             "/lib/systemd/system/nvidia-cdi-refresh.path": "[Path]\nPathChanged=/usr/bin/nvidia-ctk\n"}
    devices = []
    for index in range(gpus):
        files["/dev/nvidia%d" % index] = ""
        files["/sys/bus/pci/devices/0000:%02x:00.0/vendor" % (0x17 + index)] = "0x10de\n"
        files["/sys/bus/pci/devices/0000:%02x:00.0/class" % (0x17 + index)] = "0x030200\n"
        devices.append('- name: "%d"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n' % (index, index))
    files["/var/run/cdi/nvidia.yaml"] = ("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n%s- name: all\n"
                                         "containerEdits:\n  mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.%s\n"
                                         % ("".join(devices), LAB_DRIVER))
    for node_path, text in files.items():
        os.makedirs(os.path.dirname(node + node_path), exist_ok=True)
        with open(node + node_path, "w", encoding="utf-8") as handle:
            handle.write(text)
    wants = node + "/etc/systemd/system/multi-user.target.wants"
    os.makedirs(wants, exist_ok=True)
    os.symlink("/lib/systemd/system/nvidia-cdi-refresh.path", wants + "/nvidia-cdi-refresh.path")
    os.makedirs(node + "/dev/char", exist_ok=True)
    for minor, name in [(255, "nvidiactl")] + [(index, "nvidia%d" % index) for index in range(gpus)]:
        os.symlink("../" + name, node + "/dev/char/%d:%d" % (NVIDIA_MAJOR, minor))


def runtimes_of(loaded):
    """The runtime handlers containerd gets: the composed config's and the drop-in's."""
    names = set()
    for text in (loaded.config_text, loaded.dropin[1] if loaded.dropin else ""):
        if text:
            names |= set(lab._runtimes_of(tomllib.loads(text)))  # pylint: disable=protected-access
    return sorted(names)


def ansible_env():
    """ansible-playbook with the collection (through the checkout's symlink) and kubernetes.core."""
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
                ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")


def write_inventory(state):
    """The lab node as an inventory: a server with a GPU, its sandbox root and the lab's kubeconfig. A k3s node in
    the collection's own variables (k3s-ansible's `server` group); an rke2 node as rke2-ansible lays out its
    inventory (rke2_cluster > rke2_servers, the release in rke2_install_version), with only what
    docs/inventories.md says to add (k3s_gpu_servers), so that the collection's reading of that inventory is tested."""
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
              "gpu_node_root": state["node"]["root"], "runtimeclasses_method": "api",
              "runtimeclasses_kubeconfig": path("kubeconfig"), "k3s_gpu_kubeconfig": path("kubeconfig")}
    if state.get("allocation") == k8s_labels.ALLOCATION_DRA:
        common["gpu_node_allocation"] = k8s_labels.ALLOCATION_DRA
    if state["distribution"] == distro.RKE2:
        inventory = {"all": {"vars": dict(common, k3s_gpu_servers="rke2_servers"), "children": {"rke2_cluster": {
            "vars": {"rke2_install_version": state["release"]},
            "children": {"rke2_servers": {"hosts": {NODE_NAME: {}}}, "rke2_agents": {"hosts": {}}}}}}}
    else:
        inventory = {"all": {
            "vars": dict(common, gpu_node_distribution="k3s", gpu_node_release=state["release"]),
            "children": {"server": {"hosts": {NODE_NAME: {}}}}}}
    with open(path("inventory.yml"), "w", encoding="utf-8") as handle:
        json.dump(inventory, handle, indent=2)
    return path("inventory.yml")


def run_playbook(name, *extra, check=True):
    """ansible-playbook k3s_gpu.nvidia.<name> on the lab's inventory; (rc, output)."""
    playbook_bin = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook_bin, "-i", path("inventory.yml"), "k3s_gpu.nvidia." + name] + list(extra),
                          env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    with open(path("logs", "playbook-%s.log" % name), "a", encoding="utf-8") as handle:
        handle.write(output)
    if check and proc.returncode != 0:
        raise LabError("k3s_gpu.nvidia.%s failed on the lab:\n%s" % (name, output[-4000:]))
    return proc.returncode, output


def node_labels_of(node, paths):
    """The node-label list the collection wrote into k3s's config.yaml.d (k3s passes them to kubelet)."""
    labels = []
    for config in sorted(glob.glob(node + paths["config_yaml_d"] + "/*.yaml")):
        with open(config, encoding="utf-8") as handle:
            text = handle.read()
        labels += re.findall(r'^\s*-\s*"?([^"\s]+=[^"\s]*)"?\s*$', text, flags=re.M)
    return labels


def containerd_config(state, loaded):
    """The composed config, the dropin beside it, plus the lab's own keys (printed)."""
    cdi_dir = path("cdi")
    table = lab.V3_RUNTIME if loaded.schema >= 3 else lab.V2_CRI
    extra = [lab.Override(table, "cdi_spec_dirs", [cdi_dir], "the lab's CDI spec dir instead of /etc/cdi, /var/run/cdi", "set"),
             lab.Override(table, "enable_cdi", True, "CDI on (containerd 2.x's default; written for the record)", "set")]
    text, applied = lab.apply_lab_overrides(loaded.config_text, "2.x", run_pods=True, opt_path=path("opt"), extra=extra)
    if loaded.dropin:
        # containerd imports the lab's copy of the drop-in (the binaries' host paths, the lab's keys); the node's own
        # drop-in stays as the collection wrote it, for the collection's reading of the node
        dropin_text, _applied = lab.apply_lab_overrides(loaded.dropin[1], "2.x", run_pods=True, only_runtimes=True)
        dropin_dir = path("containerd", "config.d")
        os.makedirs(dropin_dir, exist_ok=True)
        with open(os.path.join(dropin_dir, os.path.basename(loaded.dropin[0])), "w", encoding="utf-8") as handle:
            handle.write(dropin_text)
        node_dir = os.path.dirname(loaded.dropin[0]) + "/"
        if node_dir not in text:
            raise LabError("the composed config does not import %s*.toml: cannot point it at the lab's drop-in" % node_dir)
        text = text.replace(node_dir, dropin_dir + "/")
    config_path = path("containerd", "config.toml")
    with open(config_path, "w", encoding="utf-8") as handle:
        handle.write(text)
    state["containerd_overrides"] = ["%s %s = %r: %s" % (".".join(o.table or ("runtimes.*.options",)), o.key, o.value, o.why)
                                     for o in applied]
    return config_path


def nvidia_runtime_config(toolkit_bin):
    """NVIDIA's runtime config, private to the lab (NVIDIA_CTK_CONFIG_FILE_PATH)."""
    config = path("nvidia", "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(textwrap.dedent("""\
            # the lab's NVIDIA Container Runtime config (never /etc): cdi mode, the lab's spec dir
            [nvidia-container-runtime]
            debug = "{log}"
            log-level = "trace"
            mode = "cdi"
            runtimes = ["runc"]
            [nvidia-container-runtime.modes.cdi]
            default-kind = "{kind}"
            spec-dirs = ["{cdi}"]
            annotation-prefixes = ["cdi.k8s.io/"]
            [nvidia-container-runtime-hook]
            path = "{hook}"
            [nvidia-ctk]
            path = "{ctk}"
            """).format(log=path("logs", "nvidia-container-runtime.log"), kind=CDI_KIND, cdi=path("cdi"),
                        hook=os.path.join(toolkit_bin, "nvidia-container-runtime-hook"),
                        ctk=os.path.join(toolkit_bin, "nvidia-ctk")))
    return config


NVIDIA_SMI_TESTDOUBLE = """\
#!/bin/sh
# TEST DOUBLE of nvidia-smi (k3s_gpu.nvidia's cluster lab: no GPU, no driver here). It answers -L as NVIDIA's does,
# one line per /dev/nvidia<N> the container got, and fails as NVIDIA's does without libnvidia-ml or devices.
[ "$1" = "-L" ] || { echo "nvidia-smi test double: only -L is answered" >&2; exit 2; }
[ -e %(library)s ] || { echo "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system."; exit 12; }
found=0
for dev in /dev/nvidia[0-9]*; do
  [ -c "$dev" ] || continue
  index=${dev#/dev/nvidia}
  echo "GPU $index: NVIDIA Lab Test Double (UUID: GPU-k3s-gpu-lab-$index)"
  found=1
done
[ "$found" = 1 ] || { echo "No devices were found"; exit 6; }
"""
LIBNVIDIA_ML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"  # where NVIDIA's CDI spec mounts it on Debian/Ubuntu


def fake_devices(gpus):
    """Character devices 195:<n> in the lab dir and the CDI spec that names them /dev/nvidia<n> (and `all`, as
    nvidia-ctk's spec does). Its common edits mount the driver's user-space as NVIDIA's spec does, with test
    doubles: nvidia-smi (a script, -L only) and libnvidia-ml.so.1 (a file that says what it is)."""
    dev_dir = path("dev")
    os.makedirs(dev_dir)
    devices, nodes = [], []
    for index in range(gpus):
        node = os.path.join(dev_dir, "nvidia%d" % index)
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
        nodes.append({"path": "/dev/nvidia%d" % index, "hostPath": node, "type": "c", "major": NVIDIA_MAJOR, "minor": index})
        devices.append({"name": str(index), "containerEdits": {"deviceNodes": [nodes[-1]]}})
    if nodes:
        devices.append({"name": "all", "containerEdits": {"deviceNodes": nodes}})
    driver = path("driver")
    os.makedirs(driver)
    smi, library = os.path.join(driver, "nvidia-smi"), os.path.join(driver, "libnvidia-ml.so.1")
    with open(smi, "w", encoding="utf-8") as handle:
        handle.write(NVIDIA_SMI_TESTDOUBLE % {"library": LIBNVIDIA_ML})
    os.chmod(smi, 0o755)
    with open(library, "w", encoding="utf-8") as handle:
        handle.write("TEST DOUBLE of libnvidia-ml.so.1 (k3s_gpu.nvidia's cluster lab): not a library\n")
    mounts = [{"hostPath": smi, "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "nosuid", "nodev", "bind"]},
              {"hostPath": library, "containerPath": LIBNVIDIA_ML, "options": ["ro", "nosuid", "nodev", "bind"]}]
    spec = {"cdiVersion": "0.5.0", "kind": CDI_KIND, "devices": devices,
            "containerEdits": {"env": ["K3S_GPU_LAB_CDI=1"], "mounts": mounts}}
    os.makedirs(path("cdi"))
    write_cdi_spec(spec)


def write_cdi_spec(spec):
    """The lab's CDI spec, written whole (containerd's CDI cache watches the dir)."""
    tmp = path("cdi", "." + CDI_SPEC_NAME + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(spec, handle, indent=2)
    os.replace(tmp, path("cdi", CDI_SPEC_NAME))


def start_again(state, name):
    record = state["processes"][name]
    start(state, name, record["argv"], env=record.get("env"))


def restart_containerd(state, edit=None):
    """Stop containerd, let `edit` (text -> text) rewrite its config, start it again as `up` did; kubelet reconnects.
    The pods' shims keep running, as they do when k3s restarts its containerd."""
    stop_process(state, "containerd")
    config_path = path("containerd", "config.toml")
    if edit is not None:
        with open(config_path, encoding="utf-8") as handle:
            text = handle.read()
        with open(config_path, "w", encoding="utf-8") as handle:
            handle.write(edit(text))
    start_again(state, "containerd")
    ctr_version = [state["binaries"]["ctr"], "-a", state["containerd_socket"], "version"]
    wait_for("its socket", lambda: subprocess.run(ctr_version, capture_output=True, check=False).returncode == 0,
             state, "containerd", 30)


# ------------------------------------------------------------------ the device plugin as a pod
# `up` runs the test double as a host process; a case that needs the plugin's pod on the node (the doctor tells a
# plugin that stopped from one whose devices are all unhealthy by its running pod) moves it into a pod and back.
DEVICE_PLUGIN_POD = "nvidia-device-plugin-lab"
DEVICE_PLUGIN_NAMESPACE = "kube-system"
DEVICE_PLUGIN_MOUNT = "/opt/k3s-gpu-testdouble"  # the test double's (static) binary dir, inside the pod


def device_plugin_pod_manifest(state):
    """The test double as NVIDIA's DaemonSet would place it: pinned to the node, tolerating nvidia.com/gpu, kubelet's
    device-plugins dir and the binary's dir as hostPath volumes, in the lab's busybox image (its shell for exec)."""
    binary = state["binaries"]["device_plugin"]
    command = [DEVICE_PLUGIN_MOUNT + "/" + os.path.basename(binary), "--device-plugin-dir", DEVICE_PLUGIN_DIR,
               "--gpus", str(state["gpus"]), "--strategy", state["strategy"]]
    container = {"name": "device-plugin", "image": state["images"]["busybox"], "imagePullPolicy": "Never",
                 "command": command,
                 "volumeMounts": [{"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
                                  {"name": "testdouble", "mountPath": DEVICE_PLUGIN_MOUNT, "readOnly": True}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": DEVICE_PLUGIN_POD, "namespace": DEVICE_PLUGIN_NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "nvidia-device-plugin",
                                    "app.kubernetes.io/managed-by": "k3s-gpu-cluster-lab"}},
            "spec": {"nodeName": NODE_NAME, "restartPolicy": "Always", "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 5,
                     "tolerations": [{"key": CDI_KIND, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [container],
                     "volumes": [{"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"}},
                                 {"name": "testdouble",
                                  "hostPath": {"path": os.path.dirname(binary), "type": "Directory"}}]}}


def device_plugin_pod(state):
    """The plugin's pod as the API server has it, or None."""
    out = kubectl(state, "get", "pod", DEVICE_PLUGIN_POD, "-n", DEVICE_PLUGIN_NAMESPACE, "-o", "json",
                  "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def _pod_running(pod):
    status = (pod or {}).get("status") or {}
    statuses = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(statuses) and all("running" in s.get("state", {}) for s in statuses)


def device_plugin_to_pod(state, timeout=90):
    """Stop the host-process plugin and run the same test double as a pod on the node; returns the Running pod.
    `device_plugin_to_host` undoes it (`down` also removes it: its sandbox through CRI, its socket by name)."""
    stop_process(state, "device-plugin")
    kubectl(state, "apply", "-f", "-", stdin=json.dumps(device_plugin_pod_manifest(state)))
    state["device_plugin_pod"] = "%s/%s" % (DEVICE_PLUGIN_NAMESPACE, DEVICE_PLUGIN_POD)
    write_state(state)
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        pod = device_plugin_pod(state)
        if _pod_running(pod):
            return pod
        time.sleep(0.5)
    logs = kubectl(state, "logs", "-n", DEVICE_PLUGIN_NAMESPACE, DEVICE_PLUGIN_POD, check=False)
    raise LabError("the device plugin's pod %s is not Running in %d s: %s\nlog:\n%s"
                   % (DEVICE_PLUGIN_POD, timeout, json.dumps((pod or {}).get("status"))[:2000], logs[-2000:]))


def signal_device_plugin_pod(state, sig):
    """Send sig to the plugin in its pod (its container's init process), through containerd's task API: SIGUSR1
    marks every device Unhealthy, SIGUSR2 Healthy again."""
    pod = device_plugin_pod(state)
    if not _pod_running(pod):
        raise LabError("the device plugin's pod %s is not running: %s" % (DEVICE_PLUGIN_POD, json.dumps((pod or {}).get("status"))[:2000]))
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    proc = subprocess.run([state["binaries"]["ctr"], "-a", state["containerd_socket"], "-n", "k8s.io", "tasks", "kill",
                           "--signal", signal.Signals(sig).name, container_id],
                          capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise LabError("ctr tasks kill --signal %s %s failed: %s" % (signal.Signals(sig).name, container_id, proc.stderr.strip()))


def device_plugin_to_host(state):
    """Delete the plugin's pod (its plugin removes its socket on SIGTERM) and start the host-process plugin again."""
    kubectl(state, "delete", "pod", DEVICE_PLUGIN_POD, "-n", DEVICE_PLUGIN_NAMESPACE, "--ignore-not-found",
            "--wait=true", "--timeout=60s")
    state.pop("device_plugin_pod", None)
    if not _alive(state["processes"].get("device-plugin")):
        start_again(state, "device-plugin")
    write_state(state)


def kubelet_config(state, minor):
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": PORTS["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": PORTS["kubelet-healthz"],
        "tlsCertFile": path("pki", "kubelet-serving.crt"), "tlsPrivateKeyFile": path("pki", "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": path("pki", "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": "/" + CGROUP_NAME, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False, "failCgroupV1": False,
        "containerRuntimeEndpoint": "unix://" + state["containerd_socket"],
        "imageServiceEndpoint": "unix://" + state["containerd_socket"],
        "podLogsDir": path("pod-logs"),
        "resolvConf": "", "clusterDomain": "cluster.local",
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "registerNode": True, "maxPods": 30,
        "localStorageCapacityIsolation": False,
        "protectKernelDefaults": False, "makeIPTablesUtilChains": False,
        "staticPodPath": "", "syncFrequency": "5s", "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
    }
    if minor == "1.34":
        config["failCgroupV1"] = False
    target = path("kubelet", "config.yaml")
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    return target


def cni_config(node):
    """A point-to-point network (a veth per pod, no bridge, no masquerade) with IPAM state in the lab dir."""
    plugin_dir = node + "/cni/bin"
    for plugin in ("ptp", "host-local", "loopback"):
        source = "/usr/lib/cni/" + plugin
        if not os.path.exists(source):
            raise LabError("%s missing: apt-get install containernetworking-plugins (scripts/cluster-lab.sh does)" % source)
        shutil.copy2(source, os.path.join(plugin_dir, plugin))
    network = {"cniVersion": "1.0.0", "name": "k3s-gpu-lab", "plugins": [{
        "type": "ptp", "ipMasq": False, "mtu": 1400,
        "ipam": {"type": "host-local", "dataDir": path("cni-ipam"), "ranges": [[{"subnet": POD_SUBNET}]]}}]}
    with open(node + "/cni/net.d/10-lab.conflist", "w", encoding="utf-8") as handle:
        json.dump(network, handle)


# ------------------------------------------------------------------ up
def up(minor, release, gpus, strategy, node_root=None,  # pylint: disable=too-many-locals,too-many-statements
       allocation=None):
    """Start the lab. minor: the Kubernetes line (None: the release's own line, else 1.36); release: a k3s or rke2
    release (None: the line's k3s release); allocation: device_plugin (the device plugin test double) or dra (the two
    DRA kubelet plugins)."""
    allocation = allocation or ALLOCATION_DEVICE_PLUGIN
    stale = read_state()
    if stale is not None:
        running = [name for name, record in stale.get("processes", {}).items() if _alive(record)]
        if running and not stale.get("ready") and not _alive(stale.get("owner")):
            running = []  # an `up` that was killed before it finished: its daemons are leftovers, not a lab
        if running:
            raise LabError("a cluster lab already runs in %s (%s); `scripts/cluster-lab.sh down` first"
                           % (LAB_DIR, ", ".join(running)))
        log("cluster lab: cleaning what a stopped or killed run left in %s" % LAB_DIR)
        problems = down(quiet=True)
        if problems:
            raise LabError("the previous lab could not be cleaned: %s" % "; ".join(problems))
    elif marked_pids() or _cgroup_dirs():
        log("cluster lab: cleaning processes/cgroups a killed run left (no state file)")
        down(quiet=True)
    check_free()
    started = time.monotonic()
    distribution = distribution_of(release) if release else distro.K3S
    if minor is None:
        release_line = ".".join(release.lstrip("v").split(".")[:2]) if release else None
        minor = release_line if release_line in KUBERNETES else DEFAULT_KUBERNETES
    build_key, default_releases = KUBERNETES[minor]
    release = release or default_releases[distribution]
    if node_root:
        check_node_root(node_root, distribution)
    profile = distro.profile(distribution, release)
    line_key = {"2.2": "containerd-2.2", "2.3": "containerd-2.3"}.get(profile["containerd"])
    if line_key is None:
        raise LabError("--release %s embeds containerd %s; the lab runs the 2.2 and 2.3 lines (k3s/rke2 1.33.10+)"
                       % (release, profile["containerd"]))
    keys = (build_key, "kine", line_key, "nvidia-container-toolkit", "device-plugin-testdouble")
    if allocation == k8s_labels.ALLOCATION_DRA:
        keys += ("dra-plugin-testdouble", "dra-test-driver-" + build_key.rsplit("-", 1)[-1], "helm-render")
        chart = dra_chart()  # before anything starts: missing shared material fails here
    for key in keys:
        testbins.ensure(key, log=log)
    binaries = {name: testbins.path_of(build_key, name)
                for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")}
    binaries.update(kine=testbins.path_of("kine", "kine"), containerd=testbins.path_of(line_key, "containerd"),
                    ctr=testbins.path_of(line_key, "ctr"),
                    device_plugin=testbins.path_of("device-plugin-testdouble", "device-plugin-testdouble"))
    toolkit_bin = os.path.dirname(testbins.path_of("nvidia-container-toolkit", "nvidia-ctk"))

    os.makedirs(LAB_DIR, mode=0o700)
    for sub in ("logs", "containerd", "nvidia", "kine", "kubelet", "pod-logs", "opt"):
        os.makedirs(path(sub))
    state = {"lab_dir": LAB_DIR, "kubernetes": minor, "release": release, "distribution": distribution, "gpus": gpus,
             "strategy": strategy, "allocation": allocation,
             "node_root": node_root,
             "binaries": binaries, "processes": {}, "containerd_line": line_key,
             "containerd_socket": path("containerd", "c.sock"),
             "owner": {"pid": os.getpid(), "start": _proc_start(os.getpid())}, "ready": False,
             "before": {"run_entries": _run_entries(), "run_dirs": [d for d in RUN_DIRS if os.path.isdir(d)],
                        "kubelet_dirs": [d for d in (os.path.dirname(DEVICE_PLUGIN_DIR), DEVICE_PLUGIN_DIR)
                                         if os.path.isdir(d)]}}
    write_state(state)
    subprocess.run(["ip", "addr", "add", NODE_IP + "/32", "dev", "lo"], capture_output=True, check=True)
    state["node_ip_added"] = True
    write_state(state)
    for controller in os.listdir(CGROUP_ROOT):
        base = os.path.join(CGROUP_ROOT, controller)
        if os.path.isdir(base) and os.path.ismount(base):
            os.makedirs(os.path.join(base, CGROUP_NAME), exist_ok=True)

    # the node: the collection's module on a sandbox root, composed as k3s (rke2) composes it
    loaded = sandbox_node(state, release, toolkit_bin, node_root)
    cni_config(state["node"]["root"])
    config_path = containerd_config(state, loaded)
    runtime_config = nvidia_runtime_config(toolkit_bin)
    fake_devices(gpus)
    write_state(state)

    # containerd, with the line's shim first on PATH; the NVIDIA runtime reads the lab's config
    shim_dir = os.path.dirname(binaries["containerd"])
    start(state, "containerd", [binaries["containerd"], "--config", config_path, "--root", path("containerd", "root"),
                                "--state", path("containerd", "state"), "--address", state["containerd_socket"]],
          env={"PATH": shim_dir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "NVIDIA_CTK_CONFIG_FILE_PATH": runtime_config})
    ctr_version = [binaries["ctr"], "-a", state["containerd_socket"], "version"]
    wait_for("its socket", lambda: subprocess.run(ctr_version, capture_output=True, check=False).returncode == 0,
             state, "containerd", 30)
    images = lab.build_images(path("images"))
    for kind in ("busybox", "pause"):
        subprocess.run([binaries["ctr"], "-a", state["containerd_socket"], "-n", "k8s.io", "images", "import",
                        images[kind]], capture_output=True, check=True, timeout=60)
    state["images"] = images["names"]

    # datastore and control plane
    start(state, "kine", [binaries["kine"], "--listen-address", "127.0.0.1:%d" % PORTS["kine"],
                          "--endpoint", "sqlite://%s?_journal=WAL&cache=shared" % path("kine", "state.db")])
    wait_for("port %d" % PORTS["kine"], lambda: port_taken(PORTS["kine"]), state, "kine", 30)
    pki = path("pki")
    make_certificates()
    start(state, "kube-apiserver", [
        binaries["kube-apiserver"], "--etcd-servers=http://127.0.0.1:%d" % PORTS["kine"],
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=%d" % PORTS["kube-apiserver"],
        "--tls-cert-file=%s/apiserver.crt" % pki, "--tls-private-key-file=%s/apiserver.key" % pki,
        "--client-ca-file=%s/ca.crt" % pki, "--service-cluster-ip-range=" + SERVICE_CIDR,
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file=%s/sa.pub" % pki, "--service-account-signing-key-file=%s/sa.key" % pki,
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
        "--kubelet-client-certificate=%s/apiserver-kubelet-client.crt" % pki,
        "--kubelet-client-key=%s/apiserver-kubelet-client.key" % pki,
        "--kubelet-certificate-authority=%s/ca.crt" % pki,
        "--kubelet-preferred-address-types=InternalIP,Hostname", "--profiling=false",
        "--cert-dir=%s/apiserver-certs" % pki, "--storage-backend=etcd3", "--watch-cache=false",
    ])
    wait_for("/readyz", lambda: _https_ok("https://127.0.0.1:%d/readyz" % PORTS["kube-apiserver"], path("pki", "ca.crt")),
             state, "kube-apiserver")
    start(state, "kube-controller-manager", [
        binaries["kube-controller-manager"], "--kubeconfig=" + path("kube-controller-manager.kubeconfig"),
        "--bind-address=127.0.0.1", "--secure-port=%d" % PORTS["kube-controller-manager"], "--leader-elect=false",
        "--service-account-private-key-file=%s/sa.key" % pki, "--root-ca-file=%s/ca.crt" % pki,
        "--use-service-account-credentials=true", "--cluster-cidr=10.42.0.0/16", "--allocate-node-cidrs=true",
        "--node-cidr-mask-size=24", "--service-cluster-ip-range=" + SERVICE_CIDR,
        "--cert-dir=%s/kcm-certs" % pki,
    ])
    start(state, "kube-scheduler", [
        binaries["kube-scheduler"], "--kubeconfig=" + path("kube-scheduler.kubeconfig"), "--bind-address=127.0.0.1",
        "--secure-port=%d" % PORTS["kube-scheduler"], "--leader-elect=false", "--cert-dir=%s/scheduler-certs" % pki,
    ])

    # kubelet, with the labels the collection wrote for k3s/rke2 to pass (they pass node-label as --node-labels)
    kubelet_cfg = kubelet_config(state, minor)
    labels = state["node"]["labels"]
    start(state, "kubelet", [
        binaries["kubelet"], "--config=" + kubelet_cfg, "--kubeconfig=" + path("kubelet.kubeconfig"),
        "--root-dir=" + path("kubelet", "root"), "--hostname-override=" + NODE_NAME, "--node-ip=" + NODE_IP,
        "--cert-dir=" + path("kubelet", "pki"), "--node-labels=" + ",".join(labels), "--v=2",
    ])
    if allocation == k8s_labels.ALLOCATION_DRA:
        start_dra(state, build_key, chart)
    else:
        socket_path = os.path.join(DEVICE_PLUGIN_DIR, "kubelet.sock")
        wait_for("its device plugin socket", lambda: os.path.exists(socket_path), state, "kubelet")
        start(state, "device-plugin", [binaries["device_plugin"], "--device-plugin-dir", os.path.dirname(socket_path),
                                       "--gpus", str(gpus), "--strategy", strategy])
        wait_for("node %s Ready with %d nvidia.com/gpu" % (NODE_NAME, gpus), lambda: node_ready(state, gpus), state,
                 "kubelet")
    wait_for("the default ServiceAccount (pods can be created)",
             lambda: subprocess.run([binaries["kubectl"], "--kubeconfig", path("kubeconfig"), "get", "serviceaccount",
                                     "default", "-n", "default"], capture_output=True, check=False).returncode == 0,
             state, "kube-controller-manager")
    shipped = release_runtimeclasses(state)
    state["shipped_runtimeclasses"] = shipped
    write_inventory(state)
    if not node_root:  # a node brought by the caller comes with the caller's own runtimeclasses run
        run_playbook("runtimeclasses")
    state["runtimeclasses"] = sorted(item["metadata"]["name"] for item in json.loads(
        kubectl(state, "get", "runtimeclass", "-o", "json"))["items"])
    state["up_seconds"] = round(time.monotonic() - started, 1)
    state["ready"] = True
    write_state(state)
    log("cluster lab: Kubernetes %s (%s node), containerd %s, node %s with %d fake GPU(s), %s, up in %.1f s"
        % (testbins.BUILDS[build_key].version, release, testbins.BUILDS[line_key].version, NODE_NAME, gpus,
           "strategy " + strategy if allocation != k8s_labels.ALLOCATION_DRA else
           "allocated through DRA (drivers %s)" % ", ".join(DRA_DRIVERS), state["up_seconds"]))
    log("  containerd config as %s composes it: %s (the node's %s)"
        % (distribution, path("node") + state["node"]["config"], state["node"]["config"]))
    log("  lab-only containerd keys: %s" % "; ".join(state["containerd_overrides"]))
    log("  RuntimeClasses as the release ships them (%s): %s"
        % (distro.RUNTIMECLASS_SOURCES[distribution]["mechanism"], ", ".join(shipped) or "none"))
    log("  RuntimeClasses %s: %s (inventory %s)"
        % ("now (the node came from --node-root %s; k3s_gpu.nvidia.runtimeclasses is yours to run)" % node_root if node_root
           else "after k3s_gpu.nvidia.runtimeclasses", ", ".join(state["runtimeclasses"]), path("inventory.yml")))
    log("BUSYBOX_IMAGE=%s" % state["images"]["busybox"])
    log("KUBECONFIG=%s" % path("kubeconfig"))
    return state


# --- DRA (--allocation dra) ------------------------------------------------------------------------------------
ALLOCATION_DEVICE_PLUGIN = k8s_labels.ALLOCATION_DEVICE_PLUGIN
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
TEST_DRA_DRIVER = "test-driver.cdi.k8s.io"  # Kubernetes' own test driver's default name
DRA_DRIVERS = (NVIDIA_DRA_DRIVER, TEST_DRA_DRIVER)
DRA_CHART = ("charts/dra-driver-nvidia-gpu-0.4.1.tgz", "8fb5490333c596aac17eac21dad68111eb9b8433cc648a256fcb6043d2f53155")
TEST_DRIVER_DEVICES = 2


def dra_chart():
    """NVIDIA's DRA driver chart from the shared material ($K3S_GPU_SHARED, else <repo>/../shared), checked by sha256."""
    shared = os.environ.get("K3S_GPU_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
    chart = os.path.join(shared, DRA_CHART[0])
    if not os.path.isfile(chart):
        raise LabError("--allocation dra needs NVIDIA's DRA driver chart: %s not found (set K3S_GPU_SHARED to the "
                       "directory holding %s)" % (chart, DRA_CHART[0]))
    with open(chart, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    if digest != DRA_CHART[1]:
        raise LabError("%s: sha256 %s, expected %s" % (chart, digest, DRA_CHART[1]))
    return chart


def dra_device_classes(state, chart):
    """The DeviceClasses the cluster gets: NVIDIA's, rendered by NVIDIA's chart (helm-render) from the values of the
    HelmChart the collection writes for this release and this node, and the test driver's."""
    plan = dra_driver.plan_cluster(NodeFacts.from_reading(server_reading(state["distribution"], state["release"])), {},
                                   [{"host": NODE_NAME, "kubelet_root_dir": path("kubelet", "root")}])
    values = path("dra-values.yaml")
    with open(values, "w", encoding="utf-8") as handle:
        handle.write(plan["objects"][0]["spec"]["valuesContent"])
    proc = subprocess.run([testbins.path_of("helm-render", "helm-render"), dra_driver.HELMCHART_NAME, chart, "-n",
                           dra_driver.DEFAULT_NAMESPACE, "-f", values, "--kube-version", state["release"].split("+")[0]],
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise LabError("NVIDIA's DRA chart did not render the collection's values: %s" % proc.stderr.strip())
    classes = [doc for doc in yaml.safe_load_all(proc.stdout) if doc and doc.get("kind") == "DeviceClass"]
    classes.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": TEST_DRA_DRIVER},
                    "spec": {"selectors": [{"cel": {"expression": "device.driver == '%s'" % TEST_DRA_DRIVER}}]}})
    return classes


def start_dra(state, build_key, chart):
    """The node's DRA kubelet plugins, as plain processes against the lab's registration and CDI dirs (kubelet's plugin
    watcher follows its --root-dir), then the DeviceClasses, then wait for Ready and both drivers' ResourceSlices."""
    registry = path("kubelet", "root", "plugins_registry")
    wait_for("its plugin registration dir", lambda: os.path.isdir(registry), state, "kubelet")
    gpus = state["gpus"]
    start_dra_testdouble(state)
    # the test driver serves <datadir>/<driver>/dra.sock and does not make that dir itself
    os.makedirs(path("kubelet", "root", "plugins", TEST_DRA_DRIVER), exist_ok=True)
    start(state, "dra-test-driver", [
        testbins.path_of("dra-test-driver-" + build_key.rsplit("-", 1)[-1], "test-driver"),
        "--kubeconfig", path("kubeconfig"), "--drivername", TEST_DRA_DRIVER, "kubelet-plugin",
        "--node-name", NODE_NAME, "--num-devices", str(TEST_DRIVER_DEVICES), "--cdi-dir", path("cdi"),
        "--datadir", path("kubelet", "root", "plugins"), "--plugin-registration-path", registry])
    classes = dra_device_classes(state, chart)
    kubectl(state, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
    state["device_classes"] = sorted(c["metadata"]["name"] for c in classes)
    time.sleep(2)  # a plugin that cannot serve exits at once: say which, with its log, instead of a timeout
    for name in ("dra-plugin-testdouble", "dra-test-driver"):
        wait_for("its DRA service", lambda: True, state, name, 5)
    wait_for("node %s Ready with ResourceSlices of %s" % (NODE_NAME, " and ".join(DRA_DRIVERS)),
             lambda: node_ready(state, 0, gpu_resource=False) and dra_devices(state) == {
                 NVIDIA_DRA_DRIVER: gpus, TEST_DRA_DRIVER: TEST_DRIVER_DEVICES}, state, "kubelet")


def start_dra_testdouble(state):
    """Our DRA test double of NVIDIA's driver, registered below the lab kubelet's root dir (also to bring it back)."""
    start(state, "dra-plugin-testdouble", [
        testbins.path_of("dra-plugin-testdouble", "dra-plugin-testdouble"), "--kubeconfig", path("kubeconfig"),
        "--node-name", NODE_NAME, "--num-devices", str(state["gpus"]), "--cdi-dir", path("cdi"),
        "--device-node-dir", path("dev"), "--plugin-registration-path", path("kubelet", "root", "plugins_registry"),
        "--plugin-data-dir", path("kubelet", "root", "plugins", NVIDIA_DRA_DRIVER),
        "--mount", "%s:/usr/bin/nvidia-smi" % path("driver", "nvidia-smi"),
        "--mount", "%s:%s" % (path("driver", "libnvidia-ml.so.1"), LIBNVIDIA_ML)])
    write_state(state)


def stop_process(state, name):
    """SIGTERM one of the lab's processes and wait until it is gone (a test's broken layer); `start_again` brings a
    daemon back as `up` started it."""
    record = state["processes"][name]
    with contextlib.suppress(ProcessLookupError):
        os.kill(record["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(record):
        with contextlib.suppress(ChildProcessError):  # started by this process: reap it, or it stays a zombie
            os.waitpid(record["pid"], os.WNOHANG)
        time.sleep(0.2)
    if _alive(record):
        raise LabError("%s (pid %d) did not stop on SIGTERM" % (name, record["pid"]))


def start_device_plugin_beside_dra(state):
    """The device plugin test double on a DRA node (what gpu_node_allocation keeps apart): the dra-conflict layer."""
    socket_path = os.path.join(DEVICE_PLUGIN_DIR, "kubelet.sock")
    start(state, "device-plugin", [state["binaries"]["device_plugin"], "--device-plugin-dir", os.path.dirname(socket_path),
                                   "--gpus", str(state["gpus"]), "--strategy", state["strategy"] or "envvar"])
    write_state(state)


def dra_devices(state):
    """{driver: devices} of the lab node's ResourceSlices."""
    found = {}
    for item in json.loads(kubectl(state, "get", "resourceslices.resource.k8s.io", "-o", "json"))["items"]:
        spec = item["spec"]
        if spec.get("nodeName") == NODE_NAME:
            found[spec["driver"]] = found.get(spec["driver"], 0) + len(spec.get("devices") or [])
    return found


def node_ready(state, gpus, gpu_resource=True):
    node = json.loads(kubectl(state, "get", "node", NODE_NAME, "-o", "json"))
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    return ready and (not gpu_resource or node["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(gpus))


def release_runtimeclasses(state):
    """The RuntimeClasses the release ships, applied as it would: k3s's runtimes.yaml as its deploy controller applies
    it (plain objects), rke2's chart rke2-runtimeclasses as helm-controller installs it (objects that Helm's release
    owns: the managed-by label and release annotations Helm writes on every object it creates)."""
    names = distro.profile(state["distribution"], state["release"])["runtimeclasses"]
    if not names:
        return []
    metadata = {}
    if state["distribution"] == distro.RKE2:
        metadata = {"labels": {"app.kubernetes.io/managed-by": "Helm"},
                    "annotations": {"meta.helm.sh/release-name": RKE2_RUNTIMECLASS_CHART,
                                    "meta.helm.sh/release-namespace": "kube-system"}}
    docs = [{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": dict(metadata, name=name), "handler": name}
            for name in names]
    kubectl(state, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return names


def status(log_lines=0):
    """What runs; with log_lines, also each process's last log lines and the cluster's events (what a failed test
    prints before `down` removes the logs)."""
    state = read_state()
    if state is None:
        log("cluster lab: not running (%s absent)" % LAB_DIR)
        return 1
    rc = 0
    for name, record in sorted(state["processes"].items()):
        alive = _alive(record)
        if name == "device-plugin" and not alive and state.get("device_plugin_pod"):
            log("%-24s %-8s pod %s (device_plugin_to_pod)" % (name, "in a pod", state["device_plugin_pod"]))
            continue
        rc |= 0 if alive else 1
        log("%-24s %-8s pid %d  log %s" % (name, "running" if alive else "STOPPED", record["pid"], record["log"]))
        if log_lines:
            log(tail(record["log"], log_lines).rstrip("\n"))
    if log_lines and state.get("ready"):
        proc = subprocess.run([state["binaries"]["kubectl"], "--kubeconfig", path("kubeconfig"), "get", "events", "-A",
                               "--sort-by=.lastTimestamp"], capture_output=True, text=True, timeout=60, check=False)
        lines = (proc.stdout or proc.stderr).splitlines()
        log("events:\n%s" % "\n".join(lines[:1] + lines[1:][-log_lines:]))  # the header, then the last ones
    log("KUBECONFIG=%s" % path("kubeconfig"))
    return rc


def main(argv=None):
    parser = argparse.ArgumentParser(prog="cluster-lab.sh", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="start the lab")
    up_parser.add_argument("--kubernetes", choices=sorted(KUBERNETES), default=None,
                           help="the Kubernetes line (default: the release's line, else %s)" % DEFAULT_KUBERNETES)
    up_parser.add_argument("--release", help="k3s or rke2 release whose node the lab runs: its paths, containerd config "
                                             "and RuntimeClasses (default: the Kubernetes line's k3s release, %s; rke2: "
                                             "%s)" % (", ".join(r["k3s"] for _k, r in KUBERNETES.values()),
                                                      ", ".join(r["rke2"] for _k, r in KUBERNETES.values())))
    up_parser.add_argument("--gpus", type=int, default=1)
    up_parser.add_argument("--strategy", choices=("envvar", "cdi-cri"), default="envvar")
    up_parser.add_argument("--allocation", choices=k8s_labels.ALLOCATIONS, default=ALLOCATION_DEVICE_PLUGIN,
                           help="device_plugin: the device plugin test double; dra: a DRA node served by Kubernetes' "
                                "DRA test driver and our DRA test double of NVIDIA's driver")
    up_parser.add_argument("--node-root", help="a k3s (or, with an rke2 --release, rke2) node tree the gpu_node role converged (NVIDIA's binaries in its "
                                               "usr/bin): containerd's config is composed from a copy of it instead of "
                                               "the lab running the collection's module, and only the release's own "
                                               "RuntimeClasses are applied")
    sub.add_parser("down", help="stop it and remove everything it made")
    status_parser = sub.add_parser("status", help="what runs")
    status_parser.add_argument("--logs", type=int, default=0, metavar="N",
                               help="also each process's last N log lines and the last N events")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("cluster-lab: needs root (kubelet, containerd, mknod, cgroups)")
    try:
        if args.command == "up":
            if not 0 <= args.gpus <= 8:
                raise LabError("--gpus must be between 0 and 8")
            try:
                if args.node_root and not os.path.isdir(args.node_root):
                    raise LabError("--node-root %s is not a directory" % args.node_root)
                up(args.kubernetes, args.release, args.gpus, args.strategy,
                   os.path.abspath(args.node_root) if args.node_root else None, args.allocation)
            except BaseException:
                log("cluster lab: start failed; stopping what was started")
                if read_state() is not None and not os.environ.get("K3S_GPU_CLUSTER_LAB_KEEP"):
                    down(quiet=True)
                raise
            return 0
        if args.command == "down":
            return 1 if down() else 0
        return status(args.logs)
    except (LabError, testbins.BuildError) as exc:
        print("cluster-lab: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
