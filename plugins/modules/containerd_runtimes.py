#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: containerd_runtimes
short_description: Write the containerd runtime blocks a k3s, rke2 or containerd node is missing, where that release reads them
version_added: 1.0.0
description:
  - Adds containerd runtime handlers for NVIDIA container runtimes (or any runc-compatible runtime) to a
    k3s or rke2 node, or to a plain containerd node, without ever declaring a table the k3s/rke2 base
    template already emits (which makes containerd exit and k3s restart in a loop).
  - Detection runs first on the node (M(k3s_gpu.nvidia.runtime_info)); runtimes the release detects and
    renders itself are RV(runtimes_skipped) with the reason, never written twice.
  - "The target is the least invasive file the release really reads: on releases with drop-in support
    (v1.33.10, v1.34.6, v1.35.3, v1.36.0 and newer) a file in C(config-v3.toml.d/) (or C(config.toml.d/)
    for schema 2); else the template k3s will read (C(config-v3.toml.tmpl) on containerd 2, C(config.toml.tmpl)
    before), created as C({{ template \"base\" . }}) plus only the missing tables, or edited in place
    keeping every byte outside the tables it manages; on plain containerd C(/etc/containerd/config.toml),
    or a drop-in in C(/etc/containerd/conf.d/) where the config imports it and containerd merges deeply (2.1+)."
  - "Plain containerd: the config keeps its own C(version) - V(4) on containerd 2.3 and newer (same CRI runtime tables as
    V(3)), refused on a containerd that cannot read it (2.2 and older) - and a drop-in declares the root config's
    version, never a higher one (containerd 2.3 refuses to start then). A config this module creates says V(3) on containerd 2."
  - The default runtime goes to C(/etc/rancher/<k3s|rke2>/config.yaml.d/) as C(default-runtime) when the release
    detects that runtime, else to C(default_runtime_name) in the containerd config where that is safe.
  - TOML is parsed and rendered on the controller (the node needs only Python's standard library); every
    file that changes is written in one execution of M(k3s_gpu.nvidia.node_files), atomically, with O(backup)
    and O(validate), and only if it is still the text the decision was made from.
  - "On plain containerd with O(root=/) the node's own containerd reads every new config or drop-in before it replaces
    the old one (C(<containerd> --config <new file> config dump)) unless O(validate) is given; O(validate=\"\") turns that off."
  - "Each runtime this module adds starts from the table of the runtime C(default_runtime_name) names (runc's when unset
    or not a runc shim; on k3s/rke2 too, where a template or another drop-in names it; RV(inherited_from) says which),
    every key and option but C(runtime_type), C(BinaryName), C(runtime_engine) and C(runtime_root),
    as C(nvidia-ctk runtime configure) does; the differences and the refusals of plain containerd (C(cri_disabled),
    C(config_version_1), C(runtime_not_loaded), C(runtimes_replaced), C(external_runtime)) and the
    C(cgroup_driver_mismatch) warning are in the collection's docs/plain-containerd.md."
  - When nothing is missing nothing is written, and a drop-in or template this module created earlier and
    no longer needs is removed.
requirements:
  - tomlkit on the controller
extends_documentation_fragment:
  - ansible.builtin.files
  - ansible.builtin.validate
  - ansible.builtin.action_common_attributes.actiongroups
  - k3s_gpu.nvidia.action_attributes
  # short name on purpose: ansible-doc resolves the FQCN form to the ansible.builtin.files fragment
  - action_common_attributes.files
attributes:
  action_group:
    support: full
    membership: [k3s_gpu.nvidia.gpu]
  safe_file_operations:
    support: full
  vault:
    support: none
options:
  root:
    description: Directory that stands for C(/) of the node; see M(k3s_gpu.nvidia.runtime_info).
    type: path
    default: /
  distribution:
    description: V(auto) detects k3s, rke2 or plain containerd.
    type: str
    default: auto
    choices: [auto, k3s, rke2, containerd]
  release:
    description:
      - k3s/rke2 release such as V(v1.31.6+k3s1), or the containerd version for plain containerd.
        Default - ask the installed binary (needs O(root=/)).
    type: str
  newer_release:
    description:
      - What to do with a release of a line newer than the collection knows (k3s/rke2 after 1.37, containerd after 2.3);
        see O(k3s_gpu.nvidia.runtime_info#module:newer_release).
      - V(refuse) fails naming this option, nothing written. V(assume_newest_known) plans as on the newest release of the
        newest known line and warns with the release, the line assumed and the risk.
      - A registered M(k3s_gpu.nvidia.runtime_info) result given as O(node_facts) is used only when it was read with
        the same value (else the node is read again).
    type: str
    default: refuse
    choices: [refuse, assume_newest_known]
  data_dir:
    description: k3s/rke2 data directory; default from C(config.yaml) or the distribution's default.
    type: path
  toolkit_dirs:
    description: Extra directories searched for NVIDIA runtime binaries k3s does not detect itself.
    type: list
    elements: path
    default: []
  runtimes:
    description:
      - The runtimes wanted. Default - every NVIDIA runtime installed on the node (C(nvidia), C(nvidia-cdi),
        C(nvidia-legacy), C(nvidia-experimental)), as M(k3s_gpu.nvidia.runtime_info) finds them.
      - With O(state=absent), the names to remove (default the four NVIDIA names).
    type: list
    elements: dict
    suboptions:
      name:
        description: Runtime handler name, a lowercase DNS label (what a RuntimeClass C(handler) names).
        type: str
        required: true
      binary:
        description: Absolute node path of the runtime binary (C(BinaryName)). Default - the one detected for O(runtimes[].name).
        type: str
      runtime_type:
        description: containerd shim.
        type: str
        default: io.containerd.runc.v2
      options:
        description:
          - Extra runtime options (the C(options) table). For the runc shim, keys are checked against its
            known options, since containerd keeps a misspelled key silently and runs pods on plain runc.
        type: dict
        default: {}
      systemd_cgroup:
        description:
          - C(SystemdCgroup). Default - what k3s gives its own runtimes on this node (true under systemd);
            on plain containerd, the value of the C(runc) runtime.
        type: bool
  state:
    description: V(present) writes the missing blocks; V(absent) removes the named runtime tables (and this module's files).
    type: str
    default: present
    choices: [present, absent]
  default_runtime:
    description:
      - Runtime containerd uses for pods without C(runtimeClassName).
      - On k3s/rke2 it must be a runtime the release detects (then C(default-runtime) in config.yaml.d) or one
        this task writes on a schema-3 release (then C(default_runtime_name)).
    type: str
  enable_cdi:
    description:
      - Set C(enable_cdi) of the CRI plugin. containerd 2 enables CDI by default; on k3s/rke2 releases with
        containerd 1.7 the base template already emits that table, so this is refused there with the alternatives.
    type: bool
  allocation:
    description:
      - How the node's GPUs are allocated (the P(k3s_gpu.nvidia.gpu_node#role) variable C(gpu_node_allocation)).
      - V(dra) - NVIDIA's DRA driver hands each claim's devices to containerd as CDI devices from C(/var/run/cdi), so the
        config containerd loads after this task (the root config or what k3s/rke2 render from the template or their
        base, then every drop-in in import order) must have CDI on and scan C(/var/run/cdi); a file that turns CDI off
        or sets C(cdi_spec_dirs) without it is refused with its path, line and fix (C(cdi_off_for_claims),
        C(cdi_dir_for_claims)), and nothing is written.
    type: str
    default: device_plugin
    choices: [device_plugin, dra]
  handler_labels:
    description:
      - k3s/rke2 only. V(true) labels the node C(k3s-gpu.nvidia/handler.<handler>=true) for each NVIDIA runtime handler it
        serves (written here or rendered by the release), as C(node-label+) in the same C(config.yaml.d) file as the default
        runtime; k3s/rke2 apply it at every start, and P(k3s_gpu.nvidia.runtimeclass_plan#filter) RuntimeClasses can select it.
      - Set (V(true) or V(false)), the task owns that whole file - the default runtime only when O(default_runtime) is
        given, the labels only when V(true); unset, the file keeps a default runtime set earlier.
    type: bool
  node_labels:
    description:
      - k3s/rke2 only, with O(handler_labels) set. More node labels (C(key=value)) written beside the handler labels, such
        as C(nvidia.com/gpu.present=true), which NVIDIA's device plugin chart schedules on.
    type: list
    elements: str
  node_facts:
    description:
      - The registered result of M(k3s_gpu.nvidia.runtime_info) with O(k3s_gpu.nvidia.runtime_info#module:include_content=true),
        read earlier in the play from this node, with the same O(root), O(data_dir), O(toolkit_dirs) and O(path), the same
        or an V(auto) O(distribution), and every absolute O(runtimes[].binary) among its O(k3s_gpu.nvidia.runtime_info#module:binaries).
        The task then makes no reading of its own, and a run that changes nothing costs no module execution on the node.
      - When the result does not fit those options the task reads the node itself (RV(facts_source) says which).
      - Give it only when nothing on the node changed since that reading, as the role C(k3s_gpu.nvidia.gpu_node) does
        (it reads again after an install). A file changed in between is not overwritten - the write checks that every
        file is still the text the decision was made from, and fails naming the file otherwise.
    type: dict
  path:
    description: Write this node file instead of the one the plan picks (a C(.tmpl) is edited as a template, a file in a C(.d) directory as a drop-in).
    type: path
  backup:
    description:
      - Keep a timestamped copy of a file before changing or removing it, as
        C(/var/backups/k3s-gpu-nvidia/<the file's own path>.<pid>.<date>@<time>~) (under O(root)), outside every
        directory k3s, rke2 or containerd import; the newest 3 copies of each file are kept.
      - A file only this module ever wrote (its drop-in, its default-runtime file, a file it created) is not copied
        when it is removed.
    type: bool
    default: false
  target_release:
    description:
      - The k3s/rke2 release the node is about to get. The template k3s reads is also rendered for that release (its
        template fields and functions, what its base emits) and what would break there is returned in
        RV(upgrade_findings), each with the line and the fix. What would break there is not refused.
      - Refused by name, before anything is decided, also where the node has no template to render - a text that
        is no release of the node's distribution, a release of a line this collection does not know (see
        O(newer_release)), and any O(target_release) on a plain containerd node.
      - The playbook C(k3s_gpu.nvidia.upgrade_check) runs this read-only over a fleet.
    type: str
  normalize_encoding:
    description:
      - A template saved with a UTF-8 byte order mark or CR (Windows) line endings is refused by default, naming the
        encoding problem, and never re-encoded silently.
      - V(true) opts in to writing it back without the byte order mark and with LF line endings (also when the task
        writes only a drop-in). Invalid UTF-8 and NUL bytes are refused either way.
    type: bool
    default: false
notes:
  - "Before anything is written, the template k3s/rke2 reads (also on releases where the task writes only a drop-in)
    is rendered the way k3s renders it - a model of Go's text/template with the release's template fields and
    functions, and the release's base for what the node detects and the flags in use; both sides of a condition that
    cannot be decided on the controller. The rendered config is then checked as containerd reads it, for the node as
    it is and as it will be once the NVIDIA toolkit packages are installed (k3s then detects C(nvidia) and
    C(nvidia-cdi)). What breaks the node is refused with the file, the line, the cause and the fix, and nothing is
    written; what loses k3s settings or is ignored is a warning. The outcome of every finding is in
    docs/template-outcomes.md; RV(template_findings) lists them."
  - k3s and rke2 read templates and drop-ins at start; restart the k3s/rke2 service when the task reports a change (the
    role C(k3s_gpu.nvidia.gpu_node) does that in a handler).
  - O(mode) defaults to V(0600) for files this module creates.
seealso:
  - module: k3s_gpu.nvidia.runtime_info
  - module: k3s_gpu.nvidia.node_files
  - plugin: k3s_gpu.nvidia.containerd_runtime_blocks
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Add every NVIDIA runtime the node has and k3s does not render itself
  k3s_gpu.nvidia.containerd_runtimes:
  register: gpu_runtimes
  notify: Restart k3s

- name: nvidia-legacy from a toolkit unpacked outside the PATH, nvidia as the default runtime
  k3s_gpu.nvidia.containerd_runtimes:
    runtimes:
      - name: nvidia-legacy
        binary: /opt/nvidia/toolkit/nvidia-container-runtime.legacy
    default_runtime: nvidia
    backup: true

- name: Plain containerd 1.7 with CDI turned on, validated by containerd before it replaces the file
  k3s_gpu.nvidia.containerd_runtimes:
    distribution: containerd
    enable_cdi: true
    validate: containerd --config %s config dump

- name: Remove what this module added
  k3s_gpu.nvidia.containerd_runtimes:
    state: absent
"""

RETURN = r"""
error:
  description:
    - When the task refuses, C(cause), C(fix) and C(variables), the options the fix names (written V({option}) in the
      text); C(msg) is the same text with the option names.
  returned: failure
  type: dict
distribution:
  description: V(k3s), V(rke2) or V(containerd).
  returned: always
  type: str
  sample: k3s
release:
  description: The release the plan is for.
  returned: always
  type: str
  sample: v1.31.6+k3s1
target:
  description: Where the blocks go and why - mode (V(dropin), V(template), V(config)), node path, schema.
  returned: always
  type: dict
  sample:
    mode: template
    path: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl
    schema: 3
    reason: k3s v1.31.6+k3s1 has no drop-in support; a template that includes base is created
runtimes_written:
  description: Runtimes whose blocks are in the target after this run.
  returned: always
  type: list
  elements: dict
  sample: [{name: nvidia-legacy, binary: /usr/bin/nvidia-container-runtime.legacy, runtime_type: io.containerd.runc.v2}]
runtimes_skipped:
  description: Runtimes not written, and why (typically - the release renders them itself).
  returned: always
  type: list
  elements: dict
  sample: [{name: nvidia, reason: k3s v1.31.6+k3s1 detects /usr/bin/nvidia-container-runtime and renders this runtime itself}]
inherited_from:
  description:
    - Where the runtimes written took their settings from - the runtime C(default_runtime_name) names, as containerd reads
      it (the root config or the base k3s renders, the template, then every other drop-in of the directory), or runc's
      table with C(fallback) saying why (not a runc shim, no table, one of this module's runtimes). Null when nothing
      is written or there is no such table.
  returned: always
  type: dict
  sample: {runtime: crun, default_runtime: crun, fallback: null, keys: [privileged_without_host_devices], options: [SystemdCgroup]}
runtimes_removed:
  description: Runtime tables removed (O(state=absent), or tables the base template now emits itself).
  returned: always
  type: list
  elements: str
  sample: []
default_runtime:
  description: How the default runtime is set (V(config_yaml) or V(toml)) and where, or null.
  returned: always
  type: dict
  sample: {name: nvidia, how: config_yaml, path: /etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml}
node_labels:
  description: The node labels written (with O(handler_labels)), or null when the task does not manage them.
  returned: always
  type: list
  elements: str
  sample: [k3s-gpu.nvidia/handler.nvidia=true, k3s-gpu.nvidia/handler.nvidia-cdi=true]
files:
  description: Each file the module looked after, its host path, and what happened (V(created), V(updated), V(removed), V(unchanged)).
  returned: always
  type: list
  elements: dict
  sample: [{path: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl, action: created, backup_file: null}]
facts_source:
  description: V(node_facts) when the task used O(node_facts), V(read) when it read the node itself.
  returned: always
  type: str
  sample: node_facts
runtime_in_use:
  description:
    - The runtime that runs the node's pods (see RV(k3s_gpu.nvidia.runtime_info#module:runtime_in_use)). A k3s/rke2 node
      pointed at the host's containerd by C(container-runtime-endpoint) is configured as plain containerd (its
      C(/etc/containerd/config.toml), its C(containerd) service); one on Docker, CRI-O or an endpoint that cannot be
      identified is refused, nothing written.
  returned: always
  type: dict
  sample: {runtime: embedded-containerd, distribution: k3s, release: v1.33.10+k3s1, endpoint: null, source: null,
           docker: false, docker_source: null}
cgroup_driver_mismatch:
  description:
    - Where the kubelet's C(cgroupDriver) (C(/var/lib/kubelet/config.yaml), on k3s/rke2 also its C(kubelet.conf.d)) and
      the effective C(SystemdCgroup) of the default runtime or of a runtime this module writes disagree (plain
      containerd only) - both values, both files and the runtimes concerned; also a task warning. Null otherwise.
  returned: always
  type: dict
  sample: {kubelet_cgroup_driver: systemd, kubelet_config: /var/lib/kubelet/config.yaml,
           containerd_config: /etc/containerd/config.toml, systemd_cgroup: {runc: false, nvidia: false}, runtimes: [runc, nvidia]}
notes:
  description: Decisions worth knowing (a drop-in overriding a rendered block, a runc block added, a setting already the default).
  returned: always
  type: list
  elements: str
  sample: []
template_outcome:
  description: V(edit), V(warn) or V(refuse) for the template k3s/rke2 reads (null when there is none, and on plain containerd).
  returned: always
  type: str
  sample: warn
template_findings:
  description: What the check of that template found - code (docs/template-outcomes.md), severity, line, message, fix, and
    when (V(now), V(after_install) or V(upgrade)). Warnings are also shown as task warnings.
  returned: always
  type: list
  elements: dict
  sample:
    - code: no_base
      severity: warn
      line: 0
      when: now
      message: the template never includes {{ template "base" . }} ...
      fix: start the file with {{ template "base" . }} and keep only your own tables
upgrade_findings:
  description: The findings for O(target_release) only (empty without it).
  returned: always
  type: list
  elements: dict
  sample: []
upgrade_messages:
  description: The same findings as one line each - the file, the line, the cause, the code and the fix.
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC


def main():
    module = AnsibleModule(argument_spec=CONTAINERD_RUNTIMES_SPEC, supports_check_mode=True, add_file_common_args=True)
    module.fail_json(msg="k3s_gpu.nvidia.containerd_runtimes runs through its action plugin on the controller; "
                         "call it by its full name in a task, not as a module on the node")


if __name__ == "__main__":
    main()
