# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the Galaxy artifact holds, checked by the release stage of scripts/test.sh (issue 44).

usage: check-artifact.py ARTIFACT.tar.gz

Fails (exit 1, one line per problem) when the artifact
- holds a repository-only tree (tests, labs, benchmarks, molecule, developer scripts, CI) or an empty directory;
- has a relative link in a Markdown or reStructuredText file that does not resolve inside it (a link to a file the
  artifact leaves out must be the repository's URL);
- has a version that its changelog does not release (changelogs/changelog.yaml and CHANGELOG.rst).
Prints the artifact's size, its file count and its top-level entries."""

import json
import os
import posixpath
import re
import sys
import tarfile

REPOSITORY_ONLY = ("tests", "benchmarks", "scripts", "extensions", ".ci", ".github", "docs/development.md",
                   "changelogs/fragments")
MARKDOWN_LINK = re.compile(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
RST_LINK = re.compile(r"`[^`<]*<([^>`]+)>`_")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def links(name, text):
    pattern = MARKDOWN_LINK if name.endswith(".md") else RST_LINK
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            yield number, match.group(1)


def problems_of(members, read):
    files = {m.name for m in members if m.isfile()}
    dirs = {m.name for m in members if m.isdir()}
    found = []
    for name in sorted(files | dirs):
        if any(name == kept or name.startswith(kept + "/") for kept in REPOSITORY_ONLY):
            found.append("%s: a repository-only path in the artifact (add it to galaxy.yml's build_ignore)" % name)
    for directory in sorted(dirs):
        if not any(other.startswith(directory + "/") for other in files | dirs):
            found.append("%s/: an empty directory in the artifact (add it to galaxy.yml's build_ignore)" % directory)
    for name in sorted(files):
        if not name.endswith((".md", ".rst")):
            continue
        for number, target in links(name, read(name)):
            if EXTERNAL.match(target) or target.startswith("#"):
                continue
            path = posixpath.normpath(posixpath.join(posixpath.dirname(name), target.split("#", 1)[0]))
            if path not in files and path not in dirs:
                found.append("%s:%d: the link %s does not resolve inside the artifact (%s is not in it): link the "
                             "repository's URL or ship the file" % (name, number, target, path))
    manifest = json.loads(read("MANIFEST.json"))
    version = manifest["collection_info"]["version"]
    if "changelogs/changelog.yaml" not in files or ("\n  %s:\n" % version) not in read("changelogs/changelog.yaml"):
        found.append("changelogs/changelog.yaml: no release %s (run antsibull-changelog release)" % version)
    if "CHANGELOG.rst" not in files or ("\nv%s\n" % version) not in read("CHANGELOG.rst"):
        found.append("CHANGELOG.rst: no section v%s (run antsibull-changelog release)" % version)
    return found, version


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with tarfile.open(argv[1]) as artifact:
        members = [m for m in artifact.getmembers() if m.name not in (".", "")]
        for member in members:
            member.name = member.name[2:] if member.name.startswith("./") else member.name

        def read(name):
            return artifact.extractfile(name).read().decode("utf-8")

        found, version = problems_of(members, read)
        size = os.path.getsize(argv[1])
        top = sorted({m.name.split("/", 1)[0] for m in members})
        print("%s: version %s, %d bytes, %d files; top level: %s" % (
            argv[1], version, size, sum(1 for m in members if m.isfile()), " ".join(top)))
    for problem in found:
        print("FAIL " + problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
