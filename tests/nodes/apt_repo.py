#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Local signed apt repositories of STAND-IN NVIDIA container toolkit packages (standin_debs.py).

    apt_repo.py build [--force]     # both repos; cached (rebuilt when this code changes)
    apt_repo.py info NAME           # repo.json: source line, keyring, fingerprint, versions

Layout, flat like NVIDIA's https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /:
  .cache/nodes/apt-repo/<name>/stable/deb/amd64/{*.deb,Packages,Packages.gz,Release,Release.gpg,InRelease}
  .cache/nodes/apt-repo/<name>/{gpgkey (armored, like NVIDIA's URL), keyring.gpg (binary), fingerprint, repo.json}
Nodes see .cache/nodes/apt-repo at /srv/nvidia-repo (read-only bind), so the apt source is
  deb [signed-by=KEYRING] file:/srv/nvidia-repo/good/stable/deb/$(ARCH) /
Repos: `good` (signed with the `good` key) and `wrongkey` (same packages, signed with the `other` key):
with signed-by = good's keyring, `apt-get update` of `wrongkey` fails (NO_PUBKEY). Keys are made
once with gpg in batch mode (no passphrase) and kept in .cache/nodes/apt-keys/.
Repo `cuda` (the `cuda` key) stands for NVIDIA's CUDA repository of Debian 12, laid out like
https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ with its key next to the
packages as 3bf863cc.pub: the stand-in driver packages of standin_driver_debs.py.
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import standin_debs  # noqa: E402  pylint: disable=wrong-import-position
import standin_driver_debs  # noqa: E402  pylint: disable=wrong-import-position

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("K3S_GPU_NODES_CACHE", str(HERE.parent.parent / ".cache" / "nodes")))
REPO_ROOT = CACHE / "apt-repo"
KEY_DIR = CACHE / "apt-keys"
NODE_MOUNT = "/srv/nvidia-repo"
VERSIONS = ("1.17.8-1", "1.18.0-1", "1.20.0-1")  # 1.20.0-1: the role's default pin
REPOS = {"good": "good", "wrongkey": "other"}  # repo -> signing key
DIST = "stable/deb"
CUDA_REPO, CUDA_KEY = "cuda", "cuda"
CUDA_DIST = "compute/cuda/repos/debian12"
CUDA_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}
CUDA_KEY_FILE = "3bf863cc.pub"  # where NVIDIA's CUDA repository keeps its key


def arch():
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def build_deb(pkg, version, architecture, out_dir, work):
    """dpkg-deb --build one package; return the .deb path."""
    root = Path(work) / ("%s_%s" % (pkg["name"], version))
    for rel, (text, mode) in pkg["files"].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    for rel, target in pkg.get("links", {}).items():
        (root / rel).symlink_to(target)
    control = ["Package: " + pkg["name"], "Version: " + version, "Architecture: " + architecture,
               "Maintainer: k3s_gpu.nvidia tests <tests@k3s-gpu.invalid>", "Section: utils", "Priority: optional",
               "Homepage: https://github.com/NVIDIA/nvidia-container-toolkit"]
    if pkg["depends"]:
        control.append("Depends: " + pkg["depends"])
    if pkg.get("conflicts"):
        control.append("Conflicts: " + pkg["conflicts"])
    control.append("Description: STAND-IN for %s (k3s_gpu.nvidia tests)\n shell stubs, no GPU code" % pkg["name"])
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if pkg.get("conffiles"):
        (root / "DEBIAN/conffiles").write_text("\n".join(pkg["conffiles"]) + "\n")
    deb = Path(out_dir) / ("%s_%s_%s.deb" % (pkg["name"], version, architecture))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def _hashes(data):
    return {name: hashlib.new(name, data).hexdigest() for name in ("md5", "sha1", "sha256")}


def write_indexes(dist_dir):
    """Packages, Packages.gz and an unsigned Release for a flat repo."""
    stanzas = []
    for deb in sorted(dist_dir.glob("*.deb")):
        data = deb.read_bytes()
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        digest = _hashes(data)
        stanzas.append(control.rstrip("\n") + "\nFilename: ./%s\nSize: %d\nMD5sum: %s\nSHA1: %s\nSHA256: %s\n" % (
            deb.name, len(data), digest["md5"], digest["sha1"], digest["sha256"]))
    packages = "\n".join(stanzas).encode()
    (dist_dir / "Packages").write_bytes(packages)
    (dist_dir / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    release = ["Origin: k3s_gpu.nvidia tests", "Label: stand-in libnvidia-container",
               "Date: " + email.utils.formatdate(usegmt=True)]
    files = {name: (dist_dir / name).read_bytes() for name in ("Packages", "Packages.gz")}
    for field, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        release.append(field + ":")
        release += [" %s %d %s" % (_hashes(data)[algo], len(data), name) for name, data in files.items()]
    (dist_dir / "Release").write_text("\n".join(release) + "\n")


class Gpg:
    """A throw-away GNUPGHOME holding one cached signing key (made once, no passphrase)."""

    key_dir = KEY_DIR  # where the key is cached between runs
    key_kind = "repo"
    key_algo = "ed25519"

    def __init__(self, key_name):
        self.key_name = key_name
        self.home = tempfile.mkdtemp(prefix="k3sgpu-gpg-")  # short path: gpg-agent's socket lives here

    def __enter__(self):
        secret = self.key_dir / (self.key_name + ".secret.asc")
        if not secret.exists():
            self.key_dir.mkdir(parents=True, exist_ok=True)
            uid = "k3s_gpu.nvidia stand-in %s key (%s) <%s@k3s-gpu.invalid>" % (self.key_kind, self.key_name, self.key_name)
            self.run("--passphrase", "", "--quick-gen-key", uid, self.key_algo, "sign", "never")
            secret.write_bytes(self.run("--armor", "--export-secret-keys"))
        else:
            self.run("--import", str(secret))
        return self

    def __exit__(self, *exc):
        subprocess.run(["gpgconf", "--homedir", self.home, "--kill", "all"], capture_output=True, check=False)
        shutil.rmtree(self.home, ignore_errors=True)

    def run(self, *args):
        argv = ["gpg", "--homedir", self.home, "--batch", "--yes", "--pinentry-mode", "loopback"] + list(args)
        return subprocess.run(argv, capture_output=True, check=True).stdout

    def fingerprint(self):
        lines = self.run("--with-colons", "--list-secret-keys").decode().splitlines()
        return next(line.split(":")[9] for line in lines if line.startswith("fpr:"))


def _sign_and_publish(name, key_name, tmp, dist_dir, extra_key_file=None):
    """Sign dist_dir's Release, export the key, write repo.json fields common to every repo; move into place."""
    write_indexes(dist_dir)
    with Gpg(key_name) as gpg:
        gpg.run("--clearsign", "-o", str(dist_dir / "InRelease"), str(dist_dir / "Release"))
        gpg.run("--armor", "--detach-sign", "-o", str(dist_dir / "Release.gpg"), str(dist_dir / "Release"))
        (tmp / "gpgkey").write_bytes(gpg.run("--armor", "--export"))
        (tmp / "keyring.gpg").write_bytes(gpg.run("--export"))
        if extra_key_file:
            (dist_dir / extra_key_file).write_bytes(gpg.run("--armor", "--export"))
        fingerprint = gpg.fingerprint()
    (tmp / "fingerprint").write_text(fingerprint + "\n")
    return fingerprint


def _finish(tmp, name, repo):
    repo["source_line"] = "deb [signed-by=%s] %s %s" % (repo["keyring"], repo["url"], repo["suite"])
    (tmp / "repo.json").write_text(json.dumps(repo, indent=1) + "\n")
    for path in [tmp] + list(tmp.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the node's apt reads as _apt
    final = REPO_ROOT / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return repo


def build_repo(name, key_name, versions=VERSIONS):
    """Build (replace) one toolkit repo; return its repo.json content."""
    architecture = arch()
    REPO_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".%s-" % name, dir=REPO_ROOT))
    dist_dir = tmp / DIST / architecture
    dist_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        for version in versions:
            for pkg in standin_debs.packages(version):
                build_deb(pkg, version, architecture, dist_dir, work)
    fingerprint = _sign_and_publish(name, key_name, tmp, dist_dir)
    node_dir = "%s/%s" % (NODE_MOUNT, name)
    repo = {"name": name, "key": key_name, "fingerprint": fingerprint, "versions": list(versions),
            "packages": [p["name"] for p in standin_debs.packages(versions[0])],
            "url": "file:%s/%s/$(ARCH)" % (node_dir, DIST), "suite": "/",
            "gpgkey_url": "file://%s/gpgkey" % node_dir, "keyring": node_dir + "/keyring.gpg",
            "host_dir": str(REPO_ROOT / name)}
    return _finish(tmp, name, repo)


def build_cuda_repo():
    """The stand-in of NVIDIA's CUDA repository for Debian 12 (driver packages); return repo.json."""
    architecture = arch()
    cuda_arch = CUDA_ARCH.get(architecture, architecture)
    REPO_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".%s-" % CUDA_REPO, dir=REPO_ROOT))
    dist_dir = tmp / CUDA_DIST / cuda_arch
    dist_dir.mkdir(parents=True)
    kernel = os.uname().release  # the nodes run on the host's kernel
    with tempfile.TemporaryDirectory() as work:
        for pkg, version in standin_driver_debs.all_packages(kernel):
            build_deb(pkg, version, architecture, dist_dir, work)
    fingerprint = _sign_and_publish(CUDA_REPO, CUDA_KEY, tmp, dist_dir, extra_key_file=CUDA_KEY_FILE)
    node_dir = "%s/%s" % (NODE_MOUNT, CUDA_REPO)
    url = "file:%s/%s/%s" % (node_dir, CUDA_DIST, cuda_arch)
    repo = {"name": CUDA_REPO, "key": CUDA_KEY, "fingerprint": fingerprint,
            "versions": list(standin_driver_debs.VERSIONS), "kernel": kernel,
            "url": url, "suite": "/", "gpgkey_url": url.replace("file:", "file://", 1) + "/" + CUDA_KEY_FILE,
            "keyring": node_dir + "/keyring.gpg", "host_dir": str(REPO_ROOT / CUDA_REPO)}
    return _finish(tmp, CUDA_REPO, repo)


def _stamp():
    code = b"".join((HERE / f).read_bytes() for f in ("apt_repo.py", "standin_debs.py", "standin_driver_debs.py"))
    return hashlib.sha256(code + repr((VERSIONS, sorted(REPOS.items()), os.uname().release)).encode()).hexdigest()


def cached_build(repo_root, names, stamp_value, build, force=False):
    """{name: repo.json} of the repos under repo_root: cached ones when the stamp matches, else build()."""
    stamp = repo_root / ".stamp"
    if not force and stamp.exists() and stamp.read_text().strip() == stamp_value and all(
            (repo_root / n / "repo.json").exists() for n in names):
        return {n: json.loads((repo_root / n / "repo.json").read_text()) for n in names}
    result = build()
    stamp.write_text(stamp_value + "\n")
    return result


def repo_cli(argv, doc, names, build_all, describe):
    """`build [--force]` (one line per repo from describe(repo)) and `info NAME` (repo.json)."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("--force", action="store_true")
    sub.add_parser("info").add_argument("name", choices=sorted(names))
    args = parser.parse_args(argv)
    if args.command == "build":
        for name, repo in build_all(args.force).items():
            print("%s: %s" % (name, describe(repo)))
    else:
        print(json.dumps(build_all()[args.name], indent=1))
    return 0


def build_all(force=False):
    """Build every repo unless the cached ones come from this code; return {name: repo.json}."""
    def build():
        result = {name: build_repo(name, key) for name, key in REPOS.items()}
        result[CUDA_REPO] = build_cuda_repo()
        return result
    return cached_build(REPO_ROOT, list(REPOS) + [CUDA_REPO], _stamp(), build, force)


def main(argv=None):
    return repo_cli(argv, __doc__, list(REPOS) + [CUDA_REPO], build_all,
                    lambda repo: "%s  (key %s)" % (repo["source_line"], repo["fingerprint"]))


if __name__ == "__main__":
    sys.exit(main())
