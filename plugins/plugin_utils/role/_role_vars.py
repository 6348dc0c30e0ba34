# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's variables as its argument spec converts them, for the role's action plugins.

Ansible checks a role's variables against meta/argument_specs.yml but hands the role the raw values: `-e
gpu_node_force=false` and `gpu_node_toolkit_install=false` under an INI `[group:vars]` arrive as the text
"false", which Jinja finds truthy. The role's decisions read the converted values from here instead, and
a misspelled `gpu_node_*` variable draws a warning naming the closest known one.

meta/argument_specs.yml is the only place the role's defaults are declared (defaults/main.yml declares none of
them): a variable the user did not set gets its default here, when the spec is applied. What the user set is checked
here once, before anything is decided (_role_var_checks): a text variable (type str or path) takes only a text
(`gpu_node_default_runtime: false` is refused, not taken as the runtime "False"), a node path is absolute, a runtime
entry is a runtime's settings; each refusal names the variable, shows the value cut (never a no_log one) and the fix.

PRIVATE to the collection."""

from __future__ import annotations

import difflib
import os

from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Sequence

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import BOOLEANS, boolean

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_var_checks as checks

# the collection's root: plugins/plugin_utils/role/../../..
_COLLECTION = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, os.pardir, os.pardir))
SPEC_FILE = os.path.join(_COLLECTION, "roles", "gpu_node", "meta", "argument_specs.yml")
PREFIX = "gpu_node_"
# what the role sets itself (facts of its results), never a setting
ROLE_FACTS = ("gpu_node_result", "gpu_node_reboot_required")
_SPEC_KEYS = ("type", "elements", "default", "choices", "options", "required", "aliases", "no_log")
_SPECS = {}
# The release other inventories ask for (k3s-ansible, rke2-ansible, lablabs.rke2), read when gpu_node_release or
# gpu_node_target_release is empty (reference facts-2026-12: inventories)
INVENTORY_RELEASES = (("k3s_version", distro.K3S), ("rke2_install_version", distro.RKE2), ("rke2_version", distro.RKE2))


def live(root):
    """Whether gpu_node_root is the node's own / (restarts and package installs happen), not a sandbox tree."""
    return root in ("/", "")


def _argument_spec(options):
    spec = {}
    for name, option in options.items():
        entry = dict((k, v) for k, v in option.items() if k in _SPEC_KEYS)
        if isinstance(entry.get("options"), dict):
            entry["options"] = _argument_spec(entry["options"])
        spec[name] = entry
    return spec


def _load():
    if not _SPECS:
        with open(SPEC_FILE, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 10x faster
        for name, entry in data["argument_specs"].items():
            _SPECS[name] = _argument_spec(entry.get("options") or {})
            if "gpu_node_runtimes" in _SPECS[name]:
                # the role hands gpu_node_runtimes to containerd_runtimes' runtimes: each entry is checked by that spec,
                # the one place its keys and defaults are declared, and refused under the role's variable name
                _SPECS[name]["gpu_node_runtimes"]["options"] = specs.RUNTIME_SPEC
    return _SPECS


# Read when the controller imports the role's action plugins (the strategy does, before it forks a worker per host and
# task), so that every worker inherits the specs instead of parsing the file again.
_load()


def registered(hostvars, host):
    """The variables of another host as they are stored, for reading what a task registered there in this run
    (gpu_node_result, the cluster step's results). hostvars[host][name] runs the whole value through the templating
    engine, which for a host step's result took about 2 ms a host (most of the fleet summary's time at 100 hosts); a
    registered task result is data that is never templated anyway. The inventory's variables of that host are read
    through hostvars[host], which templates them in that host's context."""
    if host not in hostvars:
        return {}
    raw_get = getattr(hostvars, "raw_get", None)
    found = raw_get(host) if raw_get is not None else hostvars[host]
    return found if isinstance(found, Mapping) else {}


def release_to_read(distribution, release, task_vars, template):
    """(distribution, release, the inventory variable it came from or None) the node is read for: gpu_node_release
    when set, else the release the inventory asks for when its distribution fits gpu_node_distribution."""
    if not release:
        found = inventory_release(task_vars, template)
        if found and distribution in ("auto", found[2]):
            return found[2], found[1], found[0]
    return distribution, release, None


def inventory_release(task_vars, template):
    """(variable, release, distribution) of the first of INVENTORY_RELEASES the inventory sets, else None."""
    for name, distribution in INVENTORY_RELEASES:
        value = template(task_vars[name]) if name in task_vars else None
        if isinstance(value, str) and value.strip():
            return name, value.strip(), distribution
    return None


def role_spec(entry_point="main"):
    """{variable: argument spec} of an entry point of the role (read once per controller process)."""
    return _load()[entry_point]


def read(task_vars: Mapping[str, Any], template: Callable[[Any], Any], names: Optional[Sequence[str]] = None,
         entry_point: str = "main", where: Optional[str] = None) -> Dict[str, Any]:
    """The role variables `names` (default every variable of the entry point, which the role then need not have
    Ansible validate in a task of its own), templated (`template(value)`) and converted by the entry point's spec.

    A variable the user did not set gets the spec's default; gpu_node_target_release, when empty, the release the
    inventory asks for (INVENTORY_RELEASES). Returns {name without the gpu_node_ prefix: value}. Raises K3sGpuError,
    its cause prefixed with `where` (the host whose variables they are) where given."""
    spec = role_spec(entry_point)
    names = list(spec) if names is None else names
    wanted = dict((name, spec[name]) for name in names)
    values = dict((name, checks.as_given(wanted[name], template(task_vars[name]))) for name in names if name in task_vars)
    # the user's values only (a default is right by construction); every refusal at once, in the spec's order
    refused = dict((name, checks.before_conversion(name, wanted[name], value)) for name, value in values.items())
    values = dict((name, value) for name, value in values.items() if not refused[name])
    if "gpu_node_operator_driver" in values and str(values["gpu_node_operator_driver"]).lower() in BOOLEANS:
        values["gpu_node_operator_driver"] = boolean(values["gpu_node_operator_driver"])  # auto, or a bool as text
    validated = ArgumentSpecValidator(wanted).validate(values)
    converted = validated.validated_parameters
    for name in values if not validated.error_messages else ():  # a value the spec refused is not converted
        refused[name] = checks.after_conversion(name, wanted[name], converted[name])
    _refuse([refused.get(name) for name in names] + validated.error_messages, where)
    settings = dict((name[len(PREFIX):], value) for name, value in converted.items())
    if "target_release" in settings and not settings["target_release"]:
        found = inventory_release(task_vars, template)
        settings["target_release"] = found[1] if found else ""
    return settings


def _refuse(messages, where=None):
    """One K3sGpuError for the refusals among messages (None where a variable is fine), each naming its variable."""
    refused = "; ".join(message for message in messages if message)
    if refused:
        raise K3sGpuError(refused if where is None else "%s: %s" % (where, refused))


def unknown_variables(task_vars):
    """A warning for each gpu_node_* variable the role does not know (in any entry point), with the closest known name."""
    known = set(ROLE_FACTS)
    for spec in _load().values():
        known |= set(spec)
    warnings = []
    for name in sorted(task_vars):
        if not name.startswith(PREFIX) or name.startswith(PREFIX + "_") or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        warnings.append("%s is not a variable of the k3s_gpu.nvidia.gpu_node role and is ignored%s" % (
            name, "; did you mean %s?" % close[0] if close else ""))
    return warnings
