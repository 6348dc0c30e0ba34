# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the controller knows of a release beyond what a node needs: NVIDIA's charts and packages, the helm-controller
each k3s/rke2 release compiles in, the data a containerd template may read, and the marks and backups of the files
the gpu_node role writes.

PRIVATE to the collection. Controller side. The node's part - the distributions, their paths, Release, profile() and
the one feature table FEATURES - is plugins/module_utils/_distro.py: a version gate here names a FEATURES row, read
through that file. Sources: docs/release-facts.md, docs/device-plugin.md, docs/template-data.md.
"""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# --- the gpu_node role's own files ------------------------------------------------------------------
# The first line by which the gpu_node role knows the udev rule distro.DEV_CHAR_RULE as its own
DEV_CHAR_RULE_MARKER = "# Written by k3s_gpu.nvidia (gpu_node_dev_char_symlinks); gpu_node_state=absent removes it"
# nvidia-cdi-refresh.path (distro.CDI_REFRESH_UNIT): the toolkit version that brings it, and the spec it writes
# The first line by which the gpu_node role knows its unit drop-in distro.DEVICE_NODES_DROPIN (DRA nodes) as its own
DEVICE_NODES_MARKER = "# Written by k3s_gpu.nvidia (gpu_node_allocation=dra); gpu_node_state=absent removes it"
CDI_REFRESH_SINCE_TOOLKIT = (1, 18)  # deployments/systemd/ and the packages' unit files from v1.18.0
CDI_REFRESH_OUTPUT = "/var/run/cdi/nvidia.yaml"
# Backups (backup: true, gpu_node_backup): the copy of a file the collection is about to replace goes to
# BACKUP_DIR + the file's own path + ".<time>~", outside every directory k3s, rke2 or containerd import; the newest
# BACKUP_KEEP copies of each file are kept. A file only the collection ever wrote is not copied when it is removed.
BACKUP_DIR = "/var/backups/k3s-gpu-nvidia"
BACKUP_KEEP = 3
# the drop-ins the collection writes, by their key in runtime_info's files (one per layout of the releases)
OWN_DROPINS = ("dropin_v3", "dropin_v2", "dropin")


def backup_prefix(node_path):
    """Where the copies of node_path go (node_files adds .<time>~): under BACKUP_DIR, never in a directory that k3s,
    rke2 or containerd import."""
    return BACKUP_DIR + node_path


# --- NVIDIA GPU Operator (operator mode) -----------------------------------------------------------
# Sources: NVIDIA/gpu-operator tags v24.9.2, v25.3.4, v25.10.1, v26.3.3, v26.7.0 (values.yaml, controllers/
# object_controls.go RuntimeClasses(), state_manager.go), tests/unit/fixtures/gpu_operator/README.md, k3s-facts §8.3.
GPU_OPERATOR_CHART = {
    "name": "gpu-operator",
    "repo": "https://helm.ngc.nvidia.com/nvidia",
    # NVIDIA lists K3s as supported from v26.3.0
    "default_version": "v26.3.3",
    # toolkit.installDir; k3s/rke2 search only <installDir>/toolkit (= distro.GPU_OPERATOR_TOOLKIT_DIR)
    "install_dir": "/usr/local/nvidia",
    # operator.runtimeClass: the name AND handler of the operator's main RuntimeClass
    "runtime_class": "nvidia",
}
# chart line -> what its values mean: cdi.enabled default, NRI plugin mode (cdi.nriPluginEnabled), and whether the
# operator refuses that mode with its toolkit off (v26.7.0 state_manager.go: "the NRI Plugin cannot be enabled when the
# Container Toolkit is disabled"). RuntimeClasses() and the pre-requisites state are the same in 26.3.3 and 26.7.0.
GPU_OPERATOR_LINES = {
    "24.9": {"cdi_default": False, "nri": False, "nri_needs_toolkit": False},
    "25.3": {"cdi_default": False, "nri": False, "nri_needs_toolkit": False},
    "25.10": {"cdi_default": True, "nri": False, "nri_needs_toolkit": False},
    "26.3": {"cdi_default": True, "nri": True, "nri_needs_toolkit": False},
    "26.7": {"cdi_default": True, "nri": True, "nri_needs_toolkit": True},
}
# The RuntimeClasses the operator reconciles, in every line above, by its mode: it creates some and
# DELETES the others on every reconcile, without looking at who made them. It also takes over an
# existing object of a name it creates (a controller ownerReference; garbage-collected on uninstall).
GPU_OPERATOR_RUNTIMECLASSES = {
    "cdi": {"created": ("nvidia", "nvidia-cdi", "nvidia-legacy"), "deleted": ()},
    "legacy": {"created": ("nvidia",), "deleted": ("nvidia-cdi", "nvidia-legacy")},
    "nri": {"created": (), "deleted": ("nvidia", "nvidia-cdi", "nvidia-legacy")},
}
# containerd needed on the node per operator mode (RKE2 docs add-ons/gpu_operators.md: CDI mode
# "requires containerd 2.0", NRI plugin mode containerd 2.1)
GPU_OPERATOR_MODE_CONTAINERD = {"cdi": "2.0", "nri": "2.1", "legacy": None}

# --- NVIDIA device plugin (host mode) ------------------------------------------------------------------
# Chart nvidia-device-plugin of NVIDIA/k8s-device-plugin. Sources, per fact: docs/device-plugin.md. The
# repository index is the gh-pages branch (index.yaml @bf584288ed8c lists every version below).
DEVICE_PLUGIN_CHART = {
    "name": "nvidia-device-plugin",
    "repo": "https://nvidia.github.io/k8s-device-plugin",
    "default_version": "0.20.0",
    # nvidia.com/device-plugin.config: the node label the chart's config-manager reads
    "config_label": "nvidia.com/device-plugin.config",
}
# version -> the chart at that tag: the commit, its default image (values.yaml image.repository, tag
# v<appVersion> from templates/_helpers.tpl) and the allowed values of the options this collection sets
# (api/config/v1/consts.go; cmd/nvidia-device-plugin/main.go validateFlags). The three tags have the same
# values.yaml keys for everything the collection sets (git diff of the chart directory between the tags).
_DEVICE_PLUGIN_OPTIONS = {
    "mig_strategies": ("none", "single", "mixed"),
    "device_list_strategies": ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"),
    "device_discovery_strategies": ("auto", "nvml", "tegra"),
    "sharing_strategies": ("time-slicing", "mps"),
    # cmd/mps-control-daemon/mps/device.go maxClients(): 48 from compute capability 7.5, else 16
    "mps_max_replicas": 48,
    # the NFD subchart's image.repository (charts/node-feature-discovery-0.17.3 / 0.19.0 values.yaml),
    # deployed with gfd.enabled
    "nfd_image_repository": "registry.k8s.io/nfd/node-feature-discovery",
}
DEVICE_PLUGIN_VERSIONS = {
    "0.18.2": dict(_DEVICE_PLUGIN_OPTIONS, commit="fb1242add205d8563f9c604b8ba239607b4083e6",
                   image="nvcr.io/nvidia/k8s-device-plugin:v0.18.2"),
    "0.19.3": dict(_DEVICE_PLUGIN_OPTIONS, commit="570e776d6813cb9f3e9c8c105cf8d79989db6650",
                   image="nvcr.io/nvidia/k8s-device-plugin:v0.19.3"),
    # the one rendered by the conformance tests (shared charts/nvidia-device-plugin-0.20.0.tgz)
    "0.20.0": dict(_DEVICE_PLUGIN_OPTIONS, commit="1b826acc6af3079d8923bac395c3124b8861a9a6",
                   image="nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
}
# The devicePluginCDIDevices CRI field that deviceListStrategy cdi-cri uses: Kubernetes KEP-4009,
# alpha in 1.28 (feature gate off), beta and on by default from 1.29, GA in 1.31.
DEVICE_PLUGIN_CDI_CRI_KUBERNETES = "1.29"

# --- NVIDIA's DRA driver for GPUs (gpu_node_allocation: dra) ---------------------------------------------
# Chart dra-driver-nvidia-gpu of kubernetes-sigs/dra-driver-nvidia-gpu (NVIDIA's driver, moved from
# NVIDIA/k8s-dra-driver-gpu); published at oci://registry.k8s.io/dra-driver-nvidia/charts (site/content/docs/upgrade.md).
# A HelmChart takes an OCI chart as spec.chart oci://... with spec.version and no repo (k3s-io/helm-controller #320).
# Sources: ../shared/reference/dra-and-field-2026-12.md A2, ../shared/charts/README.md.
DRA_DRIVER_CHART = {
    "name": "dra-driver-nvidia-gpu",
    "repo": "oci://registry.k8s.io/dra-driver-nvidia/charts",
    "default_version": "0.4.1",
    "driver": "gpu.nvidia.com",  # the driver's name in ResourceSlices, its DeviceClass and its CDI kind's vendor
    "device_class": "gpu.nvidia.com",
}
# version -> the chart at that tag: its commit and default image (values.yaml image.repository, tag v<appVersion>)
DRA_DRIVER_VERSIONS = {
    # rendered by the conformance tests (shared charts/dra-driver-nvidia-gpu-0.4.1.tgz); Chart.yaml kubeVersion >=1.32
    "0.4.1": {"commit": "764900e7833798a1528bd52a2af3e1b2d5f7a616",
              "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"},
}
# nvidiaDriverRoot: where the driver's files are on the node (a host install, or the GPU Operator's driver container)
DRA_DRIVER_ROOTS = {"host": "/", "operator": "/run/nvidia/driver"}

# --- NVIDIA packages (the gpu_node role's installs) -----------------------------------------------------
# The container toolkit: every package pinned to one version together (the toolkit pins -base and the tools to
# its own version, but the tools take any newer libnvidia-container1). The operator extensions are the only
# package with the .cdi and .legacy runtimes.
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                    "libnvidia-container1")
TOOLKIT_OPERATOR_EXTENSIONS = "nvidia-container-toolkit-operator-extensions"
# The driver from NVIDIA's CUDA repository, compute-only (no X server or desktop parts): OS key
# ("<family>-<major>", RHEL rebuilds count as RedHat) -> the repository's OS directory, and the machine -> its arch
# directory (https://developer.download.nvidia.com/compute/cuda/repos/<os>/<arch>).
CUDA_REPO_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_REPO_OS = {"Ubuntu-22": "ubuntu2204", "Ubuntu-24": "ubuntu2404", "Debian-12": "debian12", "RedHat-8": "rhel8",
                "RedHat-9": "rhel9"}
CUDA_REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
REDHAT_REBUILDS = ("RedHat", "Rocky", "AlmaLinux")
# NVIDIA's CUDA repository keys, next to the packages: 3bf863cc for Debian/Ubuntu, D42D0685 for RHEL
CUDA_REPO_KEYS = {"apt": ("3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
                  "dnf": ("D42D0685.pub", "610C7B14E068A878070DA4E99CD0A493D42D0685")}
# Ubuntu drops the branch from the driver's package names from this branch on, and selects the branch with
# nvidia-driver-pinning-<branch> as Debian always does; RHEL 8/9 select it with a dnf module stream.
UBUNTU_UNBRANCHED_DRIVER_FROM = 590
NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
NOUVEAU_BLACKLIST_HEADER = "# written by k3s_gpu.nvidia.gpu_node: the NVIDIA driver needs the GPUs"
# where apt and dnf expect locally managed keys
KEYRING_DIRS = {"apt": "/etc/apt/keyrings", "dnf": "/etc/pki/rpm-gpg"}

# --- helm-controller (the HelmChart custom resource) -------------------------------------------------
# The k3s-io/helm-controller version each release compiles in (rke2 go.mod at each tag; k3s's release
# notes agree where both list it): line -> ((first release, version), ...). Source and the CRD schemas:
# tests/unit/fixtures/helmchart/README.md.
HELM_CONTROLLER = {
    "1.28": (("v1.28.0", "v0.15.4"), ("v1.28.6", "v0.15.8"), ("v1.28.8", "v0.15.9"), ("v1.28.11", "v0.15.10"),
             ("v1.28.14", "v0.15.13"), ("v1.28.15", "v0.15.15")),
    "1.29": (("v1.29.0", "v0.15.4"), ("v1.29.1", "v0.15.8"), ("v1.29.3", "v0.15.9"), ("v1.29.6", "v0.15.10"),
             ("v1.29.9", "v0.15.13"), ("v1.29.10", "v0.15.15"), ("v1.29.14", "v0.15.16")),
    "1.30": (("v1.30.0", "v0.16.1"), ("v1.30.5", "v0.16.4"), ("v1.30.6", "v0.16.5"), ("v1.30.10", "v0.16.6"),
             ("v1.30.12", "v0.16.10"), ("v1.30.14", "v0.16.11"), ("v1.30.14+rke2r2", "v0.16.13")),
    "1.31": (("v1.31.0", "v0.16.3"), ("v1.31.1", "v0.16.4"), ("v1.31.1+rke2r2", "v0.16.5"), ("v1.31.6", "v0.16.6"),
             ("v1.31.8", "v0.16.10"), ("v1.31.10", "v0.16.11"), ("v1.31.11", "v0.16.13"), ("v1.31.14", "v0.16.16")),
    "1.32": (("v1.32.0", "v0.16.5"), ("v1.32.2", "v0.16.6"), ("v1.32.4", "v0.16.10"), ("v1.32.6", "v0.16.11"),
             ("v1.32.7", "v0.16.13"), ("v1.32.10", "v0.16.16"), ("v1.32.11", "v0.16.17")),
    "1.33": (("v1.33.0", "v0.16.10"), ("v1.33.2", "v0.16.11"), ("v1.33.3", "v0.16.13"), ("v1.33.6", "v0.16.16"),
             ("v1.33.7", "v0.16.17"), ("v1.33.11", "v0.17.1"), ("v1.33.13+rke2r2", "v0.16.26")),
    "1.34": (("v1.34.0", "v0.16.13"), ("v1.34.2", "v0.16.16"), ("v1.34.3", "v0.16.17"), ("v1.34.7", "v0.17.1"),
             ("v1.34.10", "v0.16.26")),
    "1.35": (("v1.35.0", "v0.16.17"), ("v1.35.4", "v0.17.1"), ("v1.35.7", "v0.17.7")),
    "1.36": (("v1.36.0", "v0.17.1"), ("v1.36.3", "v0.17.7")),
    # k3s-io/docs v1.37.X.md @5962ea1e, rke2-docs v1.37.X.md @9780f575: v1.37.0 v0.17.7, v1.37.1 v0.17.9.
    # v1.37.2 bumps it again (#14814, version not read): v0.17.9 is assumed there (a newer controller
    # only adds fields, so the fields assumed are all there).
    "1.37": (("v1.37.0", "v0.17.7"), ("v1.37.1", "v0.17.9")),
}
# HelmChart spec fields by the helm-controller version that added them, per release branch (0.15,
# 0.16 and 0.17 are released side by side; a branch not listed never had the field). A field the
# release's CRD lacks is pruned by the API server without an error. Fields older than v0.15.0
# (chart, repo, version, targetNamespace, valuesContent, set, createNamespace, ...) are in every version.
_EVERY_BRANCH = {"0.15": 0, "0.16": 0, "0.17": 0}
HELMCHART_SPEC_FIELDS = {
    "authPassCredentials": _EVERY_BRANCH, "authSecret": _EVERY_BRANCH, "bootstrap": _EVERY_BRANCH,
    "chart": _EVERY_BRANCH, "chartContent": _EVERY_BRANCH, "createNamespace": _EVERY_BRANCH,
    "failurePolicy": _EVERY_BRANCH, "helmVersion": _EVERY_BRANCH, "jobImage": _EVERY_BRANCH, "repo": _EVERY_BRANCH,
    "repoCA": _EVERY_BRANCH, "repoCAConfigMap": _EVERY_BRANCH, "set": _EVERY_BRANCH, "targetNamespace": _EVERY_BRANCH,
    "timeout": _EVERY_BRANCH, "valuesContent": _EVERY_BRANCH, "version": _EVERY_BRANCH,
    "dockerRegistrySecret": {"0.15": 1, "0.16": 0, "0.17": 0},
    "backOffLimit": {"0.15": 3, "0.16": 0, "0.17": 0},
    "podSecurityContext": {"0.15": 6, "0.16": 0, "0.17": 0},
    "securityContext": {"0.15": 6, "0.16": 0, "0.17": 0},
    "insecureSkipTLSVerify": {"0.15": 13, "0.16": 4, "0.17": 0},
    "plainHTTP": {"0.15": 13, "0.16": 4, "0.17": 0},
    "valuesSecrets": {"0.16": 7, "0.17": 0},
    "takeOwnership": {"0.16": 14, "0.17": 0},
    "values": {"0.16": 20, "0.17": 0},
    "driver": {"0.16": 21, "0.17": 1},
    "forceConflicts": {"0.16": 25, "0.17": 6},
    "serverSide": {"0.16": 26, "0.17": 7},
}


def newer_release_of(reading):
    """The newer-release policy a runtime_info reading was made with (its read_options), else refuse:
    a plan made from that reading follows the same policy."""
    options = reading.get("read_options") if hasattr(reading, "get") else None
    policy = (options or {}).get("newer_release") if hasattr(options or {}, "get") else None
    return policy if policy in distro.NEWER_RELEASE_POLICIES else distro.NEWER_RELEASE_REFUSE


def cluster_profile(server, deploys):
    """The release profile of a cluster's server, from its reading (a _node_facts.NodeFacts); `deploys` says what
    needs it (host mode's device plugin, operator mode's GPU Operator: both a k3s/rke2 HelmChart)."""
    if server.distribution not in (distro.K3S, distro.RKE2):
        raise K3sGpuError("cluster must be the runtime_info result of a k3s or rke2 server (distribution, release, paths); "
                          "%s deploys a k3s/rke2 HelmChart" % deploys)
    return server.profile


def helm_controller_version(profile):
    """The helm-controller version a k3s/rke2 release compiles in (None for plain containerd)."""
    if profile["distribution"] == distro.CONTAINERD:
        return None
    release = distro.Release(profile["distribution"], profile["release"])
    found = None
    for first, version in HELM_CONTROLLER[profile.get("assumed_line") or release.line]:
        if release.at_least(first):
            found = version
    return found


def helmchart_spec_fields(profile):
    """HelmChart spec fields the release's CRD keeps (from its helm-controller version)."""
    version = helm_controller_version(profile)
    major, minor, patch = (int(part) for part in version.lstrip("v").split("."))
    branch = "%d.%d" % (major, minor)
    return tuple(sorted(field for field, since in HELMCHART_SPEC_FIELDS.items()
                        if branch in since and patch >= since[branch]))


# --- the containerd template's data (what a user template may read) -------------------------------
# k3s renders the user's template with a templates.ContainerdConfig value (pkg/agent/templates). A
# field a release does not have makes rendering fail (`can't evaluate field X in type ...`), so the
# node's containerd does not start. (dotted path, type, FEATURES row that gates it: "row" = present
# from the row's releases on, "!row" = gone from them on, None = every release). "closed-" structs
# list every field (anything else is refused); other struct-typed fields are open (a field below them
# is reported as unverified). Read from k3s's pkg/daemons/config and pkg/agent/templates at the k3s
# commit each rke2 tag pins, 18 eras from v1.28.0 to the March-2026 releases; 1.36/1.37 are assumed
# to be the March-2026 era (their source could not be read). Sources: docs/template-data.md.
# one row per field, as k3s's structs list them: rows alike by nature (docs/architecture-duplicates.md)
TEMPLATE_FIELDS = (
    ("DisableCgroup", "bool", None),
    ("EnableUnprivileged", "bool", None),
    ("ExtraRuntimes", "map-runtime", None),
    ("ExtraRuntimes.RuntimeType", "string", None),  # declaration order (toJson prints it so)
    ("ExtraRuntimes.BinaryName", "string", None),
    ("IsRunningInUserNS", "bool", None),
    ("NoDefaultEndpoint", "bool", "template_registry_v2"),
    ("NodeConfig", "closed-ptr-struct", None),
    ("NonrootDevices", "bool", "nonroot_devices"),
    ("PrivateRegistryConfig", "closed-ptr-struct", None),
    ("Program", "string", None),
    ("SystemdCgroup", "bool", None),
    ("NodeConfig.AgentConfig", "closed-struct", None),
    ("NodeConfig.CRIDockerd", "closed-struct", None),
    ("NodeConfig.Certificate", "ptr-struct", "!template_certificate_removed"),
    ("NodeConfig.ContainerRuntimeEndpoint", "string", None),
    ("NodeConfig.Containerd", "closed-struct", None),
    ("NodeConfig.DefaultRuntime", "string", "default_runtime"),
    ("NodeConfig.Docker", "bool", None),
    ("NodeConfig.EgressSelectorMode", "string", None),
    ("NodeConfig.EmbeddedRegistry", "bool", "template_registry_v2"),
    ("NodeConfig.EnablePProf", "bool", "template_tls_pprof_fields"),
    ("NodeConfig.Flannel", "closed-struct", "template_flannel_moved"),
    ("NodeConfig.FlannelBackend", "string", "!template_flannel_moved"),
    ("NodeConfig.FlannelConfFile", "string", "!template_flannel_moved"),
    ("NodeConfig.FlannelConfOverride", "bool", "!template_flannel_moved"),
    ("NodeConfig.FlannelExternalIP", "bool", "!template_flannel_moved"),
    ("NodeConfig.FlannelIPv6Masq", "bool", "!template_flannel_moved"),
    ("NodeConfig.FlannelIface", "ptr-struct", "!template_flannel_moved"),
    ("NodeConfig.ImageServiceEndpoint", "string", "template_image_service_endpoint"),
    ("NodeConfig.Images", "string", None),
    ("NodeConfig.MultiClusterCIDR", "bool", "!template_multicluster_cidr_removed"),
    ("NodeConfig.NoFlannel", "bool", "!template_flannel_moved"),
    ("NodeConfig.SELinux", "bool", None),
    ("NodeConfig.ServerHTTPSPort", "int", None),
    ("NodeConfig.SupervisorMetrics", "bool", "template_tls_pprof_fields"),
    ("NodeConfig.SupervisorPort", "int", "template_tls_pprof_fields"),
    ("NodeConfig.Token", "string", None),
    ("PrivateRegistryConfig.Auths", "map", None),
    ("PrivateRegistryConfig.Configs", "map", None),
    ("PrivateRegistryConfig.Mirrors", "map", None),
    ("NodeConfig.AgentConfig.AirgapExtraRegistry", "[]string", None),
    ("NodeConfig.AgentConfig.AlsoLogToStderr", "bool", "template_agent_log_fields"),
    ("NodeConfig.AgentConfig.CNIBinDir", "string", None),
    ("NodeConfig.AgentConfig.CNIConfDir", "string", None),
    ("NodeConfig.AgentConfig.CNIPlugin", "bool", None),
    ("NodeConfig.AgentConfig.CipherSuites", "[]string", "template_tls_pprof_fields"),
    ("NodeConfig.AgentConfig.ClientCA", "string", None),
    ("NodeConfig.AgentConfig.ClientKubeletCert", "string", None),
    ("NodeConfig.AgentConfig.ClientKubeletKey", "string", None),
    ("NodeConfig.AgentConfig.ClusterCIDR", "ptr-struct", None),
    ("NodeConfig.AgentConfig.ClusterCIDRs", "any", None),
    ("NodeConfig.AgentConfig.ClusterDNS", "any", None),
    ("NodeConfig.AgentConfig.ClusterDNSs", "any", None),
    ("NodeConfig.AgentConfig.ClusterDomain", "string", None),
    ("NodeConfig.AgentConfig.DisableCCM", "bool", None),
    ("NodeConfig.AgentConfig.DisableNPC", "bool", None),
    ("NodeConfig.AgentConfig.DisableServiceLB", "bool", None),
    ("NodeConfig.AgentConfig.EnableIPv4", "bool", None),
    ("NodeConfig.AgentConfig.EnableIPv6", "bool", None),
    ("NodeConfig.AgentConfig.ExtraKubeProxyArgs", "[]string", None),
    ("NodeConfig.AgentConfig.ExtraKubeletArgs", "[]string", None),
    ("NodeConfig.AgentConfig.FlannelCniConfFile", "string", "!template_flannel_moved"),
    ("NodeConfig.AgentConfig.IPSECPSK", "string", None),
    ("NodeConfig.AgentConfig.ImageCredProvBinDir", "string", None),
    ("NodeConfig.AgentConfig.ImageCredProvConfig", "string", None),
    ("NodeConfig.AgentConfig.ImageServiceSocket", "string", None),
    ("NodeConfig.AgentConfig.KubeConfigK3sController", "string", None),
    ("NodeConfig.AgentConfig.KubeConfigKubeProxy", "string", None),
    ("NodeConfig.AgentConfig.KubeConfigKubelet", "string", None),
    ("NodeConfig.AgentConfig.KubeletConfigDir", "string", "template_kubelet_config_dir"),
    ("NodeConfig.AgentConfig.ListenAddress", "string", None),
    ("NodeConfig.AgentConfig.LogFile", "string", "template_agent_log_fields"),
    ("NodeConfig.AgentConfig.MinTLSVersion", "string", "template_tls_pprof_fields"),
    ("NodeConfig.AgentConfig.NodeConfigPath", "string", None),
    ("NodeConfig.AgentConfig.NodeExternalDNSs", "[]string", "template_node_dns_fields"),
    ("NodeConfig.AgentConfig.NodeExternalIP", "string", None),
    ("NodeConfig.AgentConfig.NodeExternalIPs", "any", None),
    ("NodeConfig.AgentConfig.NodeIP", "string", None),
    ("NodeConfig.AgentConfig.NodeIPs", "any", None),
    ("NodeConfig.AgentConfig.NodeInternalDNSs", "[]string", "template_node_dns_fields"),
    ("NodeConfig.AgentConfig.NodeLabels", "[]string", None),
    ("NodeConfig.AgentConfig.NodeName", "string", None),
    ("NodeConfig.AgentConfig.NodeTaints", "[]string", None),
    ("NodeConfig.AgentConfig.PauseImage", "string", None),
    ("NodeConfig.AgentConfig.PodManifests", "string", None),
    ("NodeConfig.AgentConfig.PrivateRegistry", "string", "!template_registry_v2"),
    ("NodeConfig.AgentConfig.ProtectKernelDefaults", "bool", None),
    ("NodeConfig.AgentConfig.Registry", "closed-ptr-struct", "template_registry_v2"),
    ("NodeConfig.AgentConfig.ResolvConf", "string", None),
    ("NodeConfig.AgentConfig.RootDir", "string", None),
    ("NodeConfig.AgentConfig.Rootless", "bool", None),
    ("NodeConfig.AgentConfig.RuntimeSocket", "string", None),
    ("NodeConfig.AgentConfig.ServiceCIDR", "ptr-struct", None),
    ("NodeConfig.AgentConfig.ServiceCIDRs", "any", None),
    ("NodeConfig.AgentConfig.ServiceNodePortRange", "struct", None),
    ("NodeConfig.AgentConfig.ServingKubeletCert", "string", None),
    ("NodeConfig.AgentConfig.ServingKubeletKey", "string", None),
    ("NodeConfig.AgentConfig.Snapshotter", "string", None),
    ("NodeConfig.AgentConfig.SystemDefaultRegistry", "string", None),
    ("NodeConfig.AgentConfig.Systemd", "bool", None),
    ("NodeConfig.AgentConfig.VLevel", "int", "template_agent_log_fields"),
    ("NodeConfig.AgentConfig.VModule", "string", "template_agent_log_fields"),
    ("NodeConfig.CRIDockerd.Address", "string", None),
    ("NodeConfig.CRIDockerd.Debug", "bool", "template_cridockerd_debug"),
    ("NodeConfig.CRIDockerd.Root", "string", None),
    ("NodeConfig.Containerd.Address", "string", None),
    ("NodeConfig.Containerd.BlockIOConfig", "string", "template_blockio_rdt"),
    ("NodeConfig.Containerd.Config", "string", None),
    ("NodeConfig.Containerd.ConfigVersion", "int", "containerd_2_0"),
    ("NodeConfig.Containerd.Debug", "bool", None),
    ("NodeConfig.Containerd.Log", "string", None),
    ("NodeConfig.Containerd.NoDefault", "bool", "template_registry_v2"),
    ("NodeConfig.Containerd.NonrootDevices", "bool", "nonroot_devices"),
    ("NodeConfig.Containerd.Opt", "string", None),
    ("NodeConfig.Containerd.RDTConfig", "string", "template_blockio_rdt"),
    ("NodeConfig.Containerd.Registry", "string", "template_registry_v2"),
    ("NodeConfig.Containerd.Root", "string", None),
    ("NodeConfig.Containerd.SELinux", "bool", None),
    ("NodeConfig.Containerd.State", "string", None),
    ("NodeConfig.Containerd.Template", "string", None),
    ("NodeConfig.Flannel.Backend", "string", "template_flannel_moved"),
    ("NodeConfig.Flannel.CNIConfFile", "string", "template_flannel_moved"),
    ("NodeConfig.Flannel.ConfFile", "string", "template_flannel_moved"),
    ("NodeConfig.Flannel.ConfOverride", "bool", "template_flannel_moved"),
    ("NodeConfig.Flannel.ExternalIP", "bool", "template_flannel_moved"),
    ("NodeConfig.Flannel.IPv6Masq", "bool", "template_flannel_moved"),
    ("NodeConfig.Flannel.Iface", "ptr-struct", "template_flannel_moved"),
    ("NodeConfig.AgentConfig.Registry.Auths", "map", "template_registry_v2"),
    ("NodeConfig.AgentConfig.Registry.Configs", "map", "template_registry_v2"),
    ("NodeConfig.AgentConfig.Registry.Mirrors", "map", "template_registry_v2"),
)
# k3s's FuncMap for the containerd template, by the FEATURES row that brings each function.
TEMPLATE_FUNCS = (("deschemify", "template_func_deschemify"), ("toJson", "template_func_tojson"),
                  ("filepathjoin", "template_func_filepathjoin"))
# What most nodes have for fields the controller cannot know (a flag, a default): the first
# rendering uses these, and every branch they decide is also rendered the other way.
TEMPLATE_TYPICAL = {
    "NodeConfig.AgentConfig.PauseImage": "rancher/mirrored-pause:3.6",
    "NodeConfig.AgentConfig.Snapshotter": "overlayfs",
    "NodeConfig.AgentConfig.CNIBinDir": "/var/lib/rancher/k3s/data/current/bin",
    "NodeConfig.AgentConfig.CNIConfDir": "/var/lib/rancher/k3s/agent/etc/cni/net.d",
    "NodeConfig.AgentConfig.NodeName": "node",
    "NodeConfig.AgentConfig.Systemd": True,
    "NodeConfig.Containerd.Address": "/run/k3s/containerd/containerd.sock",
    "NodeConfig.Containerd.Root": "/var/lib/rancher/k3s/agent/containerd",
    "NodeConfig.Containerd.State": "/run/k3s/containerd",
    "NodeConfig.Containerd.Opt": "/var/lib/rancher/k3s/agent/containerd",
    "NodeConfig.Containerd.Registry": "/var/lib/rancher/k3s/agent/etc/containerd/certs.d",
    "NodeConfig.Containerd.SELinux": False,
    "NodeConfig.Containerd.Debug": False,
    "NodeConfig.SELinux": False,
    "NodeConfig.NoFlannel": False,
    "NodeConfig.Flannel.Backend": "vxlan",
    "DisableCgroup": False,
    "IsRunningInUserNS": False,
    "EnableUnprivileged": True,
    "NoDefaultEndpoint": False,
    "NonrootDevices": False,
}
