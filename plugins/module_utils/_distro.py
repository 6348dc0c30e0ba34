# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s / rke2 / plain containerd flavours: versions, paths and the one feature table.

PRIVATE to the collection. Stdlib only: this file runs on every node (Python 3.8+).

Every version rule of the collection lives in FEATURES below, as data. The facts and their
sources (k3s PR and commit numbers) are recorded in docs/release-facts.md.

Only what a node needs is here: what _detect, _plan and the modules that run on a node read. What only the
controller needs (NVIDIA's charts and packages, the helm-controller versions, the containerd template's data)
is in plugins/plugin_utils/_release_rules.py, which reads this file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import line_key

K3S = "k3s"
RKE2 = "rke2"
CONTAINERD = "containerd"
DISTRIBUTIONS = (K3S, RKE2, CONTAINERD)

# Release lines this collection knows, oldest first. A line outside is refused, not guessed; a line
# NEWER than the last one may be taken as the newest known line when the user opts in
# (newer_release=assume_newest_known, see NEWER_RELEASE_POLICIES), with a warning.
KNOWN_LINES = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
KNOWN_CONTAINERD_LINES = ("1.6", "1.7", "2.0", "2.1", "2.2", "2.3")

# What to do with a release of a line newer than KNOWN_LINES / KNOWN_CONTAINERD_LINES (the modules'
# newer_release option, the role's gpu_node_newer_release): refuse it (default), or read it as the
# newest release of the newest known line and warn.
NEWER_RELEASE_REFUSE = "refuse"
NEWER_RELEASE_ASSUME = "assume_newest_known"
NEWER_RELEASE_POLICIES = (NEWER_RELEASE_REFUSE, NEWER_RELEASE_ASSUME)

ALL = "all"  # the feature is in every release of that line
NEVER = None  # the feature is in no release of that line

# feature -> {"*": default per line, "<line>": first release on that line, ...};
# a "rke2" key overrides per line for rke2 (rke2 links k3s's agent code; its rows come from
# the k3s commit pinned in each rke2 tag's go.mod). Sources: docs/release-facts.md.
FEATURES = {
    # `{{ template "base" . }}` available in config.toml.tmpl (k3s #7991)
    "base_template": {"*": ALL, "1.28": "v1.28.1"},
    # SystemdCgroup written into the extra runtime blocks (k3s #8470)
    "extra_runtime_systemd_cgroup": {"*": ALL, "1.28": "v1.28.3"},
    # wasm shim detection (#8751), crun detection + --default-runtime + RuntimeClass manifest (#8936)
    "wasm_shims": {"*": ALL, "1.28": "v1.28.4"},
    "crun": {"*": ALL, "1.28": "v1.28.5"},
    "default_runtime": {"*": ALL, "1.28": "v1.28.5"},
    # crun also searched in /usr/local/{bin,sbin} (#9086) during the stat era
    "crun_local_dirs": {"*": ALL, "1.28": "v1.28.6", "1.29": "v1.29.1"},
    # exec.LookPath over a fixed PATH instead of fs.Stat per dir (#9311, #9431)
    "lookpath": {"*": ALL, "1.28": "v1.28.7", "1.29": "v1.29.2"},
    # wasm rows as K3S_RUNTIMES has them (#9519): io.containerd.<name>.v1 types, spin's -v2 binary;
    # before it every shim was `containerd-shim-<name>-v1` with type io.containerd.<name>.v2
    # (k3s pkg/agent/containerd/runtimes_test.go before and after the PR)
    "wasm_v1_types": {"*": ALL, "1.28": "v1.28.8", "1.29": "v1.29.3"},
    # the service's own $PATH appended to the search (#10953 and backports)
    "service_path": {
        "*": ALL, "1.28": "v1.28.15", "1.29": "v1.29.10", "1.30": "v1.30.6", "1.31": "v1.31.2",
        "rke2": {"1.31": "v1.31.1+rke2r2"},
    },
    # nvidia-cdi runtime (#11065 and backports)
    "nvidia_cdi": {
        "*": ALL, "1.28": "v1.28.15", "1.29": "v1.29.10", "1.30": "v1.30.6", "1.31": "v1.31.2",
        "rke2": {"1.31": "v1.31.1+rke2r2"},
    },
    # --nonroot-devices (#11200)
    "nonroot_devices": {"*": ALL, "1.28": NEVER, "1.29": "v1.29.11", "1.30": "v1.30.7", "1.31": "v1.31.3"},
    # containerd 2.x, config-v3.toml.tmpl, `version = 3` (#11626)
    "containerd_2_0": {"*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": "v1.31.6", "1.32": "v1.32.2"},
    "containerd_2_1": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER,
        "1.31": "v1.31.13", "1.32": "v1.32.9", "1.33": "v1.33.5", "1.34": "v1.34.1",
    },
    "containerd_2_2": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER, "1.32": NEVER,
        "1.33": "v1.33.10", "1.34": "v1.34.6", "1.35": "v1.35.3",
    },
    # containerd 2.3 (config `version = 4` readable): k3s v1.36.0/v1.36.1 embed 2.2.3, v1.36.2 bumps to
    # 2.3.2 (#14254); rke2 v1.36.0/v1.36.1 2.2.3, v1.36.2 2.3.2 (go.mod at 5c95ec95); all of 1.37 2.3.4+
    "containerd_2_3": {"*": NEVER, "1.36": "v1.36.2", "1.37": ALL},
    # base templates `imports` config-v3.toml.d/*.toml (and config.toml.d) (#13680); 1.32 unknown,
    # so treated as absent (the template path works there too). 1.37: every release (no 1.37 note
    # removes it; inferred, the 1.37 source could not be read).
    "dropin_imports": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER, "1.32": NEVER,
        "1.33": "v1.33.10", "1.34": "v1.34.6", "1.35": "v1.35.3",
    },
    # --- fields and functions of the containerd template's data (TEMPLATE_FIELDS; docs/template-data.md)
    # flannel settings moved from .NodeConfig.NoFlannel, .FlannelBackend, ... into .NodeConfig.Flannel.*
    # (k3s efcf8eb7a, d582a0da8, Dec 2025; backports b9f1cc217, 3885b2e72; 1.33 from the facts, inferred):
    # a template that reads .NodeConfig.NoFlannel stops rendering (`can't evaluate field NoFlannel`)
    "template_flannel_moved": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER,
        "1.32": "v1.32.11", "1.33": "v1.33.7", "1.34": "v1.34.3",
    },
    # .NodeConfig.AgentConfig.PrivateRegistry (a path) became .AgentConfig.Registry (wharfie), with
    # .NoDefaultEndpoint and .NodeConfig.EmbeddedRegistry; deschemify on Linux from the same releases
    "template_registry_v2": {"*": ALL, "1.28": "v1.28.6", "1.29": "v1.29.1"},
    "template_func_deschemify": {"*": ALL, "1.28": "v1.28.6", "1.29": "v1.29.1"},
    # toJson in the FuncMap with the unified template (containerd 2 releases)
    "template_func_tojson": {"*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": "v1.31.6", "1.32": "v1.32.2"},
    # filepathjoin: the March-2026 releases (1.32 only in an rke2 pin, so treated as absent there)
    "template_func_filepathjoin": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER, "1.32": NEVER,
        "1.33": "v1.33.10", "1.34": "v1.34.6", "1.35": "v1.35.3",
    },
    # .NodeConfig.Certificate removed (4946ae4a7, Jan 2025)
    "template_certificate_removed": {"*": ALL, "1.28": NEVER, "1.29": "v1.29.13", "1.30": "v1.30.9", "1.31": "v1.31.5",
                                     "1.32": "v1.32.1"},
    # .NodeConfig.MultiClusterCIDR removed with 1.29
    "template_multicluster_cidr_removed": {"*": ALL, "1.28": NEVER},
    "template_image_service_endpoint": {"*": ALL, "1.28": "v1.28.3"},
    "template_blockio_rdt": {"*": ALL, "1.28": "v1.28.4"},
    # .AgentConfig.LogFile, VLevel, VModule, AlsoLogToStderr: 1.29 on (absent from the late 1.28 pins)
    "template_agent_log_fields": {"*": ALL, "1.28": NEVER},
    # .AgentConfig.CipherSuites, MinTLSVersion, .NodeConfig.EnablePProf, SupervisorMetrics, SupervisorPort
    "template_tls_pprof_fields": {"*": ALL, "1.28": NEVER, "1.29": "v1.29.6", "1.30": "v1.30.2"},
    # .AgentConfig.NodeExternalDNSs, NodeInternalDNSs
    "template_node_dns_fields": {"*": ALL, "1.28": NEVER, "1.29": "v1.29.13", "1.30": "v1.30.9", "1.31": "v1.31.1"},
    "template_kubelet_config_dir": {"*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": "v1.31.6"},
    "template_cridockerd_debug": {
        "*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER,
        "1.31": "v1.31.13", "1.32": "v1.32.9", "1.33": "v1.33.5", "1.34": "v1.34.1",
    },
    # --- Dynamic Resource Allocation (docs/dra.md; ../shared/reference/dra-and-field-2026-12.md A1, A2)
    # resource.k8s.io/v1 served and DRA on with no flag from Kubernetes 1.34 (GA); NVIDIA's DRA driver asks for
    # 1.34.2+ (its prerequisites.md). k3s/rke2 pass no feature gate to the control plane, so upstream's defaults hold.
    "dra": {"*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER, "1.32": NEVER, "1.33": NEVER,
            "1.34": "v1.34.2"},
    # DRAExtendedResource (KEP-5004) beta and on by default from 1.36: a pod asking nvidia.com/gpu is served by a DRA
    # driver whose DeviceClass names that resource (alpha, off, in 1.34 and 1.35: pkg/features/kube_features.go)
    "dra_extended_resource": {"*": ALL, "1.28": NEVER, "1.29": NEVER, "1.30": NEVER, "1.31": NEVER, "1.32": NEVER,
                              "1.33": NEVER, "1.34": NEVER, "1.35": NEVER},
    # RuntimeClass objects shipped by the distribution: k3s manifests/runtimes.yaml (#8936);
    # rke2 chart rke2-runtimeclasses (rancher/rke2 #7382)
    "runtimeclasses": {
        "*": ALL, "1.28": "v1.28.5",
        "rke2": {"1.28": NEVER, "1.29": "v1.29.13", "1.30": "v1.30.9", "1.31": "v1.31.5", "1.32": "v1.32.1"},
    },
}

# Releases known to break with a feature this collection relies on: (distribution, release, why).
KNOWN_BAD_RELEASES = (
    (K3S, "v1.28.3+k3s1", "its template fails to render when an NVIDIA runtime is detected "
     "(k3s #8761), so k3s does not start; v1.28.3+k3s2 fixed it"),
)

# Plain containerd, by containerd line.
CONTAINERD_FEATURES = {
    # CRI CDI support (enable_cdi) exists from 1.7; default on from 2.0 (containerd #9621)
    "cdi": {"1.6": False, "*": True},
    "cdi_default_on": {"1.6": False, "1.7": False, "*": True},
    # imported files merge plugin tables deeply only from 2.1; before, a plugin table in a
    # drop-in replaces the whole table of the main file
    "dropin_deep_merge": {"1.6": False, "1.7": False, "2.0": False, "*": True},
    # the highest config `version` the line reads: 2 from 1.3, 3 from 2.0, 4 from 2.3 (containerd
    # RELEASES.md @v2.3.4; ConfigVersion 4 in #12562). 2.0-2.2 refuse 4 ("expected containerd config
    # version equal to or less than `3`, got `4`", checked with 2.2.7)
    "config_version_max": {"1.6": 2, "1.7": 2, "2.0": 3, "2.1": 3, "2.2": 3, "*": 4},
    # (2.3 also refuses to start when a drop-in declares a higher `version` than the root config,
    # "drop-in config version N higher than root config version M", #12891, checked with 2.3.4: the
    # plan gives a plain-containerd drop-in the root config's version, on every line.)
}

# --- runtimes k3s detects --------------------------------------------------------------------

RUNC_V2 = "io.containerd.runc.v2"

# name -> (binary looked up, runtime_type, feature that gates it, group)
K3S_RUNTIMES = (
    ("crun", "crun", RUNC_V2, "crun", "crun"),
    ("nvidia", "nvidia-container-runtime", RUNC_V2, None, "nvidia"),
    ("nvidia-experimental", "nvidia-container-runtime-experimental", RUNC_V2, None, "nvidia"),
    ("nvidia-cdi", "nvidia-container-runtime.cdi", RUNC_V2, "nvidia_cdi", "nvidia"),
    ("lunatic", "containerd-shim-lunatic-v1", "io.containerd.lunatic.v1", "wasm_shims", "wasm"),
    ("slight", "containerd-shim-slight-v1", "io.containerd.slight.v1", "wasm_shims", "wasm"),
    ("spin", "containerd-shim-spin-v2", "io.containerd.spin.v2", "wasm_shims", "wasm"),
    ("wws", "containerd-shim-wws-v1", "io.containerd.wws.v1", "wasm_shims", "wasm"),
    ("wasmedge", "containerd-shim-wasmedge-v1", "io.containerd.wasmedge.v1", "wasm_shims", "wasm"),
    ("wasmer", "containerd-shim-wasmer-v1", "io.containerd.wasmer.v1", "wasm_shims", "wasm"),
    ("wasmtime", "containerd-shim-wasmtime-v1", "io.containerd.wasmtime.v1", "wasm_shims", "wasm"),
)

# The NVIDIA runtimes this collection manages: name -> binary. k3s ignores `.legacy`.
NVIDIA_RUNTIMES = (
    ("nvidia", "nvidia-container-runtime"),
    ("nvidia-cdi", "nvidia-container-runtime.cdi"),
    ("nvidia-legacy", "nvidia-container-runtime.legacy"),
    ("nvidia-experimental", "nvidia-container-runtime-experimental"),
)

GPU_OPERATOR_TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
# The udev rule that makes the /dev/char links of NVIDIA's device nodes again whenever the driver binds (NVIDIA toolkit
# #1227, nvidia-docker #1671)
DEV_CHAR_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
# The gpu_node role's drop-in of the k3s/rke2 unit (%s: the unit) that makes the NVIDIA device nodes before it starts
DEVICE_NODES_DROPIN = "/etc/systemd/system/%s.service.d/50-k3s-gpu-nvidia-device-nodes.conf"
# The toolkit's units (1.18 and newer) that generate the CDI spec again at every driver or toolkit change
CDI_REFRESH_UNIT = "nvidia-cdi-refresh.path"
# Who owns a runtime binary: the GPU Operator (its toolkit dir) or the host (packages, a custom dir).
OWNER_GPU_OPERATOR = "gpu-operator"
OWNER_HOST = "host"
KWASM_DIR = "/opt/kwasm/bin"

# Stat era (before the LookPath refactor): fixed directories per runtime group, first match wins.
STAT_ERA_DIRS = {
    "nvidia": (GPU_OPERATOR_TOOLKIT_DIR, "/usr/bin"),
    "crun": ("/usr/sbin", "/usr/bin"),
    "crun_local": ("/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"),
    "wasm": (KWASM_DIR, "/usr/bin", "/usr/sbin"),
}
# LookPath era: PATH replaced by this fixed list (#9311), later prefixed to the service PATH.
LOOKPATH_FIXED_PATH = (GPU_OPERATOR_TOOLKIT_DIR, KWASM_DIR, "/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")
LOOKPATH_PREFIX = (GPU_OPERATOR_TOOLKIT_DIR, KWASM_DIR)
# systemd's default PATH for services when no env file sets one.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SHIPPED_RUNTIMECLASSES = {
    K3S: ("nvidia", "nvidia-experimental", "crun", "lunatic", "slight", "spin", "wws", "wasmedge", "wasmer", "wasmtime"),
    RKE2: ("nvidia", "nvidia-experimental", "crun"),
}
# How the RuntimeClasses above reach the cluster (reference k3s-facts §6): k3s servers stage the
# embedded manifests/runtimes.yaml (#8936) into <data-dir>/server/manifests at each start and the
# deploy controller applies it; rke2 is built with no_stage and deploys chart rke2-runtimeclasses
# (rancher/rke2 #7382). `disable` is the config.yaml `disable:` item that turns it off.
RUNTIMECLASS_SOURCES = {
    K3S: {"mechanism": "runtimes.yaml manifest (applied by its deploy controller)", "disable": "runtimes"},
    RKE2: {"mechanism": "rke2-runtimeclasses chart", "disable": "rke2-runtimeclasses"},
}

# --- TOML table paths per schema ---------------------------------------------------------------

# Config version -> the CRI runtime plugin. Version 4 (containerd 2.3) moved only server settings
# (grpc, ttrpc, debug, metrics) into plugins; the CRI paths are those of version 3 (containerd
# docs/cri/config.md @v2.3.4), so schema 4 shares every v3 table path below.
CRI_RUNTIME_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
CONFIG_VERSIONS = tuple(sorted(CRI_RUNTIME_PLUGIN))


def cri_table(schema):
    """Key path of the table holding enable_cdi for a schema."""
    return ("plugins", CRI_RUNTIME_PLUGIN[schema])


def containerd_table(schema):
    """Key path of the table holding default_runtime_name and runtimes."""
    return cri_table(schema) + ("containerd",)


def runtime_table(schema, name):
    return containerd_table(schema) + ("runtimes", name)


# Options of the runc v2 shim (containerd runc.v2 Options); a key outside is almost surely a typo
# that containerd would keep silently while the pod runs on plain runc.
RUNC_OPTION_KEYS = (
    "BinaryName", "CriuImagePath", "CriuPath", "CriuWorkPath", "IoGid", "IoUid", "NoNewKeyring",
    "NoPivotRoot", "Root", "ShimCgroup", "SystemdCgroup", "TaskApiAddress", "TaskApiVersion",
)


# --- paths ---------------------------------------------------------------------------------------

# where systemd finds a unit, the admin's directories first
_UNIT_DIRS = ("/etc/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")


def _rancher_paths(name, binaries, units, env_file):
    """k3s and rke2 lay out their node alike: /var/lib/rancher/<name>, /etc/rancher/<name>, and env files
    for the unit in /etc/default, /etc/sysconfig and one place of their own."""
    return {"data_dir": "/var/lib/rancher/" + name, "config_dir": "/etc/rancher/" + name, "binaries": binaries,
            "units": units, "unit_dirs": _UNIT_DIRS, "env_files": ("/etc/default/{unit}", "/etc/sysconfig/{unit}", env_file)}


DISTRIBUTION_PATHS = {
    K3S: _rancher_paths("k3s", ("/usr/local/bin/k3s", "/usr/bin/k3s", "/opt/bin/k3s"), ("k3s", "k3s-agent"),
                        "/etc/systemd/system/{unit}.service.env"),
    RKE2: _rancher_paths("rke2", ("/usr/local/bin/rke2", "/usr/bin/rke2", "/opt/rke2/bin/rke2"), ("rke2-server", "rke2-agent"),
                         "/usr/local/lib/systemd/system/{unit}.env"),
    CONTAINERD: {
        "config": "/etc/containerd/config.toml",
        "dropin_dir": "/etc/containerd/conf.d",
        "binaries": ("/usr/bin/containerd", "/usr/local/bin/containerd", "/usr/sbin/containerd"),
        "units": ("containerd",),
        "unit_dirs": _UNIT_DIRS,
        "env_files": (),
    },
}

# --- the runtime that runs a k3s/rke2 node's pods ---------------------------------------------------
# `container-runtime-endpoint` (config.yaml, config.yaml.d, --container-runtime-endpoint; no
# environment variable) and k3s's `docker` (cri-dockerd) turn the embedded containerd off: k3s then
# neither detects runtimes nor renders its containerd config (k3s pkg/agent/run.go; k3s-facts §2).
# rke2 has no docker option. Sockets by the runtime that listens there (the packages' defaults;
# /var/run is /run on every systemd distribution). Anything else cannot be identified.
RUNTIME_EMBEDDED = "embedded-containerd"
RUNTIME_HOST_CONTAINERD = "containerd"
RUNTIME_DOCKER = "docker"
RUNTIME_CRIO = "cri-o"
RUNTIME_UNKNOWN = "unknown"
ENDPOINT_SOCKETS = (
    (RUNTIME_HOST_CONTAINERD, ("/run/containerd/containerd.sock",)),
    (RUNTIME_EMBEDDED, ("/run/k3s/containerd/containerd.sock",)),
    (RUNTIME_DOCKER, ("/run/cri-dockerd.sock", "/run/docker.sock", "/run/dockershim.sock")),
    (RUNTIME_CRIO, ("/run/crio/crio.sock",)),
)
DOCKER_OPTION_DISTRIBUTIONS = (K3S,)
# where a containerd config sets its socket: [grpc] address, and from config version 4 (containerd 2.3,
# `containerd config default` of 2.3.4) [plugins.'io.containerd.server.v1.grpc'] address
CONTAINERD_GRPC_TABLES = ("grpc", "plugins.io.containerd.server.v1.grpc")
# The kubelet's config files that may set `cgroupDriver`, in the order the kubelet reads them (last wins):
# kubeadm's /var/lib/kubelet/config.yaml; on k3s/rke2 (v1.32+) the drop-ins of
# <data-dir>/agent/etc/kubelet.conf.d, which k3s starts with 00-k3s-defaults.conf (k3s docs, kubelet config)
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBELET_DROPIN_DIR = "agent/etc/kubelet.conf.d"
# containerd's packages, for the version of a host containerd k3s/rke2 point at (Debian/Ubuntu; Docker's repo)
CONTAINERD_PACKAGES = ("containerd", "containerd.io")

MANAGED_FILE_STEM = "50-k3s-gpu-nvidia"
# A user's file the gpu_node role edits in place (a k3s/rke2 template, a plain containerd config) keeps its bytes
# from before the first edit in <file>.k3s-gpu-nvidia.orig (written once, with that edit), and the SHA-256 of the
# text the collection last left in <file>.k3s-gpu-nvidia.sha256 (sha256sum format); gpu_node_state=absent puts
# the original back when the file is still that text, then removes both
ORIGINAL_SUFFIX = ".k3s-gpu-nvidia.orig"
RECORD_SUFFIX = ".k3s-gpu-nvidia.sha256"
# the first line of a CDI spec the gpu_node role generated (roles/gpu_node/vars/main.yml has the same text; a unit
# test checks): gpu_node_state=absent removes only a spec that starts with it
CDI_SPEC_MARKER = "# Generated by k3s_gpu.nvidia (gpu_node role) with nvidia-ctk cdi generate; gpu_node_state=absent removes it"
TEMPLATE_V3 = "config-v3.toml.tmpl"
TEMPLATE_V2 = "config.toml.tmpl"
DROPIN_DIRS = {3: "config-v3.toml.d", 2: "config.toml.d"}


def distribution_paths(distribution, data_dir=None):
    """Every path that matters for a distribution, as absolute node paths."""
    spec = DISTRIBUTION_PATHS[distribution]
    if distribution == CONTAINERD:
        return {
            "config": spec["config"],
            "dropin_dir": spec["dropin_dir"],
            "dropin": "%s/%s.toml" % (spec["dropin_dir"], MANAGED_FILE_STEM),
        }
    data_dir = (data_dir or spec["data_dir"]).rstrip("/") or "/"
    containerd_dir = data_dir + "/agent/etc/containerd"
    return {
        "data_dir": data_dir,
        "containerd_dir": containerd_dir,
        "config": containerd_dir + "/config.toml",
        "template_v3": containerd_dir + "/" + TEMPLATE_V3,
        "template_v2": containerd_dir + "/" + TEMPLATE_V2,
        "dropin_dir_v3": containerd_dir + "/" + DROPIN_DIRS[3],
        "dropin_dir_v2": containerd_dir + "/" + DROPIN_DIRS[2],
        "dropin_v3": "%s/%s/%s.toml" % (containerd_dir, DROPIN_DIRS[3], MANAGED_FILE_STEM),
        "dropin_v2": "%s/%s/%s.toml" % (containerd_dir, DROPIN_DIRS[2], MANAGED_FILE_STEM),
        "manifests_dir": data_dir + "/server/manifests",
        # served by the server at https://%{KUBERNETES_API}%/static/charts/ (air-gapped HelmCharts)
        "static_charts_dir": data_dir + "/server/static/charts",
        "config_yaml": spec["config_dir"] + "/config.yaml",
        "config_yaml_d": spec["config_dir"] + "/config.yaml.d",
        "default_runtime_file": "%s/config.yaml.d/%s.yaml" % (spec["config_dir"], MANAGED_FILE_STEM),
        # where the gpu_node role wrote the node labels before containerd_runtimes took them into the file above
        "labels_file_legacy": "%s/config.yaml.d/%s-labels.yaml" % (spec["config_dir"], MANAGED_FILE_STEM),
    }


# the manifests the collection writes into a k3s/rke2 server's manifests directory (the cluster step); runtime_info
# reports their state so that a run compares them without writing
OPERATOR_MANIFEST = "k3s-gpu-nvidia-gpu-operator.yaml"
RUNTIMECLASS_MANIFEST = "k3s-gpu-nvidia-runtimeclasses.yaml"
DEVICE_PLUGIN_MANIFEST = "k3s-gpu-nvidia-device-plugin.yaml"
DRA_DRIVER_MANIFEST = "k3s-gpu-nvidia-dra-driver.yaml"
COLLECTION_MANIFESTS = (OPERATOR_MANIFEST, RUNTIMECLASS_MANIFEST, DEVICE_PLUGIN_MANIFEST, DRA_DRIVER_MANIFEST)


# --- versions ------------------------------------------------------------------------------------

_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-(?:rc|alpha|beta)\d*)?(?:\+(k3s|rke2r)(\d+))?$")
_CONTAINERD_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class Release:
    """A k3s/rke2 release such as v1.31.6+k3s1, comparable with feature thresholds."""

    def __init__(self, distribution, text):
        match = _RELEASE_RE.match(text.strip())
        if not match:
            raise K3sGpuError(
                "release %r is not a %s version" % (text, distribution),
                fix="expected the form v1.31.6+%s1" % ("k3s" if distribution == K3S else "rke2r",))
        major, minor, patch, suffix, revision = match.groups()
        expected_suffix = "k3s" if distribution == K3S else "rke2r"
        if suffix and suffix != expected_suffix:
            raise K3sGpuError("release %r is a %s release, but {distribution} is %s" % (
                text, "k3s" if suffix == "k3s" else "rke2", distribution), variable="distribution")
        self.distribution = distribution
        self.text = text.strip()
        self.key = (int(major), int(minor), int(patch), int(revision or 0))
        self.line = "%s.%s" % (major, minor)
        # the line whose FEATURES rows apply: its own, or the newest known one when a newer line is
        # assumed (parse_release with newer_release=assume_newest_known). Its key is above every
        # threshold of that line, so it reads as the newest release of it.
        self.table_line = self.line

    def at_least(self, threshold):
        other = _RELEASE_RE.match(threshold)
        major, minor, patch, _suffix, revision = other.groups()
        return self.key >= (int(major), int(minor), int(patch), int(revision or 0))

    def __str__(self):
        return self.text


def _threshold(feature_row, distribution, line):
    override = feature_row.get(distribution, {})
    if line in override:
        return override[line]
    if line in feature_row:
        return feature_row[line]
    return feature_row["*"]


def has_feature(release, feature):
    threshold = _threshold(FEATURES[feature], release.distribution, release.table_line)
    if threshold is ALL:
        return True
    if threshold is NEVER:
        return False
    return release.at_least(threshold)


def _check_policy(newer_release):
    if newer_release not in NEWER_RELEASE_POLICIES:
        raise K3sGpuError("{newer_release} must be one of %s, not %r" % (", ".join(NEWER_RELEASE_POLICIES), newer_release),
                          variable="newer_release")


def parse_release(distribution, text, newer_release=NEWER_RELEASE_REFUSE, option="release"):
    """Parse and check a k3s/rke2 release; too-old lines are refused, newer ones per newer_release. option: the
    module option the release came from, which a refusal names (release, or target_release)."""
    _check_policy(newer_release)
    release = Release(distribution, text)
    if release.line not in KNOWN_LINES:
        oldest, newest = KNOWN_LINES[0], KNOWN_LINES[-1]
        if release.key[:2] < line_key(oldest):
            raise K3sGpuError(
                "%s %s is older than the oldest release line this collection supports "
                "(%s)" % (distribution, text, oldest),
                fix="upgrade the node to %s or newer" % (oldest,))
        if release.key[:2] > line_key(newest) and newer_release == NEWER_RELEASE_ASSUME:
            release.table_line = newest
            return release
        raise K3sGpuError(
            "%s %s belongs to release line %s, which this collection does not know yet (it knows %s to %s); its "
            "containerd template and runtime detection may differ, so nothing is guessed" % (
                distribution, text, release.line, oldest, newest),
            "upgrade the collection; or, after checking that %s behaves like %s, set {newer_release}=assume_newest_known "
            "to proceed as on the newest %s release with a warning; or set {%s} to the closest known release" % (
                release.line, newest, newest, option), ("newer_release", option))
    return release


def newer_release_warning(what, text, line, assumed):
    """The warning of an assumed line: the release, the line assumed, the risk."""
    if what == CONTAINERD:
        differs = "the config versions it reads, its CRI plugin paths or how it merges drop-ins"
    else:
        differs = ("its containerd template, the template data fields, runtime detection, or the embedded "
                   "containerd and the config version it reads")
    return ("%s %s belongs to line %s, newer than any this collection knows; newer_release="
            "assume_newest_known: proceeding as on the newest %s release. Risk: %s may differ from %s in %s, "
            "so a file written now can be ignored or keep containerd from starting. Check the node after "
            "the restart, and upgrade the collection when it knows %s" % (
                what, text, line, assumed, line, assumed, differs, line))


def parse_containerd_version(text, newer_release=NEWER_RELEASE_REFUSE):
    """The containerd line of a version ("2.1"); a newer line than known is refused or, when
    newer_release=assume_newest_known, read as the newest known line (the caller warns)."""
    _check_policy(newer_release)
    match = _CONTAINERD_RE.match(text.strip())
    if not match:
        raise K3sGpuError("containerd version %r is not of the form 1.7.24 or v2.1.4" % (text,),
                          fix="set {release} to the version `containerd --version` prints on the node", variable="release")
    major, minor, patch = (int(x) for x in match.groups())
    line = "%d.%d" % (major, minor)
    if line not in KNOWN_CONTAINERD_LINES:
        newest = KNOWN_CONTAINERD_LINES[-1]
        if (major, minor) > line_key(newest) and newer_release == NEWER_RELEASE_ASSUME:
            return newest
        fix = "upgrade containerd to %s or newer" % KNOWN_CONTAINERD_LINES[0]
        if (major, minor) > line_key(newest):
            fix = ("upgrade the collection; or, after checking that %s behaves like %s, set {newer_release}=assume_newest_known "
                   "to proceed as on containerd %s with a warning" % (line, newest, newest))
        raise K3sGpuError("containerd %s (line %s) is outside the lines this collection knows (%s to %s)" % (
            text, line, KNOWN_CONTAINERD_LINES[0], newest), fix, "newer_release")
    return line


def _containerd_feature(feature, line):
    row = CONTAINERD_FEATURES[feature]
    return row.get(line, row["*"])


def _release_containerd_line(release):
    for feature, line in (("containerd_2_3", "2.3"), ("containerd_2_2", "2.2"),
                          ("containerd_2_1", "2.1"), ("containerd_2_0", "2.0")):
        if has_feature(release, feature):
            return line
    return "1.7"


def _containerd_profile(release_text, newer_release):
    """profile() of a plain containerd node: the containerd release decides."""
    line = parse_containerd_version(release_text, newer_release)
    real = "%d.%d" % tuple(int(x) for x in _CONTAINERD_RE.match(release_text.strip()).groups()[:2])
    major = int(line.split(".")[0])
    assumed = line if real != line else None
    return {
        "distribution": CONTAINERD,
        "release": release_text,
        "line": real,
        "assumed_line": assumed,
        "assumed_warning": newer_release_warning("containerd", release_text, real, assumed) if assumed else None,
        "containerd": line,
        "schema": 3 if major >= 2 else 2,
        "config_version_max": _containerd_feature("config_version_max", line),
        "templates": [],
        "base_template": False,
        "dropin_imports": False,
        "dropin_deep_merge": _containerd_feature("dropin_deep_merge", line),
        "cdi_supported": _containerd_feature("cdi", line),
        "cdi_default_on": _containerd_feature("cdi_default_on", line),
        "default_runtime": False,
        "detection": None,
        "detected_runtimes": [],
        "runtimeclasses": [],
        "extra_runtime_systemd_cgroup": True,
        "known_bad": None,
    }


def _detection_era(release):
    """How the release looks up runtime binaries: stat per directory, LookPath over a fixed PATH, or that
    PATH plus the service's own."""
    if has_feature(release, "service_path"):
        return "lookpath+service-path"
    if has_feature(release, "lookpath"):
        return "lookpath-fixed"
    return "stat"


def _detected_runtimes(release, detection):
    """The runtimes the release looks for (K3S_RUNTIMES rows as this release has them)."""
    detected = []
    for name, binary, runtime_type, feature, group in K3S_RUNTIMES:
        if feature and not has_feature(release, feature):
            continue
        if group == "wasm" and not has_feature(release, "wasm_v1_types"):
            # before #9519 every shim was looked up as containerd-shim-<name>-v1 (spin too, whose
            # shim had moved to -v2) and written as io.containerd.<name>.v2
            binary, runtime_type = "containerd-shim-%s-v1" % name, "io.containerd.%s.v2" % name
        if group == "crun" and detection == "stat" and has_feature(release, "crun_local_dirs"):
            group = "crun_local"
        detected.append({"name": name, "binary": binary, "runtime_type": runtime_type, "group": group})
    return detected


def profile(distribution, release_text, newer_release=NEWER_RELEASE_REFUSE, option="release"):
    """Everything a release implies, as one plain dict (the view the rest of the engine uses).

    A release of a line newer than the table is refused, or with newer_release=assume_newest_known
    read as the newest known line: then `assumed_line` names that line and `assumed_warning` says
    what is assumed and the risk (the modules warn with it). `schema` is the config version of a file
    the collection creates; `config_version_max` the highest version the node's containerd reads. option: the module
    option the release came from, which a refusal names.
    """
    if distribution == CONTAINERD:
        return _containerd_profile(release_text, newer_release)
    release = parse_release(distribution, release_text, newer_release, option)
    assumed = release.table_line if release.table_line != release.line else None
    containerd_line = _release_containerd_line(release)
    containerd2 = containerd_line != "1.7"
    detection = _detection_era(release)
    detected = _detected_runtimes(release, detection)
    known_bad = None
    for bad_distribution, bad_release, why in KNOWN_BAD_RELEASES:
        if bad_distribution == distribution and release.text == bad_release:
            known_bad = why
    return {
        "distribution": distribution,
        "release": release.text,
        "line": release.line,
        "assumed_line": assumed,
        "assumed_warning": newer_release_warning(distribution, release.text, release.line, assumed) if assumed else None,
        "containerd": containerd_line,
        "schema": 3 if containerd2 else 2,
        # k3s/rke2 generate their config.toml with `version = 3` (2 before containerd 2) from every
        # template (no k3s/rke2 template moved to 4 up to v1.37.2; inferred from release notes and hosts)
        "config_version_max": _containerd_feature("config_version_max", containerd_line),
        "templates": [TEMPLATE_V3, TEMPLATE_V2] if containerd2 else [TEMPLATE_V2],
        "base_template": has_feature(release, "base_template"),
        "dropin_imports": has_feature(release, "dropin_imports"),
        "dropin_deep_merge": _containerd_feature("dropin_deep_merge", containerd_line),
        "cdi_supported": _containerd_feature("cdi", containerd_line),
        "cdi_default_on": _containerd_feature("cdi_default_on", containerd_line),
        "default_runtime": has_feature(release, "default_runtime"),
        "nonroot_devices": has_feature(release, "nonroot_devices"),
        "detection": detection,
        "detected_runtimes": detected,
        "runtimeclasses": list(SHIPPED_RUNTIMECLASSES[distribution]) if has_feature(release, "runtimeclasses") else [],
        "extra_runtime_systemd_cgroup": has_feature(release, "extra_runtime_systemd_cgroup"),
        "known_bad": known_bad,
        "unified_template": containerd2,
    }


def schema_of_template(name):
    return 3 if name == TEMPLATE_V3 else 2
