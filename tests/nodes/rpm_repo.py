#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Local signed dnf/yum repositories of STAND-IN NVIDIA container toolkit RPMs (files from standin_debs.py).

    rpm_repo.py build [--force]     # both repos; cached (rebuilt when this code changes)
    rpm_repo.py info NAME           # repo.json: baseurl, gpgkey, fingerprint, versions, .repo text

Layout like NVIDIA's https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch:
  .cache/nodes/rpm-repo/<name>/stable/rpm/<arch>/{*.rpm, repodata/{repomd.xml, repomd.xml.asc, ...}}
  .cache/nodes/rpm-repo/<name>/{gpgkey (armored, like NVIDIA's URL), fingerprint, repo.json}
Repos: `good` (RPMs and repomd.xml signed with the `good` key) and `wrongkey` (same packages, signed with
the `other` key). Every RPM is signed (rpmsign --addsign) and repomd.xml has a detached armored signature,
so both gpgcheck=1 and repo_gpgcheck=1 work. Keys are RSA 4096 like NVIDIA's (signatures RSA/SHA512), made
once with gpg in batch mode (no passphrase) and kept in .cache/nodes/rpm-keys/.

Packages and dependencies as NVIDIA's spec files declare them (nvidia-container-toolkit
packaging/rpm/SPECS/nvidia-container-toolkit.spec at v1.17.8 / v1.18.0 (1.20.0 as 1.18.0), libnvidia-container
pkg/rpm/SPECS/libnvidia-container.spec), built as the same two source packages:
  libnvidia-container-tools  Requires libnvidia-container1(x86-64) >= its V-R
  nvidia-container-toolkit   Requires nvidia-container-toolkit-base == its V-R,
                             libnvidia-container-tools >= V-R (1.17.8) / == V-R (1.18.0+), < 2.0.0
  nvidia-container-toolkit-operator-extensions  Requires nvidia-container-toolkit-base == its V-R
plus NVIDIA's Provides/Obsoletes/Conflicts. So `dnf install nvidia-container-toolkit-1.17.8-1` alone
pulls libnvidia-container-tools and libnvidia-container1 1.20.0 (the newest): pin every package.
Deviations: no scriptlets (NVIDIA's %post/%posttrans need /bin/sh; an empty installroot has none), no
automatic Requires (the stubs are /bin/sh scripts), and config.toml is packaged as %config(noreplace)
instead of being written by -base's %post (`nvidia-ctk config`), so the files match the .deb stand-ins.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apt_repo  # noqa: E402  pylint: disable=wrong-import-position
import standin_debs  # noqa: E402  pylint: disable=wrong-import-position

HERE = Path(__file__).resolve().parent
CACHE = apt_repo.CACHE
REPO_ROOT = CACHE / "rpm-repo"
KEY_DIR = CACHE / "rpm-keys"
VERSIONS = ("1.17.8-1", "1.18.0-1", "1.20.0-1")  # 1.20.0-1: the role's default pin
REPOS = {"good": "good", "wrongkey": "other"}  # repo -> signing key
DIST = "stable/rpm"
NODE_MOUNT = "/srv/nvidia-rpm"
REPO_ID = "nvidia-container-toolkit"
# Debian packages that provide rpmbuild/rpmsign, createrepo_c, dnf (CLI and the python3-dnf that
# ansible.builtin.dnf respawns into) and gpg.
APT_PACKAGES = ("rpm", "createrepo-c", "gnupg")  # what the build needs on the host
# NVIDIA's source packages and the binary packages each builds (the first is the spec's main package
# where it has files; `libnvidia-container` itself has none, like NVIDIA's).
SOURCES = {"libnvidia-container": ("libnvidia-container1", "libnvidia-container-tools"),
           "nvidia-container-toolkit": ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                        "nvidia-container-toolkit-operator-extensions")}
OLD_RUNTIME = "nvidia-container-runtime <= 3.5.0-1, nvidia-container-runtime-hook <= 1.4.0-2"


def rpm_eval(macro):
    return subprocess.run(["rpm", "--eval", macro], capture_output=True, text=True, check=True).stdout.strip()


def tags(name, version):
    """Requires/Provides/Obsoletes/Conflicts lines of one package, as in NVIDIA's spec of that version."""
    vr = version
    # 1.17.x: `libnvidia-container-tools >= %{libnvidia_container_tools_version}` (= its own V-R); 1.18.0: `==`
    tools = "==" if tuple(int(x) for x in vr.split("-")[0].split(".")) >= (1, 18, 0) else ">="
    return {
        "libnvidia-container1": [],
        "libnvidia-container-tools": ["Requires: libnvidia-container1%%{?_isa} >= %s" % vr],
        "nvidia-container-toolkit-base": ["Obsoletes: " + OLD_RUNTIME, "Provides: nvidia-container-runtime",
                                          "Conflicts: nvidia-container-toolkit <= 1.10.0-1"],
        "nvidia-container-toolkit": ["Obsoletes: " + OLD_RUNTIME, "Provides: nvidia-container-runtime",
                                     "Provides: nvidia-container-runtime-hook",
                                     "Requires: libnvidia-container-tools %s %s, libnvidia-container-tools < 2.0.0"
                                     % (tools, vr),
                                     "Requires: nvidia-container-toolkit-base == %s" % vr],
        "nvidia-container-toolkit-operator-extensions": ["Requires: nvidia-container-toolkit-base == %s" % vr],
    }[name]


def rpm_files(pkg, libdir):
    """{path: (text, mode)}, {link: target}, [config paths] of a standin_debs package, Debian libdir -> libdir."""
    def move(rel):
        if rel.startswith(standin_debs.LIB_DIR + "/"):
            rel = libdir.lstrip("/") + rel[len(standin_debs.LIB_DIR):]
        return "/" + rel
    files = {move(rel): value for rel, value in pkg["files"].items()}
    links = {move(rel): target for rel, target in pkg.get("links", {}).items()}
    return files, links, list(pkg.get("conffiles", []))


def write_spec(source, version, pkgs, stage, libdir):
    """Spec text of one source package (its binary packages = pkgs); their files are written under stage."""
    upstream, release = version.split("-")
    summary = "Summary: STAND-IN for NVIDIA's %s (k3s_gpu.nvidia tests)"
    head = ["Name: " + source, "Version: " + upstream, "Release: " + release, "License: Apache-2.0",
            "URL: https://github.com/NVIDIA/nvidia-container-toolkit", "Vendor: k3s_gpu.nvidia tests",
            summary % source, "AutoReq: no"]
    head += tags(source, version) if source in [p["name"] for p in pkgs] else []
    head += ["%define debug_package %{nil}", "%define __os_install_post %{nil}", "%define _build_id_links none",
             "", "%description", "STAND-IN: shell stubs, no GPU code.", ""]
    subs, sections = [], []
    for pkg in pkgs:
        name = pkg["name"]
        sub = "" if name == source else " -n " + name
        if sub:
            subs += ["%package" + sub, summary % name, "AutoReq: no"] + tags(name, version)
            subs += ["", "%description" + sub, "STAND-IN: shell stubs, no GPU code.", ""]
        files, links, config = rpm_files(pkg, libdir)
        sections += ["%files" + sub, "%defattr(-,root,root,-)"]
        for path, (text, mode) in sorted(files.items()):
            dest = Path(stage) / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            dest.chmod(mode)
            sections.append(("%%config(noreplace) %s" if path in config else "%s") % path)
        for path, target in sorted(links.items()):
            (Path(stage) / path.lstrip("/")).symlink_to(target)
            sections.append(path)
        sections.append("")
    return "\n".join(head + subs + ["%install", "cp -a '%s'/. %%{buildroot}/" % stage, ""] + sections)


def build_rpms(version, out_dir, work):
    """rpmbuild -bb both source packages of one version; the .rpm files land flat in out_dir."""
    libdir = rpm_eval("%_libdir")
    by_name = {p["name"]: p for p in standin_debs.packages(version)}
    for source, names in SOURCES.items():
        top = Path(work) / ("%s-%s" % (source, version))
        stage = top / "stage"
        stage.mkdir(parents=True)
        spec = top / (source + ".spec")
        spec.write_text(write_spec(source, version, [by_name[n] for n in names], stage, libdir))
        subprocess.run(["rpmbuild", "-bb", "--quiet", "--define", "_topdir %s" % top,
                        "--define", "_rpmdir %s" % out_dir,
                        "--define", "_rpmfilename %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
                        "--define", "_dbpath %s/rpmdb" % top, str(spec)],
                       check=True, capture_output=True, env=dict(os.environ, HOME=str(top)))


class Gpg(apt_repo.Gpg):
    """apt_repo's throw-away GNUPGHOME, with an RSA key cached in rpm-keys/."""

    key_dir = KEY_DIR
    key_kind = "rpm repo"
    key_algo = "rsa4096"

    def rpmsign(self, rpms):
        fingerprint = self.fingerprint()
        argv = ["rpmsign", "--addsign", "--define", "_gpg_name %s" % fingerprint,
                "--define", "_gpg_path %s" % self.home, "--define", "__gpg %s" % shutil.which("gpg"),
                "--define", "_gpg_sign_cmd_extra_args --batch --pinentry-mode loopback --passphrase ''",
                "--define", "_dbpath %s/rpmdb" % self.home] + [str(r) for r in rpms]
        subprocess.run(argv, check=True, capture_output=True, env=dict(os.environ, HOME=self.home))


def repo_file(repo_id, baseurl, gpgkey):
    """A yum .repo section like NVIDIA's, but with gpgcheck=1 (NVIDIA's own file has gpgcheck=0)."""
    return ("[%s]\nname=%s\nbaseurl=%s\nenabled=1\ngpgcheck=1\nrepo_gpgcheck=1\ngpgkey=%s\n"
            % (repo_id, repo_id, baseurl, gpgkey))


def build_repo(name, key_name, versions=VERSIONS):
    """Build (replace) one repo; return its repo.json content."""
    final = REPO_ROOT / name
    REPO_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".%s-" % name, dir=REPO_ROOT))
    try:
        repo = _fill_repo(tmp, final, name, key_name, versions, rpm_eval("%_arch"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return repo


def _fill_repo(tmp, final, name, key_name, versions, architecture):
    dist_dir = tmp / DIST / architecture
    dist_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        for version in versions:
            build_rpms(version, dist_dir, work)
    rpms = sorted(dist_dir.glob("*.rpm"))
    with Gpg(key_name) as gpg:
        gpg.rpmsign(rpms)
        subprocess.run(["createrepo_c", "--quiet", "--no-database", str(dist_dir)], check=True, capture_output=True)
        repomd = dist_dir / "repodata" / "repomd.xml"
        gpg.run("--armor", "--detach-sign", "-o", str(repomd) + ".asc", str(repomd))
        (tmp / "gpgkey").write_bytes(gpg.run("--armor", "--export"))
        fingerprint = gpg.fingerprint()
    (tmp / "fingerprint").write_text(fingerprint + "\n")
    baseurl = "file://%s/%s/$basearch" % (final, DIST)
    gpgkey = "file://%s/gpgkey" % final
    repo = {"name": name, "key": key_name, "fingerprint": fingerprint, "versions": list(versions),
            "packages": [p["name"] for p in standin_debs.packages(versions[0])],
            "arch": architecture, "rpms": [r.name for r in rpms], "repo_id": REPO_ID,
            "baseurl": baseurl, "gpgkey_url": gpgkey, "gpgkey": str(final / "gpgkey"), "host_dir": str(final)}
    repo["repo_file"] = repo_file(REPO_ID, baseurl, gpgkey)
    # as a node sees it (nodes.py binds the rpm-repo cache read-only at NODE_MOUNT)
    repo["node_baseurl"] = "file://%s/%s/%s/$basearch" % (NODE_MOUNT, name, DIST)
    repo["node_gpgkey_url"] = "file://%s/%s/gpgkey" % (NODE_MOUNT, name)
    (tmp / "repo.json").write_text(json.dumps(repo, indent=1) + "\n")
    for path in [tmp] + list(tmp.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repo


def _stamp():
    code = b"".join((HERE / f).read_bytes() for f in ("rpm_repo.py", "apt_repo.py", "standin_debs.py"))
    return hashlib.sha256(code + repr((VERSIONS, sorted(REPOS.items()))).encode()).hexdigest()


def ensure_tools():
    """Install the host packages the build needs (rpmbuild, rpmsign, createrepo_c, gpg) when missing."""
    if all(shutil.which(tool) for tool in ("rpmbuild", "rpmsign", "createrepo_c", "gpg")):
        return
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + list(APT_PACKAGES),
                   check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def build_all(force=False):
    """Build every repo unless the cached ones come from this code; return {name: repo.json}."""
    def build():
        ensure_tools()
        return {name: build_repo(name, key) for name, key in REPOS.items()}
    return apt_repo.cached_build(REPO_ROOT, list(REPOS), _stamp(), build, force)


def main(argv=None):
    return apt_repo.repo_cli(argv, __doc__, list(REPOS), build_all,
                             lambda repo: "baseurl=%s gpgkey=%s  (key %s)" % (
                                 repo["baseurl"], repo["gpgkey_url"], repo["fingerprint"]))


if __name__ == "__main__":
    sys.exit(main())
