# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubeconfigs and API servers for the kubeconfig check's tests, all on this machine: certificates made with
cryptography (a CA, a server certificate it signs: valid, expired, not yet valid, for another name), a TLS server on
127.0.0.1 that makes the handshake and closes, a port where nothing listens. No request leaves the loopback."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import socket
import socketserver
import ssl
import threading

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# what a kubeconfig holds that no message may quote
SECRET_TOKEN = "k3s-gpu-SECRET-TOKEN-0123456789"
SECRET_KEY = base64.b64encode(b"-----BEGIN EC PRIVATE KEY-----\nSECRET-KEY\n").decode("ascii")
DAY = datetime.timedelta(days=1)


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(certificate):
    return certificate.public_bytes(serialization.Encoding.PEM)


class Authority:
    """A CA, and the server certificates it signs."""

    def __init__(self, common_name="k3s-server-ca"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.certificate = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
                            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                            .not_valid_before(now - DAY).not_valid_after(now + 365 * DAY)
                            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                            .sign(self.key, hashes.SHA256()))

    @property
    def pem(self):
        return _pem(self.certificate)

    def server(self, tmp_path, names=("127.0.0.1", "localhost"), valid_from=-1, valid_until=365):
        """(cert file, key file) of a server certificate for `names`, valid between these days from now."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        alternatives = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
        certificate = (x509.CertificateBuilder().subject_name(_name("k3s")).issuer_name(self.certificate.subject)
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now + valid_from * DAY).not_valid_after(now + valid_until * DAY)
                       .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
                       .sign(self.key, hashes.SHA256()))
        cert_file, key_file = tmp_path / "server.crt", tmp_path / "server.key"
        cert_file.write_bytes(_pem(certificate) + self.pem)
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return str(cert_file), str(key_file)


class _Handshake(socketserver.BaseRequestHandler):
    def handle(self):
        context = self.server.tls
        if context is None:
            return  # a plain TCP server: it closes without a word
        try:
            with context.wrap_socket(self.request, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refused the certificate: what the tests look for


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class TlsServer:
    """A server on 127.0.0.1 that makes the TLS handshake with `cert_key` (None: plain TCP) and closes."""

    def __init__(self, cert_key=None):
        self.server = _Server(("127.0.0.1", 0), _Handshake)
        self.server.tls = None
        if cert_key:
            self.server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.server.tls.load_cert_chain(*cert_key)
        self.url = "https://127.0.0.1:%d" % self.server.server_address[1]
        # a short poll: shutdown() waits for it
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url():
    """An https URL on 127.0.0.1 where nothing listens: a port the kernel gave and took back."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return "https://127.0.0.1:%d" % port


def kubeconfig(tmp_path, server, ca_pem=None, name="config.yaml", **cluster):
    """A kubeconfig like k3s.yaml (its user has a token and a client key), for `server`, trusting `ca_pem`."""
    entry = dict({"server": server}, **cluster)
    if ca_pem is not None:
        entry["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    document = {"apiVersion": "v1", "kind": "Config", "current-context": "default",
                "clusters": [{"name": "default", "cluster": entry}],
                "contexts": [{"name": "default", "context": {"cluster": "default", "user": "default"}}],
                "users": [{"name": "default", "user": {"token": SECRET_TOKEN, "client-key-data": SECRET_KEY}}]}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return str(path)
