# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Argument specs shared by the modules and the action plugin. PRIVATE to the collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule

NODE_OPTIONS = dict(
    root=dict(type="path", default="/"),
    distribution=dict(type="str", default="auto", choices=["auto", "k3s", "rke2", "containerd"]),
    release=dict(type="str"),
    data_dir=dict(type="path"),
    toolkit_dirs=dict(type="list", elements="path", default=[]),
    # a release of a line newer than the feature table: refuse, or proceed on the newest known line
    newer_release=dict(type="str", default="refuse", choices=["refuse", "assume_newest_known"]),
)

RUNTIME_INFO_SPEC = dict(
    NODE_OPTIONS,
    path=dict(type="path"),
    binaries=dict(type="list", elements="path", default=[]),
    include_content=dict(type="bool", default=False),
    include_plan=dict(type="bool", default=True),
)

RUNTIME_SPEC = dict(
    name=dict(type="str", required=True),
    binary=dict(type="str"),
    runtime_type=dict(type="str", default="io.containerd.runc.v2"),
    options=dict(type="dict", default={}),
    systemd_cgroup=dict(type="bool"),
)

CONTAINERD_RUNTIMES_SPEC = dict(
    NODE_OPTIONS,
    runtimes=dict(type="list", elements="dict", options=RUNTIME_SPEC),
    state=dict(type="str", default="present", choices=["present", "absent"]),
    default_runtime=dict(type="str"),
    enable_cdi=dict(type="bool"),
    allocation=dict(type="str", default="device_plugin", choices=["device_plugin", "dra"]),
    handler_labels=dict(type="bool"),
    node_labels=dict(type="list", elements="str"),
    node_facts=dict(type="dict"),
    path=dict(type="path"),
    validate=dict(type="str"),
    backup=dict(type="bool", default=False),
    target_release=dict(type="str"),
    normalize_encoding=dict(type="bool", default=False),
)

# k3s_gpu.nvidia.node_files: one entry per file
NODE_FILE_SPEC = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", default="file", choices=["file", "absent", "tidy"]),
    content=dict(type="str"),
    expected_state=dict(type="str", choices=["absent", "file"]),
    expected_sha1=dict(type="str"),
    backup=dict(type="bool", default=False),
    validate=dict(type="str"),
    mode=dict(type="raw"),
    owner=dict(type="str"),
    group=dict(type="str"),
    seuser=dict(type="str"),
    serole=dict(type="str"),
    setype=dict(type="str"),
    selevel=dict(type="str"),
    attributes=dict(type="str", aliases=["attr"]),
    unsafe_writes=dict(type="bool", default=False),
    directory_mode=dict(type="raw", default="0700"),
    remove_empty_parent=dict(type="bool", default=False),
    backup_to=dict(type="path"),
    backup_keep=dict(type="int", default=0),
    backup_root=dict(type="path"),
    drop_backups=dict(type="bool", default=False),
    prune_parents_to=dict(type="path"),
)

NODE_FILES_SPEC = dict(files=dict(type="list", elements="dict", required=True, options=NODE_FILE_SPEC),
                       root=dict(type="path", default="/"))

# The controller's actions (plugins/action): each module file documents the action with this spec, and the action
# validates its arguments with it, so that a bad value is refused by name before anything runs.
GPU_NODE_HOST_SPEC = dict(
    phase=dict(type="str", default="plan",
               choices=["plan", "probe", "reread", "configure", "restart", "upgrade_check", "doctor"]),
    node=dict(type="dict"),
    fail=dict(type="bool", default=True),
)
GPU_NODE_HOST_REQUIRED_IF = [("phase", "reread", ("node",)), ("phase", "configure", ("node",))]

CLUSTER_OBJECTS = ["gpu_operator", "runtimeclasses", "device_plugin"]
GPU_CLUSTER_SPEC = dict(
    phase=dict(type="str", default="apply", choices=["plan", "read", "apply", "inspect"]),
    hosts=dict(type="list", elements="str", default=[]),
    pattern_hosts=dict(type="list", elements="str", default=[]),
    servers=dict(type="list", elements="str", default=[]),
    servers_pattern=dict(type="str", default="server"),
    cluster=dict(type="dict"),
    objects=dict(type="list", elements="str", choices=CLUSTER_OBJECTS, default=list(CLUSTER_OBJECTS)),
    skip_unchanged=dict(type="bool", default=False),
)
GPU_CLUSTER_REQUIRED_IF = [("phase", "apply", ("cluster",)), ("phase", "inspect", ("cluster",))]

GPU_NODE_PACKAGES_SPEC = dict(
    source=dict(type="str", default="toolkit", choices=["toolkit", "driver"]),
    state=dict(type="str", default="present", choices=["present", "absent"]),
    remove_source=dict(type="bool", default=False),
)

FLEET_SUMMARY_SPEC = dict(
    hosts=dict(type="list", elements="str", required=True),
    clusters=dict(type="list", elements="dict", default=[]),
    report_path=dict(type="str", default=""),
)

VERIFY_IMAGE = "docker.io/library/ubuntu:24.04"  # needs only sh and ls: the toolkit mounts nvidia-smi and the libraries
GPU_VERIFY_SPEC = dict(
    phase=dict(type="str", default="choose", choices=["connect", "choose", "wait", "report"]),
    classes=dict(type="list", elements="dict", default=[]),
    nodes=dict(type="list", elements="dict", default=[]),
    wanted=dict(type="list", elements="str", default=[]),
    namespace=dict(type="str", default="k3s-gpu-verify"),
    image=dict(type="str", default=VERIFY_IMAGE),
    kubeconfig=dict(type="str"),
    timeout=dict(type="int", default=300),
    expected=dict(type="int", default=0),
    pods=dict(type="list", elements="dict", default=[]),
    events=dict(type="list", elements="dict", default=[]),
    logs=dict(type="list", elements="dict", default=[]),
    allocatable=dict(type="dict", default={}),
    problems=dict(type="list", elements="dict", default=[]),
    notes=dict(type="list", elements="str", default=[]),
    dra=dict(type="dict", default={}),
    claims=dict(type="list", elements="dict", default=[]),
)

GPU_DOCTOR_SPEC = dict(
    phase=dict(type="str", default="report", choices=["choose", "report"]),
    results=dict(type="dict", required=True),
    node_names=dict(type="dict", default={}),
    cluster=dict(type="dict"),
    cluster_why=dict(type="str", default="no cluster"),
    report_path=dict(type="path"),
    fail=dict(type="bool", default=True),
    # the pod layer (doctor_run_pod): the smoke pods' namespace, image and classes, then what they did
    namespace=dict(type="str", default="k3s-gpu-doctor"),
    image=dict(type="str", default=VERIFY_IMAGE),
    runtimeclasses=dict(type="list", elements="str", default=[]),
    pods=dict(type="list", elements="dict"),
    events=dict(type="list", elements="dict", default=[]),
    logs=dict(type="list", elements="dict", default=[]),
    claims=dict(type="list", elements="dict", default=[]),
)


def refuse_outside_action(message, argument_spec, required_if=None):
    """The main() of a module that documents an action plugin: the arguments checked, then the refusal."""
    AnsibleModule(argument_spec=argument_spec, required_if=required_if, supports_check_mode=True).fail_json(msg=message)


# k3s_gpu.nvidia.gpu_device_holders: procfs is the host's even for a sandbox root, so proc is not under root
GPU_DEVICE_HOLDERS_SPEC = dict(
    root=dict(type="path", default="/"),
    proc=dict(type="path", default="/proc"),
)

GPU_ROLLOUT_SPEC = dict(
    phase=dict(type="str", required=True, choices=["classify", "drain", "prove", "plan"]),
    probe=dict(type="dict", default={}),
    removal_probe=dict(type="dict", default={}),
    resume=dict(type="bool", default=False),
    defer=dict(type="bool", default=False),
    reason=dict(type="str", default=""),
    clusters=dict(type="list", elements="dict", default=[]),
)
