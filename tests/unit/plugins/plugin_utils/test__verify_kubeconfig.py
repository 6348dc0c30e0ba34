# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kubeconfig's check before verify and the doctor read a cluster (issue 41): each way one breaks is one line that
names the file, what is wrong and the fix, and quotes nothing of it (no token, no key, no line). The API servers are
real TLS servers on 127.0.0.1 (kubeconfig_lab); a closed port stands for a server that is down."""

from __future__ import annotations

import os
import socket

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins import kubeconfig_lab as lab


def refusal(path, **kwargs):
    """The one line the check says about `path`."""
    with pytest.raises(K3sGpuError) as caught:
        verify.check_kubeconfig(path, **kwargs)
    line = verify.error_line(caught.value)
    assert "\n" not in line and line.startswith("kubeconfig %s: " % path) and line.count(". Fix: ") == 1, line
    for secret in (lab.SECRET_TOKEN, lab.SECRET_KEY, "SECRET"):
        assert secret not in line, line
    return line


@pytest.fixture(name="authority", scope="module")
def fixture_authority():
    return lab.Authority()


# ------------------------------------------------------------------ the file
def test_a_kubeconfig_that_does_not_exist_is_named_with_the_variable_to_set(tmp_path):
    line = refusal(str(tmp_path / "k3s.yaml"))
    assert ": no such file. Fix: set k3s_gpu_kubeconfig (or K8S_AUTH_KUBECONFIG) to the cluster's kubeconfig" in line


def test_a_directory_is_not_a_kubeconfig(tmp_path):
    assert ": a directory, not a file. Fix: " in refusal(str(tmp_path))


def test_a_kubeconfig_this_user_may_not_read(tmp_path, monkeypatch):
    def denied(*_args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify, "open", denied, raising=False)  # root reads a file of mode 000 all the same
    assert ": this user may not read it (permission denied). Fix: make it readable" in refusal(str(tmp_path / "k3s.yaml"))


@pytest.mark.parametrize("content,words", [
    (b"\xff\xfe\x00\x01binary " + lab.SECRET_TOKEN.encode(), "not a kubeconfig: not UTF-8 text (byte 0 is not)"),
    (b"apiVersion: v1\nusers:\n- user: {token: " + lab.SECRET_TOKEN.encode() + b"\n  : [", "not a kubeconfig: not YAML (line "),
    (b"- just\n- a list\n", "not a kubeconfig: no clusters, contexts or current-context in it"),
    (b"token: " + lab.SECRET_TOKEN.encode() + b"\n", "not a kubeconfig: no clusters, contexts or current-context in it"),
    (b"", "not a kubeconfig: no clusters, contexts or current-context in it"),
], ids=["binary bytes", "not YAML", "a YAML list", "YAML of something else", "empty"])
def test_a_file_that_is_not_a_kubeconfig_says_so_without_quoting_it(tmp_path, content, words):
    path = tmp_path / "k3s.yaml"
    path.write_bytes(content)
    line = refusal(str(path))
    assert words in line and "k3s.yaml (rke2: /etc/rancher/rke2/rke2.yaml)" in line, line


def _without_current_context(tmp_path):
    path = lab.kubeconfig(tmp_path, lab.closed_port_url())
    text = open(path).read().replace("current-context: default\n", "")
    with open(path, "w") as handle:
        handle.write(text)
    return path


def test_a_kubeconfig_without_current_context_says_how_to_choose_one(tmp_path):
    path = _without_current_context(tmp_path)
    assert "it sets no current-context, so it names no cluster. Fix: kubectl config use-context <context> " \
           "--kubeconfig %s" % path in refusal(path)


def test_k8s_auth_context_names_the_context_where_the_file_sets_none(tmp_path):
    # the cluster is reached, so the check goes on to its server (down here)
    assert "refuses connections" in refusal(_without_current_context(tmp_path), context="default")


@pytest.mark.parametrize("old,new,words", [
    ("current-context: default", "current-context: other", "its context other is not in the file"),
    ("    cluster: default\n    user:", "    cluster: gone\n    user:", "names the cluster gone, which the file does not have"),
    ("    server: https", "    server: ftp", "the cluster default has no https:// server address"),
    ("    server: https://127.0.0.1:", "    server: https://127.0.0.1:x", "the cluster default has no https:// server address"),
], ids=["context not in the file", "cluster not in the file", "server not https", "server port not a number"])
def test_a_kubeconfig_that_names_nothing_it_has(tmp_path, old, new, words):
    path = lab.kubeconfig(tmp_path, lab.closed_port_url())
    text = open(path).read()
    assert old in text
    with open(path, "w") as handle:
        handle.write(text.replace(old, new))
    assert words in refusal(path)


# ------------------------------------------------------------------ the API server
def test_an_api_server_that_is_down_is_unreachable(tmp_path):
    url = lab.closed_port_url()
    line = refusal(lab.kubeconfig(tmp_path, url))
    assert "the API server %s is unreachable: it refuses connections (nothing listens there). Fix: start k3s/rke2 on the " \
           "server" % url in line
    assert "HTTPSConnectionPool" not in line and "Errno" not in line


@pytest.mark.parametrize("error,words", [
    (socket.gaierror(-2, "Name or service not known"), "the host name of its API server https://k3s.invalid:6443 does not resolve"),
    (socket.timeout("timed out"), "the API server https://k3s.invalid:6443 is unreachable: no answer within 5 s"),
    (OSError(113, "No route to host"), "the API server https://k3s.invalid:6443 is unreachable (No route to host)"),
], ids=["no such name", "no answer", "no route"])
def test_a_server_that_cannot_be_reached_otherwise(tmp_path, monkeypatch, error, words):
    """What the network says, without asking it (no resolver, no other host is reached from a test)."""
    def connect(address, timeout):
        assert address == ("k3s.invalid", 6443) and timeout == verify.CONNECT_SECONDS
        raise error

    monkeypatch.setattr(verify.socket, "create_connection", connect)
    line = refusal(lab.kubeconfig(tmp_path, "https://k3s.invalid:6443"))
    assert words in line and "Fix: start k3s/rke2 on the server" in line, line


def test_a_server_whose_certificate_the_kubeconfig_does_not_trust(tmp_path, authority):
    other = lab.Authority("another-cluster-ca")
    with lab.TlsServer(other.server(tmp_path)) as server:
        line = refusal(lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert "the API server %s presents a certificate that the kubeconfig does not trust (" % server.url in line
    assert "Fix: copy the kubeconfig again from a server of this cluster" in line


def test_a_server_whose_certificate_has_expired(tmp_path, authority):
    with lab.TlsServer(authority.server(tmp_path, valid_from=-30, valid_until=-1)) as server:
        line = refusal(lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert "the API server %s presents a certificate that has expired. Fix: k3s and rke2 renew" % server.url in line


def test_a_server_whose_certificate_is_not_valid_yet(tmp_path, authority):
    with lab.TlsServer(authority.server(tmp_path, valid_from=2, valid_until=30)) as server:
        line = refusal(lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert "presents a certificate that is not valid yet: a clock is wrong" in line


def test_a_server_whose_certificate_names_another_host(tmp_path, authority):
    with lab.TlsServer(authority.server(tmp_path, names=("k3s.example",))) as server:
        line = refusal(lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert "the API server's certificate is not valid for %s. Fix: set server: to a name" % server.url in line


def test_a_server_that_does_not_speak_tls(tmp_path, authority):
    with lab.TlsServer(None) as server:
        line = refusal(lab.kubeconfig(tmp_path, server.url, authority.pem))
    assert "the TLS handshake with the API server %s failed (" % server.url in line


def test_certificate_authority_data_that_is_not_a_certificate(tmp_path):
    path = lab.kubeconfig(tmp_path, lab.closed_port_url(), b"not a certificate")
    assert "its certificate-authority-data is not a PEM certificate" in refusal(path)


def test_a_server_the_kubeconfig_trusts_passes(tmp_path, authority):
    with lab.TlsServer(authority.server(tmp_path)) as server:
        assert verify.check_kubeconfig(lab.kubeconfig(tmp_path, server.url, authority.pem)) == server.url


def test_a_certificate_authority_file_beside_the_kubeconfig_is_read_from_there(tmp_path, authority):
    (tmp_path / "ca.crt").write_bytes(authority.pem)
    with lab.TlsServer(authority.server(tmp_path)) as server:
        path = lab.kubeconfig(tmp_path, server.url, **{"certificate-authority": "ca.crt"})
        assert verify.check_kubeconfig(path) == server.url
        os.remove(str(tmp_path / "ca.crt"))
        assert "its certificate-authority ca.crt cannot be read (No such file or directory)" in refusal(path)


def test_insecure_skip_tls_verify_is_honoured_as_the_client_honours_it(tmp_path, authority):
    with lab.TlsServer(lab.Authority("unknown").server(tmp_path)) as server:
        path = lab.kubeconfig(tmp_path, server.url, **{"insecure-skip-tls-verify": True})
        assert verify.check_kubeconfig(path) == server.url


def test_a_server_behind_a_proxy_is_left_to_the_client(tmp_path):
    url = lab.closed_port_url()
    assert verify.check_kubeconfig(lab.kubeconfig(tmp_path, url, **{"proxy-url": "http://127.0.0.1:3128"})) == url
    assert verify.check_kubeconfig(lab.kubeconfig(tmp_path, url), proxied=True) == url


def test_a_server_address_with_a_password_is_shown_without_it(tmp_path):
    url = lab.closed_port_url()
    line = refusal(lab.kubeconfig(tmp_path, url.replace("https://", "https://admin:SECRET@") + "/k8s"))
    assert "the API server %s is unreachable" % url in line


# ------------------------------------------------------------------ a read that fails after the check
@pytest.mark.parametrize("message,words", [
    ("Failed to import the required Python library (kubernetes) on ctl's Python /usr/bin/python3. Please read the module "
     "documentation", "the Python kubernetes client that kubernetes.core needs is not installed in /usr/bin/python3. "
                      "Fix: pip install kubernetes into that Python"),
    ("Failed to get client due to (401)\nReason: Unauthorized\nHTTP response headers: ...",
     "the API server refuses the kubeconfig's credentials (401 Unauthorized)"),
    ("Failed to get client due to (403)\nReason: Forbidden", "the kubeconfig's user may not list Nodes (403 Forbidden)"),
    ("HTTPSConnectionPool(host='10.0.0.1', port=6443): Max retries exceeded with url: /version (Caused by "
     "NewConnectionError(...: [Errno 111] Connection refused))", "the API server is unreachable. Fix: start k3s/rke2"),
    ("Could not create API client: Invalid kube-config file. Expected key current-context in ********",
     "not a kubeconfig kubernetes.core can read"),
])
def test_a_failed_read_is_one_cause_and_fix_not_the_clients_text(message, words):
    line = verify.error_line(verify.read_error("Node", message, "/k/k3s.yaml"))
    assert line.startswith("kubeconfig /k/k3s.yaml: reading the Nodes failed: ") and words in line, line
    assert "\n" not in line and "HTTPSConnectionPool" not in line and "Reason:" not in line


def test_a_failed_read_of_another_kind_keeps_its_first_line_once_and_cut():
    line = verify.error_line(verify.read_error("Pod", "the server could not find the requested resource\n" + "x" * 500))
    assert line.startswith("reading the Pods through kubernetes.core failed: the server could not find the requested "
                           "resource. Fix: kubectl") and "xxx" not in line


def test_a_read_of_runtimeclasses_names_them_in_the_plural():
    assert "the kubeconfig's user may not list RuntimeClasses (403 Forbidden)" in verify.error_line(
        verify.read_error("RuntimeClass", "(403)\nReason: Forbidden"))
