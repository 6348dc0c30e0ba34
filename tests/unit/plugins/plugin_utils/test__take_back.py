# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_node_state=absent, decided on the controller: the bytes of a user's file before the collection's first edit
are kept with that edit (<file>.k3s-gpu-nvidia.orig, and the SHA-256 of what the collection left in .sha256), put
back when the file is still what the collection left, and otherwise only the collection's tables are taken out.
The host step's absent plan and the CDI spec it removes. The whole role runs in the gpu_node_role integration target."""

from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write

RELEASE = "v1.32.2+k3s1"  # containerd 2.0, no drop-ins: the user's template is edited in place
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
CONFIG = "/etc/containerd/config.toml"
V3 = "plugins.'io.containerd.cri.v1.runtime'.containerd"
USER_TEMPLATE = ('{{ template "base" . }}\n\n# mine\n[%s.runtimes.mine]\n  runtime_type   = "io.containerd.runc.v2"\n' % V3)
USER_CONFIG = 'version = 3\n\n[%s.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n' % V3
BOOKKEEPING = (distro.ORIGINAL_SUFFIX, distro.RECORD_SUFFIX)
NVIDIA_LEGACY = ('[%s.runtimes.nvidia-legacy]\n  runtime_type = "io.containerd.runc.v2"\n'
                 '[%s.runtimes.nvidia-legacy.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime.legacy"\n' % (V3, V3))


def compute(sandbox, state="present", distribution="k3s", release=RELEASE, runtimes=None):
    binaries = [r["binary"] for r in runtimes or []]
    facts = detect.gather(sandbox.root, distribution, release, binaries=binaries)
    params = {"state": state, "handler_labels": True if distribution != "containerd" else None, "runtimes": runtimes}
    return changes.compute(NodeFacts.from_reading(facts), params, own_files=True)


def by_path(file_changes):
    return dict((c.node_path, c) for c in file_changes)


def apply(sandbox, file_changes):
    """Apply changes to the sandbox, as node_files would."""
    for change in file_changes:
        if change.after is None:
            os.unlink(sandbox.path(change.node_path))
        else:
            sandbox.write(change.node_path, change.after, int(change.mode or "0644", 8))


def present(sandbox, distribution="k3s", release=RELEASE):
    plan, file_changes = compute(sandbox, "present", distribution, release)
    apply(sandbox, file_changes)
    return plan, file_changes


# a user's own file per kind of node: the k3s template, plain containerd's config
USER_FILES = [
    ("k3s", RELEASE, TEMPLATE, USER_TEMPLATE),
    ("containerd", "2.1.4", CONFIG, USER_CONFIG),
]


def record(node_path, text, previous=None):
    """A sha256sum line of the text the collection leaves, then a comment naming the one it replaces."""
    out = "%s  %s\n" % (hashlib.sha256(text.encode()).hexdigest(), node_path.rsplit("/", 1)[-1])
    return out + ("# the text before this edit: %s\n" % hashlib.sha256(previous.encode()).hexdigest() if previous else "")


@pytest.mark.parametrize("distribution, release, path, text", USER_FILES)
def test_the_first_edit_keeps_the_original_and_records_what_it_left(sandbox, distribution, release, path, text):
    sandbox.k3s("k3s", "package")
    sandbox.write(path, text)
    _plan, file_changes = compute(sandbox, "present", distribution, release)
    found = by_path(file_changes)
    edited = found[path].after
    assert "nvidia-legacy" in edited
    kept = found[path + distro.ORIGINAL_SUFFIX]
    assert (kept.before, kept.after, kept.mode, kept.exists) == (None, text, "0600", False)
    assert found[path + distro.RECORD_SUFFIX].after == record(path, edited, text)
    # node_files applies in order: the original is kept first, then the record names the new text, then the edit (a
    # run killed between any two leaves a file whose text the record or the original names)
    order = [c.node_path for c in file_changes]
    assert order.index(path + distro.ORIGINAL_SUFFIX) < order.index(path + distro.RECORD_SUFFIX) < order.index(path)
    entry = node_write.write_entry(kept, {"backup": False, "validate": "containerd --config %s config dump", "mode": "0644"})
    assert entry["expected_state"] == "absent" and entry["mode"] == "0600" and "validate" not in entry


def test_a_template_the_collection_creates_keeps_no_original(sandbox):
    sandbox.k3s("k3s", "package")
    _plan, file_changes = compute(sandbox)
    assert [c.node_path for c in file_changes if c.node_path.endswith(BOOKKEEPING)] == []


def test_a_file_that_already_holds_nvidia_tables_keeps_no_original(sandbox):
    # an earlier version of the collection edited it: what it was before is unknown
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, USER_TEMPLATE + NVIDIA_LEGACY.replace("legacy.options]", "legacy.options]\n  NoPivotRoot = true"))
    plan, file_changes = compute(sandbox)
    assert [c for c in file_changes if c.node_path.endswith(BOOKKEEPING)] == []
    assert any("is unknown and not kept" in note for note in plan["notes"])


@pytest.mark.parametrize("edited_by_user, record_follows", [
    (False, True),   # what the collection left: the record follows its next edit
    (True, False),   # edited by someone else since: the record goes (absent then takes out only our tables)
])
def test_later_edits_keep_the_original_and_follow_the_record(sandbox, edited_by_user, record_follows):
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, USER_TEMPLATE)
    present(sandbox)
    original = sandbox.read(TEMPLATE + distro.ORIGINAL_SUFFIX)
    if edited_by_user:
        sandbox.write(TEMPLATE, sandbox.read(TEMPLATE).decode().replace("# mine", "# mine, edited"))
    # the next run writes one runtime more
    legacy = "/usr/bin/nvidia-container-runtime.legacy"
    _plan, file_changes = compute(sandbox, runtimes=[{"name": "nvidia-legacy", "binary": legacy},
                                                     {"name": "nvidia-custom", "binary": legacy}])
    found = by_path(file_changes)
    assert "runtimes.nvidia-custom]" in found[TEMPLATE].after
    assert TEMPLATE + distro.ORIGINAL_SUFFIX not in found  # never overwritten
    assert sandbox.read(TEMPLATE + distro.ORIGINAL_SUFFIX) == original
    assert found[TEMPLATE + distro.RECORD_SUFFIX].after == (
        record(TEMPLATE, found[TEMPLATE].after, found[TEMPLATE].before) if record_follows else None)


@pytest.mark.parametrize("distribution, release, path, text", USER_FILES)
def test_absent_puts_the_original_back_and_removes_the_bookkeeping(sandbox, distribution, release, path, text):
    sandbox.k3s("k3s", "package")
    sandbox.write(path, text)
    present(sandbox, distribution, release)
    plan, file_changes = compute(sandbox, "absent", distribution, release)
    found = by_path(file_changes)
    assert found[path].after == text
    assert found[path + distro.ORIGINAL_SUFFIX].after is None and found[path + distro.RECORD_SUFFIX].after is None
    assert plan["restored"] == [path] and not plan.get("changed_since_written")


def test_absent_after_a_users_edit_takes_out_only_our_tables_and_warns(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, USER_TEMPLATE)
    present(sandbox)
    edited = sandbox.read(TEMPLATE).decode().replace("# mine", "# mine, edited")
    sandbox.write(TEMPLATE, edited)
    plan, file_changes = compute(sandbox, "absent")
    found = by_path(file_changes)
    assert found[TEMPLATE].after == USER_TEMPLATE.replace("# mine", "# mine, edited")
    assert found[TEMPLATE + distro.ORIGINAL_SUFFIX].after is None
    assert plan["changed_since_written"] == [TEMPLATE]
    assert any(TEMPLATE + " changed since k3s_gpu.nvidia last wrote it" in w and "(nvidia-legacy)" in w
               for w in plan["warnings"])


def test_absent_keeps_a_users_own_nvidia_table_that_was_there_before(sandbox):
    # the user's own nvidia-experimental table from before the first edit is theirs, not the collection's
    sandbox.k3s("k3s", "package")
    own = NVIDIA_LEGACY.replace("nvidia-legacy", "nvidia-experimental").replace(".legacy", ".experimental")
    sandbox.binary("/usr/bin/nvidia-container-runtime.experimental")
    sandbox.write(TEMPLATE, USER_TEMPLATE)
    present(sandbox)
    # an edit of the user's, adding their own table after the collection's
    sandbox.write(TEMPLATE, sandbox.read(TEMPLATE).decode() + own)
    sandbox.write(TEMPLATE + distro.ORIGINAL_SUFFIX, USER_TEMPLATE + own)
    _plan, file_changes = compute(sandbox, "absent")
    after = by_path(file_changes)[TEMPLATE].after
    assert "runtimes.nvidia-experimental]" in after and "runtimes.nvidia-legacy]" not in after


def test_a_second_absent_changes_nothing(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, USER_TEMPLATE)
    present(sandbox)
    apply(sandbox, compute(sandbox, "absent")[1])
    assert sandbox.read(TEMPLATE).decode() == USER_TEMPLATE
    assert compute(sandbox, "absent")[1] == []


def test_our_directories_go_with_our_files(sandbox):
    sandbox.k3s("k3s", "package")
    present(sandbox, release="v1.33.10+k3s1")
    _plan, file_changes = compute(sandbox, "absent", release="v1.33.10+k3s1")
    pruned = sorted(c.node_path for c in file_changes if c.remove_empty_parent)
    assert pruned == ["/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml",
                      "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"]
    entry = node_write.write_entry(file_changes[0], {"backup": False, "validate": None})
    assert entry["state"] == "absent" and entry["remove_empty_parent"] is True


# --- the host step --------------------------------------------------------------------------------------------

def settings(**overrides):
    out = {"root": "/", "mode": "host", "state": "absent", "absent_remove_toolkit": False,
           "cdi_spec_path": "/var/run/cdi/nvidia.yaml"}
    out.update(overrides)
    return out


@pytest.mark.parametrize("root, remove, removes_packages, message", [
    ("/", False, False, False),
    ("/", True, True, False),
    ("/srv/sandbox", True, False, True),   # never packages on a sandbox tree: said so
    ("/srv/sandbox", False, False, False),
])
def test_the_absent_plan(sandbox, root, remove, removes_packages, message):
    sandbox.k3s("k3s", "package")
    info = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", RELEASE))
    plan = host_step.plan_host(info, settings(root=root, absent_remove_toolkit=remove), "gpu1")
    assert plan.selected is True and plan.result["status"] == "absent" and plan.result["state"] == "absent"
    mode = plan.mode
    assert (mode.remove_host_toolkit, mode.remove_toolkit_source) == (removes_packages, removes_packages)
    assert not (mode.install_toolkit or mode.install_driver or mode.generate_cdi or mode.default_runtime)
    assert bool(plan.messages) is message


def test_absent_needs_no_gpu(sandbox):
    sandbox.k3s("k3s", "package")  # no driver, nothing on the PCI bus
    info = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", RELEASE))
    assert host_step.plan_host(info, settings(), "cpu1").selected is True


SPEC = 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n'


@pytest.mark.parametrize("spec_path, text, removed, warned", [
    ("/var/run/cdi/nvidia.yaml", distro.CDI_SPEC_MARKER + "\n---\n" + SPEC, True, False),
    ("/var/run/cdi/nvidia.yaml", SPEC, False, True),           # not generated by the collection: it stays, said so
    ("/etc/cdi/other.yaml", distro.CDI_SPEC_MARKER + "\n" + SPEC, False, False),  # not the role's path
    (None, None, False, False),
])
def test_absent_removes_only_the_cdi_spec_the_role_generated(sandbox, spec_path, text, removed, warned):
    sandbox.k3s("k3s", "package")
    if spec_path:
        sandbox.write(spec_path, text)
    info = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", RELEASE))
    extra, warnings = host_step.cdi_spec_changes(info, settings())
    assert bool(extra) is removed and bool(warnings) is warned
    if removed:
        assert extra[0].after is None and extra[0].sha1 == hashlib.sha1(text.encode()).hexdigest()
        assert node_write.write_entry(extra[0], {"backup": True, "validate": None})["expected_sha1"] == extra[0].sha1


@pytest.mark.parametrize("path, marker", [
    ("/var/run/cdi/nvidia.yaml", distro.CDI_SPEC_MARKER),
    ("/etc/cdi/nvidia.json", ""),  # JSON has no comments: such a spec is not marked (and not removed)
])
def test_the_cdi_marker(path, marker):
    assert host_step.cdi_marker(settings(cdi_spec_path=path)) == marker
