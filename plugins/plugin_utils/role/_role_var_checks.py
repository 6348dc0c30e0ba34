# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's variables checked once, when they are read, before anything is decided: a bad value is refused
by name in one short line - the variable (a runtime entry's key as gpu_node_runtimes[2].name), the value cut when it is
long and never one of a no_log variable, and the fix.

before_conversion() takes what the argument spec would refuse in its own words (Ansible's type names, the whole value)
or take silently (a list entry that is a dictionary, read as its text); after_conversion() what the spec cannot say (an
absolute path, a runtime's name, an environment variable's name). Where the spec converts a text (-e gpu_node_force=no,
-e gpu_node_toolkit_dirs=/opt/a,/opt/b, a key=value text for a dictionary), the value is checked as it converts.

PRIVATE to the collection."""

from __future__ import annotations

import re

from collections.abc import Mapping

from ansible.module_utils.common.validation import check_type_dict, check_type_list
from ansible.module_utils.parsing.convert_bool import BOOLEANS

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, shown
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout

# how a no_log variable's value is written in a refusal: not at all
HIDDEN = "its value (not shown)"
# the fix for a text variable that got something else, where "a text" alone does not say what to write
TEXT_HINTS = {
    "gpu_node_default_runtime": 'set a runtime name such as nvidia, or "" for none',
    "gpu_node_device_plugin_runtime_class": 'set a RuntimeClass name such as nvidia, or "" for the collection\'s choice',
    "gpu_node_target_release": 'set a k3s or rke2 release such as v1.35.3+k3s1, or "" for the one the inventory asks for',
    "gpu_node_release": 'set a release such as v1.35.3+k3s1, or "" to read it from the node',
}
# the node paths among the role's variables: (an example for the fix, whether "" is taken: the default's meaning)
NODE_PATHS = {
    "gpu_node_root": ("/srv/gpu-node for a sandbox tree, or / for the node itself", True),
    "gpu_node_data_dir": ('/var/lib/rancher/k3s, or "" for the data-dir of config.yaml', True),
    "gpu_node_cdi_spec_path": ("/var/run/cdi/nvidia.yaml (the default)", False),
    "gpu_node_toolkit_dirs": ("/opt/nvidia/bin", False),
}
# the handler's and the reboot's seconds: the least that works (a negative settle time raised after the restart, a
# zero timeout rolled a healthy start back) and at most a day (a larger one overflows time.sleep)
SECONDS = {"gpu_node_restart_settle_seconds": 0, "gpu_node_restart_timeout_seconds": 1,
           "gpu_node_driver_reboot_timeout_seconds": 1}
MOST_SECONDS = 86400
_WHOLE_NUMBER = re.compile(r"[-+]?[0-9]+\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXPECTED = {"bool": "a boolean", "int": "a whole number", "list": "a list", "dict": "a dictionary"}
_TYPE_FIXES = {"bool": "set true or false", "list": "set a list, or [] for none", "dict": "set a mapping, or {} for none"}


def kind(value):
    """What a value that is not a text is, in words (None for a text or an integer, whose digits read as a text)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a dictionary"
    return None


ROLLOUT_SECONDS = ("gpu_node_drain_timeout_seconds", "gpu_node_prove_timeout_seconds")


def _refusal(name, option, value, problem, fix):
    """One line: the variable, its value (cut; never a no_log variable's), what is wrong with it, the fix."""
    return "%s: %s %s; %s" % (name, HIDDEN if option.get("no_log") else shown(value), problem, fix)


def _not(value, expected):
    """"is a list, not a boolean" for a value of another kind, else "is not a boolean"."""
    found = kind(value)
    if found and found not in (expected, "a number"):  # 1.5 "is not a whole number"
        return "is %s, not %s" % (found, expected)
    return "is not %s" % expected


def as_given(option, value):
    """The value the spec is to convert: an empty text for a list or a dictionary is none (-e gpu_node_toolkit_dirs=),
    not [""]; a runtime's setting that is null is not set (its default)."""
    if option.get("type") in ("list", "dict") and isinstance(value, str) and not value.strip():
        return [] if option["type"] == "list" else {}
    if option.get("elements") == "dict" and isinstance(value, (list, tuple)):
        return [dict((k, v) for k, v in entry.items() if v is not None) if isinstance(entry, Mapping) else entry
                for entry in value]
    return value


def before_conversion(name, option, value):
    """The refusal of a value the option's spec cannot take as it is meant (None when it can)."""
    spec_type = option.get("type", "str")
    if value is None and spec_type not in ("str", "path", "raw") and option.get("default") is not None:
        return _refusal(name, option, value, "is not %s" % _EXPECTED[spec_type], _type_fix(name, option))
    if value is None and option.get("choices"):
        return _not_a_choice(name, option, value)
    check = _BEFORE.get(spec_type)
    return check(name, option, value) if check and value is not None else None


def _type_fix(name, option):
    spec_type = option.get("type", "str")
    if spec_type == "int":
        return "set a whole number such as %s (the default)" % option.get("default")
    if name == "gpu_node_runtimes":
        return "set a list of runtimes, such as [{name: nvidia-custom, binary: /usr/bin/x}], or [] for none"
    if name == "gpu_node_proxy_env":
        return "set a mapping such as {https_proxy: http://proxy:3128}, or {} for none"
    return _TYPE_FIXES.get(spec_type, 'set a text, or "" for the default')


def _text(name, option, value):
    """A text variable (type str or path) takes a text (or an integer's digits), one of its choices where it has them."""
    found = kind(value)
    if found:
        return _refusal(name, option, value, "is %s, not a text" % found, _text_fix(name, option, found))
    if option.get("choices") and str(value) not in option["choices"]:
        return _not_a_choice(name, option, value)
    return None


def _not_a_choice(name, option, value):
    return _refusal(name, option, value, "is not one of %s" % ", ".join(option["choices"]),
                    "set one of them, or leave it out for %s" % option.get("default"))


def _text_fix(name, option, found):
    if option.get("choices"):
        return "set one of %s" % ", ".join(str(c) for c in option["choices"])
    if name in TEXT_HINTS:
        return TEXT_HINTS[name]
    if found == "a number":
        return "write it in quotes as you mean it (YAML reads an unquoted 1.20 as the number 1.2)"
    if option.get("default"):
        return 'set a text such as "%s" (the default)' % option["default"]
    return 'set a text, or "" for the default'


def _boolean(name, option, value):
    if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOLEANS):
        return None
    if isinstance(value, (int, float)) and value in (0, 1):
        return None
    return _refusal(name, option, value, _not(value, "a boolean"), _TYPE_FIXES["bool"])


def whole_number(value):
    """value as an int where it is a whole number (a text of digits too, as -e gives it), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and _WHOLE_NUMBER.match(value.strip()):
        digits = value.strip()
        # past 30 digits it is only too large (and Python's int() refuses texts of more than 4300 digits)
        return int(digits) if len(digits) <= 30 else (-1 if digits.startswith("-") else 1) * 10 ** 30
    return None


def _integer(name, option, value):
    number = whole_number(value)
    if number is None:
        return _refusal(name, option, value, _not(value, "a whole number"), _type_fix(name, option))
    least = SECONDS.get(name)
    if least is None:
        return None
    seconds = "set %d to %d seconds (%s is the default)" % (least, MOST_SECONDS, option.get("default"))
    shown_as = number if abs(number) < 10 ** 30 else value  # "-5" as -5; a text of 5000 digits cut
    if number < least:
        return _refusal(name, option, shown_as, "is below %d" % least, seconds)
    if number > MOST_SECONDS:
        return _refusal(name, option, shown_as, "is above %d (a day)" % MOST_SECONDS, seconds)
    return None


def _listed(value):
    """The entries of a list variable as the spec converts it (a text is split at its commas)."""
    return check_type_list(value) if isinstance(value, str) else list(value)


def _list(name, option, value):
    if not isinstance(value, (list, tuple, str)):
        return _refusal(name, option, value, _not(value, "a list"), _type_fix(name, option))
    entries = _listed(value)
    if name == "gpu_node_runtimes":
        return runtime_entries(name, [_mapping_of(entry) for entry in entries])
    for index, entry in enumerate(entries):
        if entry is None or kind(entry):
            return _refusal("%s[%d]" % (name, index), option, entry, _not(entry, "a text"), "write each entry as a text")
    return None


def _mapping_of(value):
    """A text as the spec converts it to a dictionary (JSON, or key=value pairs), where it does; else the value."""
    if isinstance(value, str):
        try:
            return check_type_dict(value)
        except (TypeError, ValueError):
            return value
    if isinstance(value, Mapping) and isinstance(value.get("options"), str):
        return dict(value, options=_mapping_of(value["options"]))
    return value


def _dictionary(name, option, value):
    if isinstance(_mapping_of(value), Mapping):
        return None
    return _refusal(name, option, value, _not(value, "a dictionary"), _type_fix(name, option))


def runtime_entries(name, entries):
    """The refusal of gpu_node_runtimes' entries (planner.check_runtime_entries), in the role's name, or None."""
    try:
        planner.check_runtime_entries(entries)
    except K3sGpuError as exc:
        return exc.text({"runtimes": name})
    return None


_BEFORE = {"str": _text, "path": _text, "bool": _boolean, "int": _integer, "list": _list, "dict": _dictionary}


def after_conversion(name, option, value):
    """The refusal of a converted value the spec cannot judge (None when it is fine)."""
    if name in NODE_PATHS:
        entries = value if isinstance(value, list) else [value]
        for index, entry in enumerate(entries):
            where = "%s[%d]" % (name, index) if isinstance(value, list) else name
            refused = node_path(where, option, entry, *NODE_PATHS[name])
            if refused:
                return refused
    if name == "gpu_node_default_runtime" and value:
        try:
            planner.check_runtime_name(value, name)
        except K3sGpuError as exc:
            return "%s; %s" % (exc.cause, TEXT_HINTS[name])
    if name == "gpu_node_proxy_env":
        return environment(name, value)
    if name == "gpu_node_max_unavailable":  # checked here, before any host is changed, not when the batches are made
        return batch_size(value)
    if name in ROLLOUT_SECONDS and value < 1:
        return _refusal(name, option, value, "is not a number of seconds", "set it to 1 or more")
    return None


def batch_size(value):
    """The refusal of a gpu_node_max_unavailable that is neither a count nor a percentage (None when it is one)."""
    try:
        rollout.batch_size(value, 1)
    except K3sGpuError as exc:
        return exc.text()
    return None


def node_path(name, option, path, example, empty_taken):
    """The refusal of a path on the node that is not one absolute path of printable characters without .. parts."""
    if path == "" and empty_taken:
        return None
    fix = "write it from / without .. or a newline, such as %s" % example
    if not path.isprintable():
        return _refusal(name, option, path, "holds a newline or another unprintable character", fix)
    if not path.startswith("/"):
        return _refusal(name, option, path, "is not an absolute path", fix)
    if ".." in path.split("/"):
        return _refusal(name, option, path, "has a .. part", fix)
    if name == "gpu_node_cdi_spec_path" and path.endswith("/"):
        return _refusal(name, option, path, "is a directory, not a file", fix)
    return None


def environment(name, value):
    """The refusal of an environment (gpu_node_proxy_env) that is not names with texts; never shows a value."""
    for key, setting in value.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            return "%s: %s is not an environment variable's name; use names such as https_proxy and no_proxy" % (
                name, shown(key))
        if setting is None or isinstance(setting, bool) or not isinstance(setting, (str, int, float)):
            return "%s.%s is %s, not a text; set each variable to a text, such as https_proxy: http://proxy:3128" % (
                name, key, "null" if setting is None else kind(setting) or "not a text")
    return None
