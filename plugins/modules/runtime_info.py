#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: runtime_info
short_description: Detect NVIDIA container runtimes exactly as the node's k3s or rke2 release will
version_added: 1.0.0
description:
  - Reads a node (or a sandbox tree under O(root)) and reports which NVIDIA container runtimes
    (C(nvidia), C(nvidia-cdi), C(nvidia-legacy), C(nvidia-experimental)) are installed, and which of
    them the installed k3s or rke2 release detects and renders into containerd's C(config.toml) by itself.
  - The search mirrors k3s release by release, from v1.28 to v1.37 - the C(fs.Stat) era before February 2024,
    the fixed C(exec.LookPath) PATH, and since October 2024 C(/usr/local/nvidia/toolkit:/opt/kwasm/bin)
    plus the service PATH read from the unit, its drop-ins and its environment files.
  - Also reports what k3s ignores - the C(.legacy) runtime, the driver version, C(/dev/nvidia*), CDI specs in
    C(/etc/cdi) and C(/var/run/cdi), the toolkit version, the GPU Operator layout - the paths that matter,
    and the plan M(k3s_gpu.nvidia.containerd_runtimes) would follow for the runtimes found.
  - Read-only. Needs only the Python standard library on the node.
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.actiongroups
  - ansible.builtin.action_common_attributes.facts
attributes:
  action_group:
    support: full
    membership: [k3s_gpu.nvidia.gpu]
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: none
  platform:
    platforms: posix
options:
  root:
    description:
      - Directory that stands for C(/) of the node. Every node path is read below it, and symlinks are
        resolved inside it. Use a sandbox tree in tests and image builds.
    type: path
    default: /
  distribution:
    description:
      - V(auto) finds k3s, rke2 or plain containerd from binaries, systemd units and data directories.
    type: str
    default: auto
    choices: [auto, k3s, rke2, containerd]
  release:
    description:
      - The k3s/rke2 release (for example V(v1.31.6+k3s1), V(v1.33.10+rke2r1)) or, for plain containerd,
        the containerd version (V(1.7.24), V(2.1.4)).
      - By default the installed binary is asked (C(k3s --version)); that needs O(root=/).
      - Releases older than the 1.28 line are refused. A release of a line newer than 1.37 (containerd newer
        than 2.3) is handled as O(newer_release) says.
    type: str
  newer_release:
    description:
      - What to do with a release of a line newer than the collection's feature table knows (k3s/rke2 after 1.37,
        containerd after 2.3). Its containerd template, template data, runtime detection and embedded containerd
        may differ from every known line.
      - V(refuse) fails with a message naming this option; nothing is read further.
      - V(assume_newest_known) reads it as the newest release of the newest known line (1.37, containerd 2.3) and
        warns with the release, the line assumed and the risk; C(assumed_line) in RV(profile) names that line.
      - Shared through the C(k3s_gpu.nvidia.gpu) action group with M(k3s_gpu.nvidia.containerd_runtimes), so one
        C(module_defaults) entry sets both; the C(gpu_node) role passes C(gpu_node_newer_release).
    type: str
    default: refuse
    choices: [refuse, assume_newest_known]
  data_dir:
    description:
      - k3s/rke2 data directory. Default is C(data-dir) from C(config.yaml), else C(/var/lib/rancher/k3s)
        or C(/var/lib/rancher/rke2).
    type: path
  toolkit_dirs:
    description:
      - Extra directories where NVIDIA runtime binaries may live (for example a toolkit unpacked outside
        the PATH). Searched after C(/usr/local/nvidia/toolkit) and before the service PATH, for the
        runtimes k3s does not detect itself.
    type: list
    elements: path
    default: []
  path:
    description:
      - Also report on this node file as the target (the O(k3s_gpu.nvidia.containerd_runtimes#module:path) option).
    type: path
  binaries:
    description:
      - Node paths of runtime binaries to check (existence, type, executable bit), reported in RV(binaries).
    type: list
    elements: path
    default: []
  include_content:
    description:
      - Return the text of the containerd templates, drop-ins and configs in RV(files).
        The action plugin of M(k3s_gpu.nvidia.containerd_runtimes) uses it so that a run which changes
        nothing costs one round trip.
    type: bool
    default: false
  include_plan:
    description:
      - Return RV(plan), what M(k3s_gpu.nvidia.containerd_runtimes) would do with its default options. The gpu_node role
        and M(k3s_gpu.nvidia.containerd_runtimes) read without it (they plan on the controller), which spares every
        node the planner's code.
    type: bool
    default: true
notes:
  - The GPU is not needed; a node without a driver reports C(loaded=false) in RV(driver).
seealso:
  - module: k3s_gpu.nvidia.containerd_runtimes
"""

EXAMPLES = r"""
- name: Detect NVIDIA runtimes and what k3s renders itself
  k3s_gpu.nvidia.runtime_info:
  register: gpu

- name: Show the runtimes k3s will not render (they need a template or drop-in)
  ansible.builtin.debug:
    msg: "{{ gpu.plan.write | map(attribute='name') | list }}"

- name: Inspect a sandbox tree (image build) for a known release
  k3s_gpu.nvidia.runtime_info:
    root: /srv/images/gpu-node/rootfs
    distribution: rke2
    release: v1.33.10+rke2r1
"""

RETURN = r"""
error:
  description:
    - When the node cannot be read as asked, C(cause), C(fix) and C(variables), the options the fix names (written
      V({option}) in the text); C(msg) is the same text with the option names.
  returned: failure
  type: dict
distribution:
  description:
    - V(k3s), V(rke2) or V(containerd).
    - V(containerd) also on a k3s/rke2 node whose pods run on the host's containerd (RV(runtime_in_use)); the
      other facts are then those of that containerd, and RV(release) is its version.
  returned: success
  type: str
  sample: k3s
runtime_in_use:
  description:
    - The runtime that runs the node's pods and the setting that says so - V(embedded-containerd) (k3s/rke2's
      own), V(containerd) (the host's, also plain containerd nodes), V(docker) (k3s's C(docker), cri-dockerd),
      V(cri-o) or V(unknown) (an endpoint that is none of these).
    - Read where k3s/rke2 read C(container-runtime-endpoint) and C(docker) - C(config.yaml), C(config.yaml.d/*.yaml)
      in order, then the unit's C(ExecStart) with the unit's variables substituted; the last wins.
    - M(k3s_gpu.nvidia.containerd_runtimes) refuses V(docker), V(cri-o) and V(unknown) by name (code C(external_runtime)).
  returned: success
  type: dict
  sample: {runtime: containerd, distribution: k3s, release: v1.33.10+k3s1, endpoint: "unix:///run/containerd/containerd.sock",
           source: /etc/rancher/k3s/config.yaml, docker: false, docker_source: null}
release:
  description: The release the facts are for.
  returned: success
  type: str
  sample: v1.31.6+k3s1
release_source:
  description: V(option), or the binary that was asked for its version.
  returned: success
  type: str
  sample: /usr/local/bin/k3s
root:
  description: The root prefix used.
  returned: success
  type: str
  sample: /
read_options:
  description:
    - The options this reading was made with (O(root), O(distribution), O(release), O(data_dir), O(toolkit_dirs),
      O(newer_release), O(path), O(binaries), O(include_content)). M(k3s_gpu.nvidia.containerd_runtimes) checks them before it
      uses a registered result given as its O(k3s_gpu.nvidia.containerd_runtimes#module:node_facts).
  returned: success
  type: dict
  sample: {root: /, distribution: auto, release: null, data_dir: null, toolkit_dirs: [], newer_release: refuse, path: null,
           binaries: [], include_content: true}
known_bad_release:
  description: Why this exact release is known to break with NVIDIA runtimes, else null.
  returned: success
  type: str
  sample: null
profile:
  description:
    - What the release implies, from the collection's feature table - containerd line, config schema,
      template names in precedence order, base-template and drop-in support, detection era, the runtimes
      it looks for, the RuntimeClasses it ships, C(default-runtime) support, the CDI default.
    - C(schema) is the config version of a file the collection creates; C(config_version_max) the highest
      C(version) the node's containerd reads (4 from containerd 2.3; an existing file keeps its own version).
    - C(assumed_line) is the known line a newer release is read as (O(newer_release=assume_newest_known)), else
      null; C(assumed_warning) the warning given then.
  returned: success
  type: dict
  sample:
    distribution: k3s
    release: v1.31.6+k3s1
    line: "1.31"
    assumed_line: null
    containerd: "2.0"
    schema: 3
    config_version_max: 3
    templates: [config-v3.toml.tmpl, config.toml.tmpl]
    base_template: true
    dropin_imports: false
    detection: lookpath+service-path
    runtimeclasses: [nvidia, nvidia-experimental, crun]
    default_runtime: true
    cdi_default_on: true
paths:
  description: The node paths that matter (data dir, generated config, templates, drop-in dirs, manifests, config.yaml.d).
  returned: success
  type: dict
  sample:
    config: /var/lib/rancher/k3s/agent/etc/containerd/config.toml
    template_v3: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl
    manifests_dir: /var/lib/rancher/k3s/server/manifests
    static_charts_dir: /var/lib/rancher/k3s/server/static/charts
units:
  description: The systemd units of the distribution found on the node.
  returned: success
  type: list
  elements: str
  sample: [k3s-agent]
service:
  description: The unit file, the environment files read, and the PATH the service runs with.
  returned: success
  type: dict
  sample:
    unit_file: /etc/systemd/system/k3s-agent.service
    env_files: [/etc/systemd/system/k3s-agent.service.env]
    path: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
release_runtimes:
  description: Every runtime the release will detect and render itself (NVIDIA, crun and wasm shims), sorted by name.
  returned: success
  type: list
  elements: dict
  sample:
    - name: nvidia
      binary: /usr/bin/nvidia-container-runtime
      runtime_type: io.containerd.runc.v2
runtimes:
  description:
    - The NVIDIA runtimes installed on the node. C(source) is V(k3s) when the release detects it
      itself, else where it was found (V(gpu-operator), V(toolkit_dirs), V(path)).
    - C(owner) is the layout the binary belongs to, V(gpu-operator) (under C(/usr/local/nvidia/toolkit))
      or V(host) (a package or a custom directory).
  returned: success
  type: list
  elements: dict
  sample:
    - name: nvidia-legacy
      binary: /usr/bin/nvidia-container-runtime.legacy
      runtime_type: io.containerd.runc.v2
      source: path
      owner: host
default_runtime:
  description: C(default-runtime) as k3s/rke2 reads it from config.yaml and config.yaml.d, and the file that set it.
  returned: success
  type: dict
  sample: {value: nvidia, source: /etc/rancher/k3s/config.yaml}
k3s_config:
  description:
    - The texts of C(config.yaml) and C(config.yaml.d/*.yaml) in the order k3s/rke2 read them (C(files), each C(path) and
      C(text)), and what this module's line reader saw of the keys that decided how the node was read (C(read) - C(data-dir),
      C(container-runtime-endpoint), C(docker)).
    - "The module follows plain C(key: value) lines only; the collection's controller side parses the texts as YAML, takes
      C(default-runtime) and C(disable) from them, and refuses the node by name where YAML reads a deciding key otherwise."
  returned: on a k3s or rke2 node
  type: dict
  sample: {files: [{path: /etc/rancher/k3s/config.yaml, text: "default-runtime: nvidia\n"}], data_dir_given: false,
           read: {data-dir: null, container-runtime-endpoint: null, docker: null}}
disabled_components:
  description: The C(disable) list of config.yaml and config.yaml.d (C(disable+) appends), as the k3s/rke2 server merges it.
  returned: success
  type: list
  elements: str
  sample: [traefik, runtimes]
runtimeclasses_disabled:
  description:
    - True when the server ships no RuntimeClasses because C(disable) names C(runtimes) (k3s) or C(rke2-runtimeclasses) (rke2).
    - C(--disable) on the unit's command line is not read.
  returned: success
  type: bool
systemd:
  description: Whether systemd runs the node (C(/run/systemd/system) exists).
  returned: success
  type: bool
systemd_cgroup:
  description: The SystemdCgroup value k3s gives its runtimes on this node.
  returned: success
  type: bool
driver:
  description:
    - NVIDIA kernel driver - loaded, version, open kernel module, device nodes (C(devices); those in C(/dev/nvidia-caps)
      by their own paths, the directory itself not), GPU count; and the NVIDIA GPUs on the PCI bus (C(pci_gpus)),
      found with or without a driver.
    - C(char_links) - the NVIDIA device nodes that have a C(/dev/char/<major>:<minor>) link (systemd needs them to keep
      a container's GPUs at C(systemctl daemon-reload)); C(nvswitches) - NVSwitches on the PCI bus (the fabric manager's
      hardware); C(dev_char_rule) - the udev rule C(/etc/udev/rules.d/71-nvidia-dev-char.rules) that makes those links
      at every driver bind (a file's facts, as in C(files), with its C(content)).
    - C(device_nodes_dropins) - k3s/rke2 only, one per unit in C(units) - the drop-in
      C(/etc/systemd/system/<unit>.service.d/50-k3s-gpu-nvidia-device-nodes.conf) with which the gpu_node role makes
      the device nodes before k3s/rke2 starts on a DRA node (a file's facts, with its C(content)).
  returned: success
  type: dict
  sample: {loaded: true, version: "580.95.05", open_kernel_module: true, devices: [/dev/nvidia0, /dev/nvidiactl], gpu_count: 1,
           pci_gpus: ["0000:17:00.0"], char_links: [/dev/nvidia0, /dev/nvidiactl], nvswitches: 0,
           dev_char_rule: {path: /etc/udev/rules.d/71-nvidia-dev-char.rules, state: absent, parent_exists: true}}
loaded_config:
  description:
    - The config containerd loads (k3s/rke2 regenerate it at every start), whether it exists, and the runtime
      handlers it declares as tables, counting the files it imports - what a person checks by reading it after a restart.
  returned: success
  type: dict
  sample: {path: /var/lib/rancher/k3s/agent/etc/containerd/config.toml, exists: true, runtimes: [nvidia, nvidia-cdi, runc], files: []}
cdi:
  description:
    - CDI spec directories, the specs found (path, kind, version, device names, C(sha1) of the file, and
      C(generated_by_collection) - whether it starts with the marker line of a spec the C(gpu_node) role generated),
      and the nvidia.com/gpu devices.
  returned: success
  type: dict
toolkit:
  description:
    - NVIDIA container toolkit version (from dpkg status or C(nvidia-ctk --version)) and the nvidia-ctk path.
    - C(cdi_refresh) - the toolkit's C(nvidia-cdi-refresh.path) unit file (1.18 and newer; null when absent) and whether
      it is enabled (linked into C(multi-user.target.wants)).
  returned: success
  type: dict
  sample: {version: 1.20.0-1, version_source: dpkg, nvidia_ctk: /usr/bin/nvidia-ctk,
           cdi_refresh: {unit: /lib/systemd/system/nvidia-cdi-refresh.path, enabled: true}}
gpu_operator:
  description:
    - GPU Operator layout - whether C(/usr/local/nvidia/toolkit) holds runtime binaries (C(present),
      C(runtime_binaries)), which of the node's NVIDIA runtimes run them (C(runtimes); each is the
      handler of the RuntimeClass of the same name), and whether the operator's driver container root exists
      (C(driver_container)).
  returned: success
  type: dict
  sample:
    toolkit_dir: /usr/local/nvidia/toolkit
    present: true
    runtime_binaries: [nvidia-container-runtime, nvidia-container-runtime.cdi]
    runtimes: [nvidia, nvidia-cdi]
    driver_container: false
host_toolkit:
  description:
    - NVIDIA runtime binaries of a toolkit installed on the host itself (service PATH and O(toolkit_dirs), the
      operator's directory left out). k3s searches the operator's directory first, so with both on a node the
      host's binaries are masked; the C(gpu_node) role refuses that state.
  returned: success
  type: dict
  sample:
    present: true
    runtime_binaries: [/usr/bin/nvidia-container-runtime]
files:
  description:
    - State, mode, size, owner, modification time (C(mtime), seconds since the epoch) and version line of the
      templates, drop-ins and configs (text too with O(include_content)).
    - C(<key>_orig) and C(<key>_record) for a template or plain config - the copy of its bytes before the C(gpu_node)
      role's first edit (C(<file>.k3s-gpu-nvidia.orig)) and the SHA-256 of the text the role last left
      (C(<file>.k3s-gpu-nvidia.sha256)).
  returned: success
  type: dict
other_dropins:
  description:
    - The other C(*.toml) drop-ins of the containerd drop-in directories this collection writes into (C(conf.d) of plain
      containerd, C(config-v3.toml.d) and C(config.toml.d) of k3s/rke2), in import order, as RV(files) entries (text
      too with O(include_content)). A default runtime one of them names is what new runtimes inherit from.
  returned: success
  type: list
  elements: dict
manifests:
  description:
    - The manifests this collection writes into a k3s/rke2 server's manifests directory (the GPU Operator and device plugin
      HelmCharts, the RuntimeClasses), by file name, as RV(files) entries without text and with C(sha256), the SHA-256 of
      a file's bytes. On an agent every one is V(absent); empty for plain containerd.
    - The fleet run (k3s_gpu.nvidia.site) compares them with what it would write, so that an unchanged cluster costs no
      module execution.
  returned: success
  type: dict
  sample:
    k3s-gpu-nvidia-runtimeclasses.yaml: {path: /var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml,
                                         state: file, mode: "0600", sha256: 3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855}
binaries:
  description: For each path in O(binaries), its state (V(file), V(absent), V(dangling), V(directory), V(relative)) and executable bit.
  returned: success
  type: dict
plan:
  description:
    - What M(k3s_gpu.nvidia.containerd_runtimes) would do for the NVIDIA runtimes found, with its default options -
      target mode (V(dropin), V(template), V(config)), path, schema, the runtimes to write, those skipped and why.
    - When nothing can be written safely, C(plan.error) says why.
  returned: when O(include_plan) is true
  type: dict
  sample:
    mode: template
    path: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl
    schema: 3
    write: [{name: nvidia-legacy, binary: /usr/bin/nvidia-container-runtime.legacy, runtime_type: io.containerd.runc.v2}]
    skip: [{name: nvidia, reason: k3s v1.31.6+k3s1 detects /usr/bin/nvidia-container-runtime and renders this runtime itself}]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import RUNTIME_INFO_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, shown


def _check_root(root):
    """A root that is no directory reads as a node without anything (and the role would create it): refused."""
    if not os.path.isdir(root or "/"):
        raise K3sGpuError("{root}: %s is not a directory on the node" % shown(root), variable="root",
                          fix="create the sandbox tree first, or set {root} to / for the node itself")


def main():
    module = AnsibleModule(argument_spec=RUNTIME_INFO_SPEC, supports_check_mode=True)
    params = module.params
    try:
        _check_root(params["root"])
        facts = detect.gather(
            root=params["root"], distribution=params["distribution"], release=params["release"],
            data_dir=params["data_dir"], toolkit_dirs=params["toolkit_dirs"], binaries=params["binaries"],
            path=params["path"], run_command=lambda argv: module.run_command(argv, check_rc=False),
            newer_release=params["newer_release"])
    except K3sGpuError as exc:
        module.fail_json(msg=exc.text(), error=exc.as_dict())
    if facts["profile"].get("assumed_warning"):
        module.warn(facts["profile"]["assumed_warning"])
    result = dict(facts if params["include_content"] else detect.strip_content(facts))
    if params["include_plan"]:
        result["plan"] = _plan(facts, params["path"])
    if facts["known_bad_release"]:
        module.warn("%s %s: %s" % (facts["distribution"], facts["release"], facts["known_bad_release"]))
    read_options = dict((key, params[key]) for key in RUNTIME_INFO_SPEC)
    module.exit_json(changed=False, read_options=read_options, **result)


def _plan(facts, path):
    """What containerd_runtimes would do with its default options. Imported here: a node read without it (the role's
    every run) does not compile the planner."""
    from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
    try:
        return planner.summarize(planner.make_plan(facts, path=path))
    except K3sGpuError as exc:
        return {"error": str(exc)}


if __name__ == "__main__":
    main()
