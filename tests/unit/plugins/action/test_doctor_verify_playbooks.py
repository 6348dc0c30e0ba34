# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The doctor and verify playbooks as ansible-playbook runs them, without kubernetes.core and with a kubeconfig that
does not work (issue 41): one line says why, once; the doctor's node report arrives all the same; no module_defaults
error ends the run; a kubeconfig that is set and missing fails verify instead of a quiet run without a cluster. The
node is a sandbox tree and the API server a TLS server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins import kubeconfig_lab as lab
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.test__doctor import healthy

# where the unit tests import the collection from (.tmp/collections, or ansible-test's copy): ansible-playbook finds it
# there, and nothing else
COLLECTIONS = verify.__file__[:verify.__file__.index(os.sep + "ansible_collections" + os.sep)]
# ansible-playbook of the Ansible this test imports (ansible-test's venv has no ansible-playbook script)
PLAYBOOK = [sys.executable, "-m", "ansible.cli.playbook"]


def run(tmp_path, playbook, hosts, **extra_vars):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("".join("%s ansible_connection=local ansible_python_interpreter=%s %s\n" % (
        host, sys.executable, " ".join("%s=%s" % item for item in host_vars.items())) for host, host_vars in hosts.items()))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="false",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("K8S_AUTH_KUBECONFIG", None)
    command = PLAYBOOK + ["-i", str(inventory), "k3s_gpu.nvidia." + playbook, "-e", json.dumps(extra_vars)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_doctor_without_kubernetes_core_reports_its_nodes_and_says_what_to_install_once(tmp_path, sandbox):
    healthy(sandbox)
    authority = lab.Authority()
    node = {"gpu_node_root": sandbox.root, "gpu_node_distribution": "k3s", "gpu_node_release": "v1.34.6+k3s1"}
    with lab.TlsServer(authority.server(tmp_path)) as server:
        rc, out = run(tmp_path, "doctor", {"gpu1": node}, doctor_report_path=str(tmp_path / "report.json"),
                      k3s_gpu_kubeconfig=lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert rc == 2, out
    assert out.count("ansible-galaxy collection install kubernetes.core") == 1, out
    assert "Error loading module_defaults" not in out and "Error loading plugin" not in out, out
    report = json.loads((tmp_path / "report.json").read_text())
    assert [n["host"] for n in report["nodes"]] == ["gpu1"] and report["nodes"][0]["passed"], report
    assert '"gpu1: passed gpu (1 NVIDIA GPU(s) on the PCI bus); driver (' in out, out


@pytest.mark.parametrize("kubeconfig,words", [
    ("missing.yaml", "missing.yaml: no such file. Fix: set k3s_gpu_kubeconfig"),
    ("binary.yaml", "binary.yaml: not a kubeconfig: not UTF-8 text (byte 0 is not)"),
], ids=["does not exist", "not a kubeconfig"])
def test_verify_with_a_kubeconfig_that_does_not_work_fails_in_one_line_and_reads_nothing(tmp_path, kubeconfig, words):
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe" + lab.SECRET_TOKEN.encode())
    rc, out = run(tmp_path, "verify", {"localhost": {}}, k3s_gpu_kubeconfig=str(tmp_path / kubeconfig))
    assert rc == 2 and words in out, out
    # Ansible shows a failed task's message twice ([ERROR] and the result): no third copy, no client text, no secret
    assert out.count(words) == 2 and "No cluster" not in out and lab.SECRET_TOKEN not in out, out
    assert "codec can't decode" not in out and "Error loading module_defaults" not in out, out
