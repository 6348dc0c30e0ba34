# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What containerd loads on a node, layer by layer, and how it merges the layers.

The layers: the root config (plain containerd), or what k3s/rke2 render from the user's template (their base where
there is none); then each drop-in of the import directory in import order (for plain containerd only where the root
config imports it, for k3s/rke2 only on releases whose base imports it). containerd merges each layer over the ones
before: from 2.1 key by key (deep), before that a layer that has a plugin's table replaces that plugin's whole table
(`dropin_deep_merge` in the feature table; proven against real containerd in tests/conformance/test_claims_cdi.py).
The default runtime a new runtime inherits (_decide) and CDI for DRA claims (_claims_cdi) both read them so.

PRIVATE to the collection. Controller side, no I/O."""

from __future__ import annotations

import copy
import tomllib
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _merge as merge
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml

# (path, the text whose lines are named, its TOML as containerd reads it)
Layer = Tuple[str, Optional[str], Mapping[str, Any]]


class Where(NamedTuple):
    """What the composition needs of an edit: its target (module_utils/_plan), the schema of the user's template
    (None: the target's), the default runtime k3s passes to its base and that base (None: plain containerd)."""
    target: Mapping[str, Any]
    template_schema: Optional[int]
    default_flag: Optional[str]
    base: Any

    @classmethod
    def of_plan(cls, plan: Any) -> "Where":
        return cls(plan.target, plan.template_schema, plan.default_flag, plan.base)

    @classmethod
    def now(cls, facts: NodeFacts, target: Mapping[str, Any]) -> "Where":
        """The node as it is (no edit planned): the base k3s/rke2 render with the node's own default runtime."""
        base = None if facts.distribution == distro.CONTAINERD else template_check.node_base(
            facts, facts.profile, target["schema"], list(facts.release_runtimes), facts.default_runtime)
        return cls(target, None, facts.default_runtime, base)


def compose(facts: NodeFacts, where: Where, after: Optional[str]) -> List[Layer]:
    """The layers containerd loads once the target's text is `after` (None: the target file is not one of them, as
    under a drop-in whose neighbours are asked for). A layer containerd cannot parse is left out: containerd refuses
    it at start whatever this task does, and it is refused elsewhere with its line."""
    return _root_layer(facts, where, after) + dropin_layers(facts, where.target, after)


def dropin_layers(facts: NodeFacts, target: Mapping[str, Any], after: Optional[str]) -> List[Layer]:
    """The drop-ins containerd imports over the root config or rendered template, in import order (file name), the
    target among them where it is a drop-in; [] where the root config imports none or the release's base does not."""
    if facts.distribution == distro.CONTAINERD:
        directory = _dropin_dir(facts, target)
        if not directory or not planner.imports_dir(_root_text(facts, target, after), directory.rsplit("/", 1)[-1]):
            return []  # containerd reads no drop-in the root config does not import
    else:
        directory = _dropin_dir(facts, target) if facts.profile.get("dropin_imports") else ""
        if not directory:
            return []
    dropins = [(d.get("path") or "", d.get("content")) for d in facts.other_dropins
               if (d.get("path") or "").startswith(directory + "/")]
    if target["mode"] == planner.MODE_DROPIN and after is not None:
        dropins.append((target["path"], after))
    layers: List[Layer] = []
    for path, text in sorted(dropins, key=lambda item: item[0].rsplit("/", 1)[-1]):
        _add_toml(layers, path, text)
    return layers


def _root_layer(facts, where, after):
    """[the root config (plain containerd)], or [what k3s/rke2 render from the user's template, else their base]."""
    target = where.target
    layers: List[Layer] = []
    if facts.distribution == distro.CONTAINERD:
        path = target["path"] if target["mode"] == planner.MODE_CONFIG else (
            (facts.files.get("config") or {}).get("path") or target["path"])
        _add_toml(layers, path, _root_text(facts, target, after))
        return layers
    key = target.get("template")
    info = facts.files.get(key) if key else None
    if key == target["key"]:
        text = after
    else:
        text = info.get("content") if info and info.get("state") == "file" else None
    if text is not None:
        schema = target["schema"] if where.template_schema is None else where.template_schema
        try:
            rendered = template_check.render(text, facts, schema, default_runtime=where.default_flag, base=where.base)
            layers.append(((info or {}).get("path") or target["path"], text, toml.loads(rendered)))
        except (tomllib.TOMLDecodeError, K3sGpuError):
            pass  # the template check refuses it with its line; the base stands in meanwhile
    if not layers and where.base is not None:
        layers.append(("the base template of %s %s" % (facts.distribution, facts.release), None, where.base.document()))
    return layers


def _root_text(facts, target, after):
    """The text of plain containerd's root config once the target's text is `after`."""
    if target["mode"] == planner.MODE_CONFIG:
        return after
    return (facts.files.get("config") or {}).get("content")


def merged(layers: Sequence[Layer], deep: bool) -> Dict[str, Any]:
    """The config containerd ends with: each layer over the ones before, key by key where deep, else each plugin's
    table replaced whole by a layer that has it (and any other top-level key replaced)."""
    result: Dict[str, Any] = {}
    for _path, _text, document in layers:
        if deep:
            result = merge.deep_merge(result, document)
            continue
        plugins = dict(result.get("plugins") or {})
        result.update(copy.deepcopy(dict(document)))
        if isinstance(document.get("plugins"), Mapping):
            plugins.update(copy.deepcopy(dict(document["plugins"])))
        if plugins:
            result["plugins"] = plugins
    return result


def origins(layers: Sequence[Layer], plugin_path: Sequence[str], keys: Sequence[str],
            deep: bool) -> Tuple[Dict[str, Tuple[str, Optional[str], Any]], str]:
    """Which layer gives each of keys of a plugin's table (plugin_path: ("plugins", id)) in merged(layers, deep):
    {key: (path, text, value)} for the keys some layer sets, and the path of the last layer that has the plugin's
    table (else the first layer's). Where not deep, a layer with the plugin's table replaces it whole, so a key only
    an earlier layer set is back at containerd's default (absent here)."""
    found: Dict[str, Tuple[str, Optional[str], Any]] = {}
    last = layers[0][0] if layers else ""
    for path, text, document in layers:
        if not touches(document, plugin_path):
            continue
        last = path
        if not deep:
            found = {}
        plugin = table(document, plugin_path)
        for key in keys:
            if key in plugin:
                found[key] = (path, text, plugin[key])
    return found, last


def replaced_runtimes(facts: NodeFacts, where: Where, after: Optional[str],
                      runtimes: Sequence[Mapping[str, Any]]) -> Optional[K3sGpuError]:
    """Why containerd would not load the runtimes ({name, binary}) the edit writes into the target's text (after), None
    where it would: on a line that replaces a plugin's whole table with an imported file's (before 2.1), a file
    imported after the target that has a table of the CRI plugin drops every runtime of the target's it does not
    define itself with the same binary."""
    if not runtimes or deep_merge_of(facts):
        return None
    target, schema = where.target, where.target["schema"]
    plugin = distro.cri_table(schema)
    dropins = dropin_layers(facts, target, after)  # cheap: no template is rendered for a node without such a drop-in
    paths = [path for path, _text, _document in dropins]
    if target["mode"] == planner.MODE_DROPIN:
        if target["path"] not in paths:
            return None  # the target itself is not loaded (a drop-in not imported): named elsewhere
        dropins = dropins[paths.index(target["path"]) + 1:]
    later = [(path, text) for path, text, document in dropins if touches(document, plugin)]
    if not later:
        return None
    loaded = table(merged(compose(facts, where, after), deep=False), distro.containerd_table(schema) + ("runtimes",))
    lost = [r["name"] for r in runtimes
            if table(loaded, (r["name"], "options")).get("BinaryName") != r.get("binary")]
    if not lost:
        return None
    path, text = later[-1]
    line = _first_line_of(text, plugin[-1])
    return K3sGpuError(
        "%s%s has a table of the plugin %s [runtimes_replaced]: containerd %s replaces that plugin's whole table with an "
        "imported file's (it merges them key by key only from 2.1), so the runtimes written to %s (%s) would not be "
        "loaded" % (path, ":%d" % line if line else "", plugin[-1], facts.profile.get("containerd"),
                    where.target["path"], ", ".join(lost)),
        fix="move that file's settings of %s into %s, or take the file out of the import directory; nothing was "
            "written" % (plugin[-1], where.target["path"]))


def deep_merge_of(facts: NodeFacts) -> bool:
    """Whether the node's containerd merges an imported file key by key (the feature table's dropin_deep_merge)."""
    return bool(facts.profile.get("dropin_deep_merge", True))


def touches(document: Mapping[str, Any], key_path: Sequence[str]) -> bool:
    """Whether a layer has the table at key_path (a plugin's table: on containerd before 2.1 it then replaces it)."""
    return bool(table(document, key_path)) or table(document, key_path[:-1]).get(key_path[-1]) is not None


def table(document: Mapping[str, Any], key_path: Sequence[str]) -> Mapping[str, Any]:
    """The table at key_path ({} where there is none)."""
    found = toml.value_at(document, key_path)
    return found if isinstance(found, Mapping) else {}


def _dropin_dir(facts, target):
    """The directory whose drop-ins containerd imports: the target's own where the edit is a drop-in, else the
    release's import directory for the target's schema."""
    if target["mode"] == planner.MODE_DROPIN:
        return target["path"].rsplit("/", 1)[0]
    if facts.distribution == distro.CONTAINERD:
        key = "dropin_dir"
    else:
        key = "dropin_dir_v3" if target["schema"] >= 3 else "dropin_dir_v2"
    return (facts.paths.get(key) or "").rstrip("/")


def _add_toml(layers, path, text):
    if not text:
        return
    try:
        layers.append((path, text, toml.loads(text)))
    except tomllib.TOMLDecodeError:
        pass  # containerd refuses it at start whatever this task does; refused elsewhere with its line


def _first_line_of(text, name):
    """The line of the first table header that names the plugin (0: none)."""
    for number, line in enumerate((text or "").splitlines(), 1):
        if line.lstrip().startswith("[") and name in line:
            return number
    return 0
