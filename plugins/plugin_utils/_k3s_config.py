# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s/rke2's config.yaml and config.yaml.d/*.yaml read as YAML, on the controller (PyYAML, Ansible's own dependency).

The node side stays stdlib: its reader (module_utils/_detect) follows plain `key: value` lines and lists, and hands
the files' texts on (the reading's `k3s_config`). Here they are parsed as YAML and merged as k3s merges them (the files
in order, the last value of a key wins, `key+:` appends to a list), then:
- `default-runtime` and `disable` (the keys the engine plans with) replace what the node's reader saw;
- `data-dir`, `container-runtime-endpoint` and `docker` decided what the node read in the first place (which data dir,
  which containerd): where YAML's reading differs from the node reader's, the node is refused by name, with the fix,
  never planned on a wrong reading.
A file that is not valid YAML, or whose document is not a mapping, is refused with its path and line (k3s would not start
with it either).

PRIVATE to the collection."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# keys whose value is a list (k3s's string-slice flags among those read here)
LIST_KEYS = ("disable", "kubelet-arg")
# kubelet's own root dir, where k3s/rke2 start it without --root-dir (a DRA driver registers below it)
KUBELET_ROOT_DIR = "/var/lib/kubelet"


def _text(value: Any) -> str:
    """A flag's value as k3s hands it to its flag parser: YAML's booleans as true/false, numbers as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _items(value: Any) -> List[str]:
    """A string-slice flag's items: a list's items, or a scalar; each split on commas as the flag parser does."""
    found = []
    for item in value if isinstance(value, list) else [value]:
        found += [part.strip() for part in _text(item).split(",") if part.strip()]
    return found


def parse(path: str, text: str) -> Dict[str, Any]:
    """The mapping of one config file; raises K3sGpuError naming the file and line when it is not one."""
    try:
        document = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506  # a safe loader, libyaml's where there is one
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = "%s, line %d" % (path, mark.line + 1) if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise K3sGpuError("%s is not valid YAML: %s; k3s/rke2 refuse to start with it" % (where, problem),
                          fix="correct the file (or remove it); nothing was changed") from exc
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise K3sGpuError("%s holds a YAML %s, not a mapping of settings; k3s/rke2 refuse to start with it"
                          % (path, type(document).__name__), fix="write it as `key: value` lines; nothing was changed")
    return dict((str(key), value) for key, value in document.items())


def merged(files: List[Mapping[str, Any]]) -> Dict[str, Tuple[Any, str]]:
    """{key: (value, the file that set it last)} of the files in order; list keys merged (`key+:` appends)."""
    values: Dict[str, Tuple[Any, str]] = {}
    for entry in files:
        if entry.get("text") is None:
            raise K3sGpuError("%s is larger than this collection reads (1 MiB)" % entry.get("path"),
                              fix="k3s/rke2 config files are a few lines: look at what wrote it; nothing was changed")
        for key, value in parse(entry["path"], entry["text"]).items():
            base = key[:-1] if key.endswith("+") else key
            if base in LIST_KEYS:
                earlier = values.get(base, ([], None))[0] if key.endswith("+") else []
                values[base] = (earlier + _items(value), entry["path"])
            else:
                values[base] = (value, entry["path"])
    return values


# the keys that decided what the node was read as, and the fix when YAML reads them otherwise than the node's reader
DECIDING_KEYS = {
    "data-dir": "set gpu_node_data_dir (containerd_runtimes: data_dir) to the data dir, or write `data-dir: <path>` on a "
                "line of its own",
    "container-runtime-endpoint": "write `container-runtime-endpoint: <socket>` on a line of its own, or remove the key",
    "docker": "write `docker: true` or `docker: false` on a line of its own",
}
TRUE = ("true", "yes", "on", "1")


def _same(key: str, yaml_value: Optional[str], node_value: Optional[str]) -> bool:
    if key == "docker":
        return ((yaml_value or "").strip().lower() in TRUE) == ((node_value or "").strip().lower() in TRUE)
    return (yaml_value or None) == ((node_value or "").strip() or None)


def apply(reading: Dict[str, Any]) -> Dict[str, Any]:
    """The reading with config.yaml's keys as YAML reads them (changed in place and returned); a reading without
    the files (a plain containerd node, an older reading) is returned as it is. Raises K3sGpuError."""
    config = reading.get("k3s_config")
    if not isinstance(config, Mapping) or not isinstance(config.get("files"), list):
        return reading
    values = merged(config["files"])

    def value(key):
        found = values.get(key)
        return (_text(found[0]).strip() or None, found[1]) if found else (None, None)

    read = config.get("read") or {}
    for key, fix in DECIDING_KEYS.items():
        if key == "data-dir" and config.get("data_dir_given"):
            continue  # the data dir was given: config.yaml's decides nothing
        found, source = value(key)
        if not _same(key, found, read.get(key)):
            where = source or (config["files"][-1]["path"] if config["files"] else "config.yaml")
            raise K3sGpuError(
                "%s: `%s` reads as %s by YAML's rules but as %s by the node's line reader (a form it does not follow: a "
                "quoted key, a flow mapping, an anchor or a block scalar), and it decides how the node is read"
                % (where, key, repr(found) if found else "unset", repr(read.get(key)) if read.get(key) else "unset"),
                fix=fix + "; nothing was changed")
    distribution = reading.get("distribution")
    if distribution not in distro.RUNTIMECLASS_SOURCES:
        # k3s/rke2 on the host's containerd: the reading is that containerd's, whose own config sets its default
        # runtime; config.yaml decided only the keys checked above
        return reading
    unit = (reading.get("service") or {}).get("unit_file")
    default = reading.get("default_runtime")
    if isinstance(default, dict) and not (unit and default.get("source") == unit):
        runtime, source = value("default-runtime")  # a flag on the unit's ExecStart wins over the files
        reading["default_runtime"] = {"value": runtime, "source": source if runtime else None}
    reading["kubelet_root_dir"] = kubelet_root_dir(values, reading)
    disabled = list(values.get("disable", ([], None))[0])
    reading["disabled_components"] = disabled
    reading["runtimeclasses_disabled"] = distro.RUNTIMECLASS_SOURCES[distribution]["disable"] in disabled
    return reading


def kubelet_root_dir(values: Mapping[str, Tuple[Any, str]], reading: Mapping[str, Any]) -> str:
    """kubelet's root dir as k3s/rke2 start it: `kubelet-arg: root-dir=<dir>` (the last one wins, as kubelet's flag
    parser takes it), else <data-dir>/agent/kubelet for rootless k3s (pkg/daemons/agent), else kubelet's default."""
    found = None
    for item in values.get("kubelet-arg", ([], None))[0]:
        name, _sep, setting = item.lstrip("-").partition("=")
        if name == "root-dir" and setting.strip():
            found = setting.strip()
    if found:
        return found
    rootless = values.get("rootless")
    if rootless and _text(rootless[0]).strip().lower() in TRUE:
        return "%s/agent/kubelet" % ((reading.get("paths") or {}).get("data_dir") or "/var/lib/rancher/k3s")
    return KUBELET_ROOT_DIR
