# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The line between node and controller code, read from the source with ast.

A module whose main() does the work runs on the node: Ansible ships it there with the module_utils it
imports, and nothing else of the collection. So plugins/module_utils holds only what those modules need,
and node-side code imports from the collection nothing but module_utils (never plugin_utils, an action
or a filter plugin, which stay on the controller). plugin_utils may import module_utils, never the reverse.
The other modules only document an action plugin of the same name; their main() refuses to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COLLECTION = "ansible_collections.k3s_gpu.nvidia"
MODULE_UTILS = COLLECTION + ".plugins.module_utils"
STUB_REFUSAL = "runs through its action plugin"

# The modules that run on a node. A new one belongs here, with every module_util it imports.
NODE_SIDE_MODULES = ("gpu_device_holders", "node_files", "runtime_info")


def _parse(path):
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _main(tree):
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")


def _refuses(main):
    return any(isinstance(node, ast.Constant) and isinstance(node.value, str) and STUB_REFUSAL in node.value
               for node in ast.walk(main))


def _package(path):
    return ".".join([COLLECTION] + list(path.relative_to(ROOT).parent.parts))


def _imports(path, tree):
    """(line, dotted name) of everything a file imports, relative imports resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = _package(path).split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                yield node.lineno, base + "." + alias.name
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            yield node.lineno, node.args[0].value


def _collection_imports(path):
    return [(line, name) for line, name in _imports(path, _parse(path)) if name.startswith(COLLECTION + ".")]


def _node_side_modules():
    return sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py")
                  if not _refuses(_main(_parse(path))))


def _node_side_files():
    return ([ROOT / "plugins" / "modules" / (name + ".py") for name in NODE_SIDE_MODULES]
            + sorted((ROOT / "plugins" / "module_utils").glob("*.py")))


def test_the_node_side_modules_are_the_known_ones():
    assert _node_side_modules() == sorted(NODE_SIDE_MODULES), (
        "a module whose main() does not refuse with %r runs on the node: add it to NODE_SIDE_MODULES" % STUB_REFUSAL)


def test_every_refusing_module_has_its_action_plugin():
    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        if _refuses(_main(_parse(path))):
            assert (ROOT / "plugins" / "action" / path.name).is_file(), "%s refuses to run, but no action plugin runs it" % path.name


def test_node_side_code_imports_only_module_utils_from_the_collection():
    found = ["%s:%d imports %s" % (path.relative_to(ROOT), line, name)
             for path in _node_side_files()
             for line, name in _collection_imports(path)
             if not name.startswith(MODULE_UTILS + ".")]
    assert not found, "node-side code may import only module_utils from the collection:\n" + "\n".join(found)


def test_module_utils_holds_only_what_the_node_side_modules_import():
    needed, todo = set(), [ROOT / "plugins" / "modules" / (name + ".py") for name in NODE_SIDE_MODULES]
    while todo:
        for _line, name in _collection_imports(todo.pop()):
            if name.startswith(MODULE_UTILS + "."):
                stem = name[len(MODULE_UTILS) + 1:].split(".")[0]
                if stem not in needed:
                    needed.add(stem)
                    todo.append(ROOT / "plugins" / "module_utils" / (stem + ".py"))
    present = {path.stem for path in (ROOT / "plugins" / "module_utils").glob("*.py")}
    assert present - needed == set(), "no node-side module imports these module_utils: move them to plugin_utils"
    assert needed - present == set()


# The controller's four wings (plugins/plugin_utils/<wing>/) and what each may import of the others; the root of
# plugin_utils holds only what every wing reads (NodeFacts, labels, release rules, SpecAction) and imports no wing.
PLUGIN_UTILS = COLLECTION + ".plugins.plugin_utils"
WINGS = ("containerd", "role", "cluster", "diagnosis")
MAY_IMPORT = {
    "containerd": (),  # the engine stands alone
    "cluster": ("containerd",),  # it reads the writer's node as the engine does
    "role": ("containerd", "cluster"),
    "diagnosis": ("containerd", "cluster", "role"),  # the doctor checks the node against what the role would do
    "root": (),
}


def _wing_of_module(name):
    """The wing of a dotted plugin_utils module name ("root" for one at plugin_utils' top), else None."""
    if not name.startswith(PLUGIN_UTILS + "."):
        return None
    part = name[len(PLUGIN_UTILS) + 1:].split(".")[0]
    return part if part in WINGS else "root"


def _plugin_utils_files():
    for path in sorted((ROOT / "plugins" / "plugin_utils").rglob("*.py")):
        wing = path.relative_to(ROOT / "plugins" / "plugin_utils").parts[0]
        yield path, wing if wing in WINGS else "root"


def test_every_wing_imports_only_what_it_may():
    found = []
    for path, wing in _plugin_utils_files():
        for line, name in _collection_imports(path):
            other = _wing_of_module(name)
            if other not in (None, "root", wing) and other not in MAY_IMPORT[wing]:
                found.append("%s:%d (%s) imports %s (%s)" % (path.relative_to(ROOT), line, wing, name, other))
    assert not found, "a wing imports a wing it may not (MAY_IMPORT):\n" + "\n".join(found)


def test_plugin_utils_has_only_the_four_wings_and_the_shared_root():
    directories = sorted(p.name for p in (ROOT / "plugins" / "plugin_utils").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert directories == sorted(WINGS)


def test_no_import_circle_between_plugin_utils_modules():
    imported = {}
    for path, _wing in _plugin_utils_files():
        name = ".".join([PLUGIN_UTILS] + list(path.relative_to(ROOT / "plugins" / "plugin_utils").with_suffix("").parts))
        imported[name] = set(n for _line, n in _collection_imports(path))
    modules = set(imported)
    # `from module import Name` names Name: it points at the module
    edges = dict((m, set(t if t in modules else t.rsplit(".", 1)[0] for t in targets) & modules)
                 for m, targets in imported.items())
    done, stack, circles = set(), [], []

    def visit(node):
        if node in stack:
            circles.append(stack[stack.index(node):] + [node])
            return
        if node in done:
            return
        stack.append(node)
        for target in sorted(edges[node]):
            visit(target)
        stack.pop()
        done.add(node)
    for module in sorted(modules):
        visit(module)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)
