# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Node facts, read under a root prefix: what k3s/rke2 will detect, and what it ignores.

PRIVATE to the collection. Stdlib only, read-only, Python 3.8+: this runs on every node.
The search mirrors k3s pkg/agent/containerd/runtimes.go release by release (see _distro).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import posixpath
import re
import stat

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import unquote
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

MAX_CONFIG_BYTES = 1024 * 1024  # a containerd template is a few KiB; refuse anything huge
_SYMLINK_LIMIT = 40


class NodeFS:
    """Read-only view of a node's files under a root prefix, resolving symlinks inside root."""

    def __init__(self, root):
        self.root = os.path.abspath(root or "/")
        self._resolved = {}  # one read-only pass: a path resolves the same way throughout
        self._listings = {}
        self._lstats = {}

    def host_path(self, node_path, follow=True):
        """The host path of a node path, with symlinks resolved within root (None if dangling/loop)."""
        key = (node_path, follow)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(node_path, follow)
        return self._resolved[key]

    def _lstat(self, host):
        # paths share their leading directories: each one is looked at once per reading
        if host not in self._lstats:
            try:
                self._lstats[host] = os.lstat(host)
            except OSError:
                self._lstats[host] = None
        return self._lstats[host]

    def _resolve(self, node_path, follow):
        parts = [p for p in node_path.split("/") if p not in ("", ".")]
        parts.reverse()  # popped from the end
        resolved = []
        base = self.root.rstrip("/")
        hops = 0
        while parts:
            part = parts.pop()
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            host = "/".join([base] + resolved + [part])
            st = self._lstat(host)
            if st is None:
                # missing: the rest cannot exist either
                return "/".join([host] + parts[::-1])
            if stat.S_ISLNK(st.st_mode) and (follow or parts):
                hops += 1
                if hops > _SYMLINK_LIMIT:
                    return None
                target = os.readlink(host)
                if target.startswith("/"):
                    resolved = []
                parts.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                continue
            resolved.append(part)
        return "/".join([base] + resolved) if resolved else self.root

    def stat(self, node_path):
        host = self.host_path(node_path)
        if host is None:
            return None
        try:
            return os.stat(host)
        except OSError:
            return None

    def _unfollowed(self, call, node_path):
        """call(host path) on the node path's last part itself (its directories resolved, it not), else None."""
        host = self.host_path(posixpath.dirname(node_path) or "/")
        if host is None:
            return None
        try:
            return call(os.path.join(host, posixpath.basename(node_path)))
        except OSError:
            return None

    def lstat(self, node_path):
        return self._unfollowed(os.lstat, node_path)

    def readlink(self, node_path):
        """The target of a symlink (as written, unresolved), else None."""
        return self._unfollowed(os.readlink, node_path)

    def is_file(self, node_path):
        st = self.stat(node_path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def is_dir(self, node_path):
        st = self.stat(node_path)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def listdir(self, node_path):
        host = self.host_path(node_path)
        try:
            return sorted(os.listdir(host)) if host else []
        except OSError:
            return []

    def names(self, directory):
        """The names in a node directory (empty if it is missing), listed once per reading."""
        if directory not in self._listings:
            host = self.host_path(directory)
            try:
                self._listings[directory] = frozenset(os.listdir(host)) if host else frozenset()
            except OSError:
                self._listings[directory] = frozenset()
        return self._listings[directory]

    def may_exist(self, node_path):
        """False when the parent directory surely lacks the name (one listing per directory)."""
        parent, name = posixpath.split(node_path)
        return name in self.names(parent)

    def read_bytes(self, node_path, limit=MAX_CONFIG_BYTES):
        host = self.host_path(node_path)
        if host is None:
            return None
        try:
            with open(host, "rb") as handle:
                return handle.read(limit + 1)
        except (IOError, OSError):
            return None

    def read_text(self, node_path, limit=MAX_CONFIG_BYTES):
        data = self.read_bytes(node_path, limit)
        if data is None:
            return None
        return data.decode("utf-8", "replace")


# --- k3s-faithful lookups --------------------------------------------------------------------------

def _stat_era_find(fs, dirs, binary):
    """fs.Stat per fixed dir: follows symlinks, skips directories, ignores the exec bit."""
    for directory in dirs:
        path = posixpath.join(directory, binary)
        st = fs.stat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return path
    return None


_FOLDERS = {}


def _folder(cwd, directory):
    key = (cwd, directory)
    if key not in _FOLDERS:
        _FOLDERS[key] = posixpath.normpath(posixpath.join(cwd, directory or "."))
    return _FOLDERS[key]


def _lookpath(fs, path_entries, binary, cwd="/"):
    """Go exec.LookPath as root: first PATH dir holding an executable non-directory wins.

    The recorded path is dir + name, cleaned, symlinks not resolved. A match in a relative entry
    (the empty entry means ".") returns exec.ErrDot at once, which k3s treats as not found, so
    the search stops there. systemd starts services in "/".
    """
    for directory in path_entries:
        folder = _folder(cwd, directory)
        if binary not in fs.names(folder):
            continue  # one listing per directory instead of a stat per PATH entry and binary
        path = posixpath.join(folder, binary)
        st = fs.stat(path)
        # root's faccessat(X_OK) succeeds on a non-directory when any execute bit is set
        if st is not None and not stat.S_ISDIR(st.st_mode) and st.st_mode & 0o111:
            if not directory.startswith("/"):
                return None
            return posixpath.normpath(posixpath.join(directory, binary))
    return None


def k3s_search_path(profile, service_path):
    """The PATH k3s searches in this release's lookpath era (list of dirs)."""
    if profile["detection"] == "lookpath-fixed":
        return list(distro.LOOKPATH_FIXED_PATH)
    return list(distro.LOOKPATH_PREFIX) + service_path.split(":")


def k3s_detected_runtimes(fs, profile, service_path):
    """What this k3s/rke2 release will render itself: [{name, binary, runtime_type}] sorted by name."""
    found = []
    search_path = None if profile["detection"] == "stat" else k3s_search_path(profile, service_path)
    for runtime in profile["detected_runtimes"]:
        if search_path is None:
            path = _stat_era_find(fs, distro.STAT_ERA_DIRS[runtime["group"]], runtime["binary"])
        else:
            path = _lookpath(fs, search_path, runtime["binary"])
        if path:
            found.append({"name": runtime["name"], "binary": path, "runtime_type": runtime["runtime_type"]})
    return sorted(found, key=lambda item: item["name"])


def available_nvidia_runtimes(fs, k3s_found, service_path, toolkit_dirs):
    """Every NVIDIA runtime binary on the node, whether k3s looks for it or not.

    A runtime k3s detects keeps k3s's path; the others are searched in the GPU Operator dir,
    the user's toolkit dirs, then the service PATH, with LookPath rules.
    """
    by_name = dict((item["name"], item) for item in k3s_found)
    search = [d for d in [distro.GPU_OPERATOR_TOOLKIT_DIR] + list(toolkit_dirs) + service_path.split(":") if d.startswith("/")]
    result = []
    for name, binary in distro.NVIDIA_RUNTIMES:
        if name in by_name:
            result.append({"name": name, "binary": by_name[name]["binary"], "source": "k3s",
                           "runtime_type": distro.RUNC_V2, "owner": owner_of(by_name[name]["binary"])})
            continue
        path = _lookpath(fs, search, binary)
        if path:
            result.append({"name": name, "binary": path, "source": _source_of(path, toolkit_dirs),
                           "runtime_type": distro.RUNC_V2, "owner": owner_of(path)})
    return result


def _source_of(path, toolkit_dirs):
    directory = posixpath.dirname(path)
    if directory == distro.GPU_OPERATOR_TOOLKIT_DIR:
        return "gpu-operator"
    if directory in toolkit_dirs:
        return "toolkit_dirs"
    return "path"


def owner_of(binary):
    """Which layout a runtime binary belongs to: the GPU Operator's toolkit dir, or the host's own."""
    return distro.OWNER_GPU_OPERATOR if posixpath.dirname(binary) == distro.GPU_OPERATOR_TOOLKIT_DIR else distro.OWNER_HOST


def host_toolkit_facts(fs, service_path, toolkit_dirs):
    """NVIDIA runtime binaries installed on the host itself (packages, a custom dir), outside the operator's dir.

    k3s searches the operator's dir first, so a host toolkit next to the operator's is masked rather
    than replaced; this finds it anyway (two toolkits on one node is what the roles refuse).
    """
    search = [d for d in list(toolkit_dirs) + service_path.split(":")
              if d.startswith("/") and d != distro.GPU_OPERATOR_TOOLKIT_DIR]
    binaries = []
    for _name, binary in distro.NVIDIA_RUNTIMES:
        path = _lookpath(fs, search, binary)
        if path:
            binaries.append(path)
    return {"present": bool(binaries), "runtime_binaries": binaries}


# --- service environment ---------------------------------------------------------------------------

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_env_file(text, env):
    """systemd EnvironmentFile= semantics: KEY=VALUE, quotes, comments; NO $VAR expansion.

    systemd stores values verbatim (src/basic/env-file.c), so `PATH=$PATH:/opt/x` sets PATH to that
    literal string: the default dirs are gone and `$PATH` is a relative entry.
    """
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        match = _ENV_LINE.match(line)
        if match:
            env[match.group(1)] = unquote(match.group(2))


def _unit_directives(fs, unit, unit_dirs):
    """(unit file path, [(directive, value)]) of a unit plus its drop-ins, in systemd's order."""
    unit_file = None
    for directory in unit_dirs:
        candidate = "%s/%s.service" % (directory, unit)
        if fs.is_file(candidate):
            unit_file = candidate
            break
    if unit_file is None:
        return None, []
    files = [unit_file]
    dropins = {}
    for directory in unit_dirs:
        dropin_dir = "%s/%s.service.d" % (directory, unit)
        for name in fs.listdir(dropin_dir):
            if name.endswith(".conf") and name not in dropins:
                dropins[name] = dropin_dir + "/" + name
    files.extend(dropins[name] for name in sorted(dropins))
    directives = []
    for path in files:
        section = None
        # systemd joins a line ending in a backslash with the next one
        text = re.sub(r"\\\n", " ", fs.read_text(path) or "")
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
                key, value = line.split("=", 1)
                directives.append((key.strip(), value.strip()))
    return unit_file, directives


def service_environment(fs, distribution, unit):
    """PATH (and env) the k3s/rke2 service runs with, from its unit, drop-ins and env files."""
    spec = distro.DISTRIBUTION_PATHS[distribution]
    env = {"PATH": distro.SYSTEMD_DEFAULT_PATH}
    unit_file, directives = _unit_directives(fs, unit, spec["unit_dirs"])
    sources = []
    if unit_file is None:
        # no unit here (image build, sandbox): the env files k3s/rke2 installers use
        directives = [("EnvironmentFile", "-" + p.format(unit=unit)) for p in spec["env_files"]]
    for key, value in directives:
        if key == "Environment":
            for assignment in _split_environment(value):
                name, _sep, val = assignment.partition("=")
                env[name] = val
        elif key == "EnvironmentFile":
            path = value.lstrip("-").replace("%N", unit).replace("%n", unit + ".service")
            text = fs.read_text(path)
            if text is not None:
                sources.append(path)
                parse_env_file(text, env)
    exec_start = " ".join(v for k, v in directives if k == "ExecStart")
    # what the service really gets: systemd substitutes $VAR and ${VAR} from Environment= and
    # EnvironmentFile= in ExecStart (kept out of the facts: env files hold tokens)
    return {"unit_file": unit_file, "env_files": sources, "path": env["PATH"],
            "exec_start": exec_start, "exec_start_expanded": _expand_variables(exec_start, env)}


_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand_variables(command_line, env):
    def value(match):
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1) or match.group(2), "")
    return _VARIABLE.sub(value, command_line)


def cli_flag_value(command_line, flag):
    """Value of `--flag value` / `--flag=value` on a unit's ExecStart (the last one wins)."""
    value = None
    tokens = [unquote(t) for t in re.findall(r'"[^"]*"|\'[^\']*\'|\S+', command_line)]
    for index, token in enumerate(tokens):
        if token == flag and index + 1 < len(tokens):
            value = tokens[index + 1]
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def _split_environment(value):
    out = []
    for token in re.findall(r'"[^"]*"|\'[^\']*\'|\S+', value):
        token = unquote(token)
        if "=" in token:
            out.append(token)
    return out


# --- distribution and release ---------------------------------------------------------------------

def find_units(fs, distribution):
    spec = distro.DISTRIBUTION_PATHS[distribution]
    units = []
    for unit in spec["units"]:
        for directory in spec["unit_dirs"]:
            if fs.is_file("%s/%s.service" % (directory, unit)):
                units.append(unit)
                break
    return units


def find_binary(fs, distribution):
    for path in distro.DISTRIBUTION_PATHS[distribution]["binaries"]:
        if fs.is_file(path):
            return path
    return None


def guess_distribution(fs, data_dir=None):
    """k3s, rke2 or containerd, from binaries, units and data dirs; None if nothing is there."""
    found = []
    for distribution in (distro.K3S, distro.RKE2):
        paths = distro.distribution_paths(distribution, data_dir if data_dir else None)
        installed = find_binary(fs, distribution) or find_units(fs, distribution)
        if installed or fs.is_dir(paths["data_dir"] + "/agent"):
            found.append(distribution)
    if len(found) == 1:
        return found[0], found
    if found:
        return None, found
    if find_binary(fs, distro.CONTAINERD) or fs.is_file(distro.DISTRIBUTION_PATHS[distro.CONTAINERD]["config"]):
        return distro.CONTAINERD, [distro.CONTAINERD]
    return None, []


_VERSION_OUTPUT = {
    distro.K3S: re.compile(r"k3s version (v\S+)"),
    distro.RKE2: re.compile(r"rke2 version (v\S+)"),
    distro.CONTAINERD: re.compile(r"containerd\s+\S+\s+v?(\d+\.\d+\.\d+\S*)"),
}


def parse_version_output(distribution, output):
    match = _VERSION_OUTPUT[distribution].search(output or "")
    return match.group(1) if match else None


# --- YAML scalars from config.yaml (no YAML library on nodes) -------------------------------------

def yaml_top_level_scalar(text, key):
    """Value of a top-level `key: value` scalar in a simple YAML file, else None."""
    pattern = re.compile(r"^%s\s*:\s*(.*?)\s*$" % re.escape(key))
    value = None
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            raw = match.group(1)
            if raw[:1] in ("'", '"'):
                end = raw.find(raw[0], 1)
                raw = raw[1:end] if end > 0 else raw[1:]
            else:
                raw = raw.split(" #", 1)[0].strip()
            value = raw
    return value


def yaml_top_level_list(text, key):
    """[(operator, [items])] for each top-level `key:` / `key+:` in a simple YAML file, in order.

    Values: a flow list `[a, b]`, a block list of `- a` lines, or a scalar; k3s hands a scalar to
    its string-slice flag, which splits it on commas, so a scalar counts as comma-separated items.
    """
    pattern = re.compile(r"^%s(\+?)\s*:\s*(.*?)\s*$" % re.escape(key))
    found, current = [], None
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            raw = match.group(2).split(" #", 1)[0].strip() if not match.group(2).startswith(("'", '"')) else match.group(2)
            if raw.startswith("[") and raw.endswith("]"):
                items = [unquote(i) for i in raw[1:-1].split(",") if i.strip()]
            elif raw:
                items = [i.strip() for i in unquote(raw).split(",") if i.strip()]
            else:
                items = []
            current = (match.group(1) or "=", items)
            found.append(current)
            continue
        if current is not None and re.match(r"^\s*-\s+", line):
            current[1].append(unquote(re.sub(r"^\s*-\s+", "", line).split(" #", 1)[0]))
            continue
        if line.strip() and not line.startswith((" ", "\t", "#")):
            current = None
    return found


def k3s_config_paths(fs, paths):
    """config.yaml, then config.yaml.d/*.yaml (and .yml) in name order: the files k3s/rke2 read, in their order."""
    return [paths["config_yaml"]] + [paths["config_yaml_d"] + "/" + name
                                     for name in fs.listdir(paths["config_yaml_d"]) if name.endswith((".yaml", ".yml"))]


# the texts of the config files handed to the controller, which parses them as YAML (plugin_utils/_k3s_config): the
# readers here follow the plain `key: value` lines only
K3S_CONFIG_MAX_BYTES = 1 << 20


def k3s_config_files(fs, paths):
    """[{path, text}] of the config files that exist, in k3s's order (text None for one too big to hand on)."""
    found = []
    for path in k3s_config_paths(fs, paths):
        text = fs.read_text(path)
        if text is not None:
            found.append({"path": path, "text": text if len(text) <= K3S_CONFIG_MAX_BYTES else None})
    return found


def k3s_config_list(fs, paths, key):
    """A list key (such as `disable`) as k3s merges it: config.yaml, then config.yaml.d/*.yaml in
    order; `key:` replaces what came before, `key+:` appends."""
    value = []
    for path in k3s_config_paths(fs, paths):
        text = fs.read_text(path)
        if text is None:
            continue
        for operator, items in yaml_top_level_list(text, key):
            value = value + items if operator == "+" else list(items)
    return value


def k3s_config_value(fs, paths, key):
    """A config.yaml key as k3s sees it: config.yaml, then config.yaml.d/*.yaml in order, last wins."""
    value, source = None, None
    for path in k3s_config_paths(fs, paths):
        text = fs.read_text(path)
        if text is None:
            continue
        found = yaml_top_level_scalar(text, key)
        if found is not None:
            value, source = found, path
    return value, source


# --- the runtime that runs the pods -----------------------------------------------------------------

def _socket_path(endpoint):
    """The socket path of a CRI endpoint (`unix:///run/x.sock` or `/run/x.sock`), /var/run read as /run."""
    value = endpoint.strip()
    if value.startswith("unix://"):
        value = value[len("unix://"):]
    if not value.startswith("/"):
        return None  # tcp://, npipe:// or a relative path: nothing this module can follow
    value = posixpath.normpath(value)
    return value[len("/var"):] if value.startswith("/var/run/") else value


def containerd_grpc_address(fs):
    """`[grpc] address` of the host's /etc/containerd/config.toml, else containerd's default socket."""
    text = fs.read_text(distro.DISTRIBUTION_PATHS[distro.CONTAINERD]["config"]) or ""
    section = None
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped.startswith("["):
            section = stripped.strip("[] ").replace('"', "").replace("'", "")
        elif section in distro.CONTAINERD_GRPC_TABLES:
            match = re.match(r"""address\s*=\s*["']([^"']*)["']""", stripped)
            if match:
                return _socket_path(match.group(1))
    return None


def _truthy(value):
    return value is not None and value.strip().lower() in ("true", "yes", "on", "1")


def runtime_in_use(fs, distribution, paths, exec_line, unit_file):
    """The runtime a k3s/rke2 node's pods run on, and the setting that says so.

    The last of config.yaml, config.yaml.d/*.yaml and the unit's ExecStart wins, as in k3s."""
    endpoint, source = k3s_config_value(fs, paths, "container-runtime-endpoint")
    flag = cli_flag_value(exec_line, "--container-runtime-endpoint")
    if flag is not None:
        endpoint, source = flag, unit_file
    docker, docker_source = False, None
    if distribution in distro.DOCKER_OPTION_DISTRIBUTIONS:
        value, docker_source = k3s_config_value(fs, paths, "docker")
        docker = _truthy(value)
        tokens = exec_line.split()
        if "--docker" in tokens or "--docker=true" in tokens:
            docker, docker_source = True, unit_file
        elif "--docker=false" in tokens:
            docker = False
    facts = {"distribution": distribution, "endpoint": endpoint or None, "source": source if endpoint else None,
             "docker": docker, "docker_source": docker_source if docker else None}
    if docker:
        facts["runtime"] = distro.RUNTIME_DOCKER
        return facts
    if not endpoint:
        facts["runtime"] = distro.RUNTIME_EMBEDDED
        return facts
    socket = _socket_path(endpoint)
    facts["runtime"] = distro.RUNTIME_UNKNOWN
    for runtime, sockets in distro.ENDPOINT_SOCKETS:
        if socket in sockets:
            facts["runtime"] = runtime
    if facts["runtime"] in (distro.RUNTIME_UNKNOWN, distro.RUNTIME_EMBEDDED) and socket is not None \
            and socket == containerd_grpc_address(fs):
        facts["runtime"] = distro.RUNTIME_HOST_CONTAINERD  # the host's containerd on its own address
    elif facts["runtime"] == distro.RUNTIME_EMBEDDED:
        # the embedded containerd is off as soon as an endpoint is set: nothing of k3s listens there
        facts["runtime"] = distro.RUNTIME_UNKNOWN
    return facts


def kubelet_facts(fs, data_dir=None):
    """The kubelet's `cgroupDriver` and the file that sets it (None, None when no file names one)."""
    files = [distro.KUBELET_CONFIG]
    if data_dir:
        directory = "%s/%s" % (data_dir.rstrip("/"), distro.KUBELET_DROPIN_DIR)
        files += ["%s/%s" % (directory, name) for name in sorted(fs.listdir(directory)) if name.endswith(".conf")]
    value, source = None, None
    for path in files:
        text = fs.read_text(path)
        found = yaml_top_level_scalar(text, "cgroupDriver") if text else None
        if found:
            value, source = found, path
    return {"cgroup_driver": value, "source": source}


def host_containerd_version(fs, run_command, root_is_host):
    """(version, source) of the host's containerd: its binary on a host root, else dpkg's record."""
    if root_is_host and run_command is not None and find_binary(fs, distro.CONTAINERD):
        try:
            return _release_of(fs, distro.CONTAINERD, None, run_command, root_is_host)
        except K3sGpuError:
            pass
    for package in distro.CONTAINERD_PACKAGES:
        version = dpkg_version(fs, package)
        if version:
            match = re.match(r"(?:\d+:)?(\d+\.\d+\.\d+)", version)
            if match:
                return match.group(1), "dpkg:" + package
    return None, None


# --- hardware, driver, CDI, toolkit, operator -------------------------------------------------------

_DRIVER_RE = re.compile(r"NVRM version:.*?Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def driver_devices(fs):
    """The NVIDIA device nodes under /dev, and those in its directories (/dev/nvidia-caps holds the MIG capability
    nodes), each by path: the directories themselves are no devices."""
    devices = []
    for path in ["/dev/" + name for name in fs.listdir("/dev") if name.startswith("nvidia")]:
        if fs.is_dir(path):
            devices.extend(path + "/" + name for name in fs.listdir(path))
        else:
            devices.append(path)
    return devices


def driver_facts(fs):
    text = fs.read_text("/proc/driver/nvidia/version", 65536)
    devices = driver_devices(fs)
    gpus = list(fs.listdir("/proc/driver/nvidia/gpus"))
    if not gpus:
        gpus = [d for d in devices if re.match(r"^/dev/nvidia\d+$", d)]
    facts = {"loaded": text is not None, "version": None, "open_kernel_module": None,
             "devices": devices, "gpu_count": len(gpus), "pci_gpus": pci_gpus(fs),
             "char_links": char_links(fs), "nvswitches": len(pci_devices(fs, NVSWITCH_PCI_CLASSES)),
             "dev_char_rule": file_facts(fs, distro.DEV_CHAR_RULE, True)}
    if text:
        match = _DRIVER_RE.search(text)
        facts["version"] = match.group(1) if match else None
        facts["open_kernel_module"] = "Open Kernel Module" in text
    return facts


NVIDIA_PCI_VENDOR = "0x10de"
# PCI classes of display controllers: VGA (0x0300xx) and 3D controllers (0x0302xx), as data-centre GPUs are
GPU_PCI_CLASSES = ("0x0300", "0x0302")


NVIDIA_CHAR_MAJOR = 195  # /dev/nvidia<N> and /dev/nvidiactl (the driver's fixed major)
# NVSwitch (class 0x0680xx, "other bridge"): HGX boards whose GPUs talk through it need the fabric manager running
NVSWITCH_PCI_CLASSES = ("0x0680",)


def pci_devices(fs, classes):
    """NVIDIA PCI devices of these class prefixes, driver loaded or not."""
    found = []
    for device in fs.listdir("/sys/bus/pci/devices"):
        base = "/sys/bus/pci/devices/" + device
        vendor = (fs.read_text(base + "/vendor", 64) or "").strip()
        device_class = (fs.read_text(base + "/class", 64) or "").strip()
        if vendor == NVIDIA_PCI_VENDOR and device_class.startswith(classes):
            found.append(device)
    return found


def pci_gpus(fs):
    """NVIDIA GPUs on the PCI bus, driver loaded or not (what a fresh node has before the driver)."""
    return pci_devices(fs, GPU_PCI_CLASSES)


def char_links(fs):
    """The NVIDIA device nodes that have a /dev/char/<major>:<minor> link: systemd finds a container's devices through
    them, and takes the GPUs from running containers at `systemctl daemon-reload` when they are missing (NVIDIA
    toolkit #1227; nvidia-ctk system create-dev-char-symlinks makes them)."""
    found = set()
    # only NVIDIA's character major (nvidiactl, nvidia<N>): /dev/char holds a link for every character device
    for name in [n for n in fs.names("/dev/char") if n.startswith("%d:" % NVIDIA_CHAR_MAJOR)]:
        target = fs.readlink("/dev/char/" + name)
        if target:
            path = posixpath.normpath(posixpath.join("/dev/char", target))
            if path.startswith("/dev/nvidia"):
                found.add(path)
    return sorted(found)


CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def cdi_facts(fs, driver=None):
    """CDI specs in containerd's spec dirs; each NVIDIA one says whether it fits the loaded driver.

    A spec generated by nvidia-ctk names the driver's libraries by version (libcuda.so.<version>) and
    lists one device per GPU, so `current` (that version named, as many numbered devices as GPUs) tells
    the role whether the spec must be generated again, without running nvidia-ctk on every run.
    """
    specs = []
    for directory in CDI_DIRS:
        for name in fs.listdir(directory):
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            path = directory + "/" + name
            data = fs.read_bytes(path, 4 * MAX_CONFIG_BYTES)
            if data is None:
                continue
            text = data.decode("utf-8", "replace")
            summary = _cdi_spec_summary(path, text)
            # what the gpu_node role generated (its marker line first), and the bytes' SHA-1 for a removal that
            # must not take a spec rewritten since it was read
            summary["generated_by_collection"] = text.startswith(distro.CDI_SPEC_MARKER)
            summary["sha1"] = hashlib.sha1(data).hexdigest()
            if summary["kind"] == "nvidia.com/gpu":
                version = (driver or {}).get("version")
                numbered = [d for d in summary["devices"] if d.isdigit()]
                summary["current"] = bool(version) and (".so." + version) in text and \
                    len(numbered) == (driver or {}).get("gpu_count")
            specs.append(summary)
    return {"spec_dirs": list(CDI_DIRS), "specs": specs,
            "nvidia_devices": sorted(set(d for s in specs if s["kind"] == "nvidia.com/gpu" for d in s["devices"]))}


def _cdi_spec_summary(path, text):
    kind, version, devices = None, None, []
    if path.endswith(".json"):
        try:
            data = json.loads(text)
            kind, version = data.get("kind"), data.get("cdiVersion")
            devices = [d.get("name") for d in data.get("devices", []) if isinstance(d, dict)]
        except (ValueError, AttributeError):
            pass
    else:
        kind = yaml_top_level_scalar(text, "kind")
        version = yaml_top_level_scalar(text, "cdiVersion")
        in_devices = False
        for line in text.splitlines():
            if re.match(r"^[^\s-]", line):
                in_devices = bool(re.match(r"^devices\s*:", line))
                continue
            match = re.match(r"^\s*-\s+name\s*:\s*['\"]?([^'\"\s]+)", line) if in_devices else None
            if match:
                devices.append(match.group(1))
    return {"path": path, "kind": kind, "cdi_version": version, "devices": devices}


def dpkg_version(fs, package):
    text = fs.read_text("/var/lib/dpkg/status", 64 * MAX_CONFIG_BYTES)
    if not text:
        return None
    for block in text.split("\n\n"):
        if re.search(r"^Package: %s$" % re.escape(package), block, re.M) and \
                re.search(r"^Status: .* installed$", block, re.M):
            match = re.search(r"^Version: (\S+)$", block, re.M)
            return match.group(1) if match else None
    return None


_CTK_VERSION = re.compile(r"version\s+(\d+\.\d+\.\d+\S*)")


def toolkit_facts(fs, run_command, root_is_host):
    version, source = dpkg_version(fs, "nvidia-container-toolkit-base") or dpkg_version(fs, "nvidia-container-toolkit"), "dpkg"
    ctk = None
    for directory in (distro.GPU_OPERATOR_TOOLKIT_DIR, "/usr/bin", "/usr/local/bin"):
        if fs.is_file(directory + "/nvidia-ctk"):
            ctk = directory + "/nvidia-ctk"
            break
    if version is None and ctk and root_is_host and run_command:
        rc, out, _err = run_command([ctk, "--version"])
        match = _CTK_VERSION.search(out or "") if rc == 0 else None
        version, source = (match.group(1), "nvidia-ctk") if match else (None, None)
    if version is None:
        source = None
    return {"version": version, "version_source": source, "nvidia_ctk": ctk, "cdi_refresh": cdi_refresh_facts(fs)}


UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")


def cdi_refresh_facts(fs):
    """The toolkit's nvidia-cdi-refresh path unit (packaged in /lib or /usr/lib/systemd/system from 1.18) and whether
    it is enabled: `systemctl enable` links it into multi-user.target.wants, which is read without systemd (sandbox)."""
    unit = next((d + "/" + distro.CDI_REFRESH_UNIT for d in UNIT_DIRS if fs.is_file(d + "/" + distro.CDI_REFRESH_UNIT)), None)
    wants = "/etc/systemd/system/multi-user.target.wants/" + distro.CDI_REFRESH_UNIT
    return {"unit": unit, "enabled": fs.lstat(wants) is not None}


def operator_facts(fs, runtimes):
    """The GPU Operator's layout, and which of the node's NVIDIA runtimes run its binaries."""
    toolkit_dir = distro.GPU_OPERATOR_TOOLKIT_DIR
    present = fs.is_dir(toolkit_dir)
    binaries = [name for name in fs.listdir(toolkit_dir) if name.startswith("nvidia-container-runtime")] if present else []
    return {
        "toolkit_dir": toolkit_dir,
        "present": present and bool(binaries),
        "runtime_binaries": sorted(binaries),
        "runtimes": [r["name"] for r in runtimes if r["owner"] == distro.OWNER_GPU_OPERATOR],
        "driver_container": fs.is_dir("/run/nvidia/driver/usr"),
    }


# --- files the plan reads -----------------------------------------------------------------------

def file_facts(fs, path, include_content, digest=False):
    """Type, mode and (optionally) text or SHA-256 of one node file; never follows the final symlink."""
    lst = fs.lstat(path)
    if lst is None:
        return {"path": path, "state": "absent", "parent_exists": fs.is_dir(posixpath.dirname(path))}
    if stat.S_ISLNK(lst.st_mode):
        return {"path": path, "state": "link"}
    if stat.S_ISDIR(lst.st_mode):
        return {"path": path, "state": "directory"}
    if not stat.S_ISREG(lst.st_mode):
        return {"path": path, "state": "other"}
    facts = {"path": path, "state": "file", "size": lst.st_size, "mode": "%04o" % stat.S_IMODE(lst.st_mode),
             "uid": lst.st_uid, "gid": lst.st_gid, "mtime": int(lst.st_mtime)}
    if lst.st_size > MAX_CONFIG_BYTES:
        facts["error"] = "too_large"
        return facts
    data = fs.read_bytes(path)
    if data is None:
        facts["error"] = "unreadable"
        return facts
    if digest:
        facts["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        facts["error"] = "not_utf8"
        facts["error_line"] = data[:exc.start].count(b"\n") + 1
        return facts
    facts["version_line"] = _toml_version(text)
    if include_content:
        facts["content"] = text
    return facts


def original_facts(fs, paths, keys):
    """<key>_orig and <key>_record: the bytes of a user's file before the collection's first edit, and the SHA-256 of
    the text the collection last left in it (distro.ORIGINAL_SUFFIX, distro.RECORD_SUFFIX), with their text."""
    found = {}
    for key in keys:
        found[key + "_orig"] = file_facts(fs, paths[key] + distro.ORIGINAL_SUFFIX, True)
        found[key + "_record"] = file_facts(fs, paths[key] + distro.RECORD_SUFFIX, True)
    return found


_VERSION_KEY = re.compile(r"^\s*version\s*=\s*(\d+)\s*(?:#.*)?$", re.M)


def _toml_version(text):
    match = _VERSION_KEY.search(text)
    return int(match.group(1)) if match else None


_TABLE_HEADER = re.compile(r"^\s*\[\s*(.+?)\s*\]\s*(?:#.*)?$")
_RUNTIME_IN_HEADER = re.compile(r"""\.\s*runtimes\s*\.\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_-]+))\s*(?:\.\s*options\s*)?$""")
_IMPORTS = re.compile(r"^\s*imports\s*=\s*\[(.*)\]", re.M)


def config_runtimes(fs, path):
    """Runtime handler names a containerd config declares as tables, following its `imports`.

    What a person checks by reading the generated config.toml: the [...runtimes.<name>] headers
    (stdlib only: nodes may lack tomllib). Returns (names, files read) or (None, []) if absent.
    """
    text = fs.read_text(path)
    if text is None:
        return None, []
    names, files = set(), [path]
    texts = [text]
    match = _IMPORTS.search(text)
    if match:
        for pattern in re.findall(r'"([^"]+)"|\'([^\']+)\'', match.group(1)):
            pattern = pattern[0] or pattern[1]
            directory, glob_name = posixpath.split(pattern)
            regex = re.compile("^" + re.escape(glob_name).replace("\\*", ".*") + "$")
            for name in fs.listdir(directory):
                if regex.match(name):
                    imported = fs.read_text(directory + "/" + name)
                    if imported is not None:
                        files.append(directory + "/" + name)
                        texts.append(imported)
    for content in texts:
        for line in content.splitlines():
            header = _TABLE_HEADER.match(line)
            runtime = _RUNTIME_IN_HEADER.search(header.group(1)) if header else None
            if runtime:
                names.add(runtime.group(1) or runtime.group(2) or runtime.group(3))
    return sorted(names), files


def systemd_running(fs):
    return fs.is_dir("/run/systemd/system")


def binary_facts(fs, path):
    """How a runtime binary a user named looks on the node."""
    if not path.startswith("/"):
        return {"path": path, "state": "relative"}
    st = fs.stat(path)
    if st is None:
        lst = fs.lstat(path)
        return {"path": path, "state": "dangling" if lst is not None else "absent"}
    if stat.S_ISDIR(st.st_mode):
        return {"path": path, "state": "directory"}
    return {"path": path, "state": "file", "executable": bool(st.st_mode & 0o111)}


# --- everything, in one read-only pass ---------------------------------------------------------

def _release_of(fs, distribution, release, run_command, root_is_host):
    if release:
        return release, "option"
    binary = find_binary(fs, distribution)
    if binary is None:
        raise K3sGpuError("no %s binary found (looked for %s)" % (
            distribution, ", ".join(distro.DISTRIBUTION_PATHS[distribution]["binaries"])), "set {release} (for example %s)" % (
            "v1.33.10+k3s1" if distribution == distro.K3S else
            "v1.33.10+rke2r1" if distribution == distro.RKE2 else "2.1.4"), "release")
    if not root_is_host or run_command is None:
        raise K3sGpuError("root is not /, so the %s binary is not run to ask its version" % distribution, "set {release}",
                          "release")
    rc, out, err = run_command([binary, "--version"])
    version = parse_version_output(distribution, out) if rc == 0 else None
    if not version:
        raise K3sGpuError("`%s --version` did not report a version (rc=%s: %s)" % (
            binary, rc, (err or out or "").strip()[:200]), "set {release}", "release")
    return version, binary


def gather(root="/", distribution="auto", release=None, data_dir=None, toolkit_dirs=(), binaries=(),
           path=None, run_command=None, newer_release=distro.NEWER_RELEASE_REFUSE):
    """All node facts the engine needs. Raises K3sGpuError.

    newer_release: what to do with a release of a line newer than the feature table (distro.profile).
    """
    fs = NodeFS(root)
    root_is_host = fs.root == "/"
    asked_for = distribution != "auto"
    if distribution == "auto":
        distribution = _found_distribution(fs, data_dir)
    release, release_source = _release_of(fs, distribution, release, run_command, root_is_host)
    profile = distro.profile(distribution, release, newer_release)
    if asked_for and distribution in (distro.K3S, distro.RKE2):
        _check_asked_distribution(fs, distribution, data_dir)
    paths = distro.distribution_paths(distribution, data_dir)
    facts = {"distribution": distribution, "release": profile["release"], "release_source": release_source,
             "root": fs.root, "profile": profile, "paths": paths, "known_bad_release": profile["known_bad"]}
    if distribution == distro.CONTAINERD:
        units = find_units(fs, distribution)
        service = _containerd_node_facts(fs, facts, paths)
    else:
        units = find_units(fs, distribution)
        service = service_environment(fs, distribution, units[0] if units else distro.DISTRIBUTION_PATHS[distribution]["units"][0])
        configured = None
        if data_dir is None:
            configured, _source = k3s_config_value(fs, paths, "data-dir")
            if configured:
                paths = distro.distribution_paths(distribution, configured)
                facts["paths"] = paths
        facts["files"] = dict((key, file_facts(fs, paths[key], True)) for key in (
            "template_v3", "template_v2", "dropin_v3", "dropin_v2", "default_runtime_file", "labels_file_legacy"))
        facts["files"].update(original_facts(fs, paths, ("template_v3", "template_v2")))
        facts["other_dropins"] = other_dropins(fs, [paths["dropin_dir_v3"], paths["dropin_dir_v2"]],
                                               paths["dropin_v3"], paths["dropin_v2"])
        exec_line = service.pop("exec_start_expanded")
        in_use = runtime_in_use(fs, distribution, paths, exec_line, service["unit_file"])
        in_use["release"] = profile["release"]
        # what this stdlib reader saw in config.yaml, and the files themselves: the controller reads them again as YAML
        k3s_config = {"files": k3s_config_files(fs, paths), "data_dir_given": data_dir is not None,
                      "read": {"data-dir": configured,
                               "container-runtime-endpoint": k3s_config_value(fs, paths, "container-runtime-endpoint")[0],
                               "docker": k3s_config_value(fs, paths, "docker")[0]}}
        if in_use["runtime"] == distro.RUNTIME_HOST_CONTAINERD:
            # k3s/rke2 run no containerd of their own: the node is the host's containerd, configured as such
            found = _host_containerd_facts(fs, in_use, paths["data_dir"], toolkit_dirs, binaries, path, run_command,
                                           newer_release)
            found["k3s_config"] = k3s_config
            return found
        facts["k3s_config"] = k3s_config
        facts["runtime_in_use"] = in_use
        _k3s_runtime_facts(fs, facts, service, exec_line)
        # the cluster step compares what it would write against their digests, and writes only what differs
        facts["manifests"] = dict((name, file_facts(fs, "%s/%s" % (paths["manifests_dir"], name), False, digest=True))
                                  for name in distro.COLLECTION_MANIFESTS)
    if path:
        facts["files"]["override"] = file_facts(fs, path, True)
    facts["units"] = units
    facts["service"] = service
    _add_node_facts(fs, facts, toolkit_dirs, binaries, run_command, root_is_host)
    # the gpu_node role's drop-in per k3s/rke2 unit that makes the device nodes before it starts (DRA nodes)
    facts["driver"]["device_nodes_dropins"] = [file_facts(fs, distro.DEVICE_NODES_DROPIN % unit, True) for unit in units]
    return facts


def _found_distribution(fs, data_dir):
    """The one distribution installed under the root (distribution=auto)."""
    distribution, found = guess_distribution(fs, data_dir)
    if distribution is None:
        if found:
            raise K3sGpuError("both %s are installed under %s" % (" and ".join(found), fs.root), "set {distribution}",
                              "distribution")
        raise K3sGpuError("neither k3s, rke2 nor containerd was found under %s" % fs.root,
                          "set {distribution} and {release}", ("distribution", "release"))
    return distribution


def _check_asked_distribution(fs, distribution, data_dir):
    _guessed, found = guess_distribution(fs, data_dir)
    if found and distribution not in found and distro.CONTAINERD not in found:
        # asked for rke2 on a k3s node (or the reverse): writing would create the other's trees for nothing
        raise K3sGpuError("%s was asked for, but the node under %s has %s (binary, unit or data directory) and no %s" % (
            distribution, fs.root, " and ".join(found), distribution), "set {distribution} to %s, or auto" % found[0],
            "distribution")


def _containerd_node_facts(fs, facts, paths):
    """The facts of a plain containerd node (files, drop-ins, kubelet, binary); its service."""
    facts["files"] = {"config": file_facts(fs, paths["config"], True),
                      "dropin": file_facts(fs, paths["dropin"], True)}
    facts["files"].update(original_facts(fs, paths, ("config",)))
    facts["other_dropins"] = other_dropins(fs, [paths["dropin_dir"]], paths["dropin"])
    facts["release_runtimes"] = []
    facts["default_runtime"] = {"value": None, "source": None}
    facts["disabled_components"] = []
    facts["runtimeclasses_disabled"] = False
    facts["runtime_in_use"] = {"runtime": distro.RUNTIME_HOST_CONTAINERD, "distribution": None, "release": None,
                               "endpoint": None, "source": None, "docker": False, "docker_source": None}
    facts["kubelet"] = kubelet_facts(fs)
    facts["containerd_binary"] = find_binary(fs, facts["distribution"])
    facts["manifests"] = {}  # no k3s/rke2 server: nothing deploys manifests
    return {"unit_file": None, "env_files": [], "path": distro.SYSTEMD_DEFAULT_PATH}


def _k3s_runtime_facts(fs, facts, service, exec_line):
    """What a k3s/rke2 node's own containerd runs with: its generated config, the runtimes the release
    detects, the default runtime, the disabled components."""
    paths, profile, distribution = facts["paths"], facts["profile"], facts["distribution"]
    facts["files"]["generated_config"] = file_facts(fs, paths["config"], False)
    facts["release_runtimes"] = k3s_detected_runtimes(fs, profile, service["path"])
    value, source = k3s_config_value(fs, paths, "default-runtime")
    # a flag on ExecStart comes after the config file's flags, so it wins
    flag = cli_flag_value(exec_line, "--default-runtime")
    if flag is not None:
        value, source = flag, service["unit_file"]
    facts["default_runtime"] = {"value": value, "source": source}
    # a server with `disable: [runtimes]` (k3s) or `[rke2-runtimeclasses]` (rke2) ships no RuntimeClasses
    disabled = k3s_config_list(fs, paths, "disable")
    facts["disabled_components"] = disabled
    facts["runtimeclasses_disabled"] = distro.RUNTIMECLASS_SOURCES[distribution]["disable"] in disabled


def _add_node_facts(fs, facts, toolkit_dirs, binaries, run_command, root_is_host):
    """The facts every node has whatever runs its containerd: runtimes, driver, CDI, toolkit, the loaded config."""
    service, paths = facts["service"], facts["paths"]
    facts["runtimes"] = available_nvidia_runtimes(fs, [r for r in facts["release_runtimes"] if r["name"].startswith("nvidia")],
                                                  service["path"], list(toolkit_dirs))
    facts["binaries"] = dict((b, binary_facts(fs, b)) for b in binaries)
    facts["systemd"] = systemd_running(fs)
    # k3s gives SystemdCgroup = true to its runtimes when systemd runs it (kubelet cgroup driver)
    facts["systemd_cgroup"] = facts["systemd"]
    facts["driver"] = driver_facts(fs)
    facts["cdi"] = cdi_facts(fs, facts["driver"])
    facts["toolkit"] = toolkit_facts(fs, run_command, root_is_host)
    facts["gpu_operator"] = operator_facts(fs, facts["runtimes"])
    facts["host_toolkit"] = host_toolkit_facts(fs, service["path"], list(toolkit_dirs))
    names, read = config_runtimes(fs, paths["config"])
    facts["loaded_config"] = {"path": paths["config"], "exists": names is not None, "runtimes": names or [],
                              "files": read}


def _host_containerd_facts(fs, in_use, data_dir, toolkit_dirs, binaries, path, run_command, newer_release):
    version, source = host_containerd_version(fs, run_command, fs.root == "/")
    if version is None:
        raise K3sGpuError(
            "%s %s on this node runs its pods on the host's containerd (container-runtime-endpoint %s in %s), and "
            "that containerd's version cannot be read here (no containerd binary to ask under root /, no dpkg "
            "record of %s)" % (in_use["distribution"], in_use["release"], in_use["endpoint"], in_use["source"],
                               " or ".join(distro.CONTAINERD_PACKAGES)),
            "set {distribution}: containerd and {release}: <its version, such as 2.1.4>", ("distribution", "release"))
    facts = gather(fs.root, distro.CONTAINERD, version, None, toolkit_dirs, binaries, path, run_command, newer_release)
    facts["release_source"] = source
    facts["runtime_in_use"] = in_use
    facts["kubelet"] = kubelet_facts(fs, data_dir)  # k3s's kubelet: its own drop-ins too
    return facts


def other_dropins(fs, directories, *ours):
    """The drop-ins beside ours (*.toml of each directory, in containerd's import order), with their text: a default
    runtime one of them names is where a runtime this collection adds takes its settings from."""
    found = []
    for directory in directories:
        for name in sorted(fs.listdir(directory)):
            path = "%s/%s" % (directory, name)
            if name.endswith(".toml") and path not in ours:
                found.append(file_facts(fs, path, True))
    return found


def strip_content(facts):
    """The facts without file texts (what runtime_info returns unless asked for them)."""
    files = {}
    for key, info in facts["files"].items():
        files[key] = dict((k, v) for k, v in info.items() if k != "content")
    result = dict(facts)
    result["files"] = files
    if "other_dropins" in facts:
        result["other_dropins"] = [dict((k, v) for k, v in info.items() if k != "content") for info in facts["other_dropins"]]
    return result
