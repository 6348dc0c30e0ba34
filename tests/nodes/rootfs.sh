#!/usr/bin/env bash
# Build the base root filesystem of the test nodes once (Debian bookworm, systemd as PID 1,
# sshd, python3, Debian's containerd 1.6 and runc) into .cache/nodes/rootfs-base.
#
#   tests/nodes/rootfs.sh            # build if missing or if the package list changed; print the path
#   tests/nodes/rootfs.sh --force    # rebuild
#
# The stamp (.cache/nodes/rootfs-base.stamp) is a hash of the suite, the package list and
# POSTPROCESS_VERSION; nothing else triggers a rebuild. Override the mirror with
# K3S_GPU_DEBIAN_MIRROR (default: the machine's own apt mirror). Needs root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/../../scripts/lib.sh"
ROOT=$(repo_root)
CACHE=${K3S_GPU_NODES_CACHE:-$ROOT/.cache/nodes}
BASE=$CACHE/rootfs-base
STAMP=$CACHE/rootfs-base.stamp

SUITE=bookworm
# python3-apt: ansible.builtin.apt needs it on the target; procps: ps/pgrep for debugging.
# rpm, dnf, python3-dnf, dnf-plugins-core: the role's dnf path is tested on a Debian node (no RHEL here).
# udev: a GPU node has it (the role's /dev/char rule goes to /etc/udev/rules.d); udevd itself stays off in a container.
PACKAGES=(systemd systemd-sysv dbus python3 python3-apt openssh-server procps
    containerd runc gnupg ca-certificates rpm dnf python3-dnf dnf-plugins-core udev)
POSTPROCESS_VERSION=2 # bump when post_process() changes

mirror() {
    if [[ -n "${K3S_GPU_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "$K3S_GPU_DEBIAN_MIRROR"
        return
    fi
    local found=""
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
        found=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z "$found" && -f /etc/apt/sources.list ]]; then
        found=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list)
    fi
    printf '%s\n' "${found:-http://deb.debian.org/debian}"
}

want_stamp() {
    printf 'suite=%s\npackages=%s\npostprocess=%s\n' "$SUITE" "${PACKAGES[*]}" "$POSTPROCESS_VERSION" \
        | sha256sum | cut -d' ' -f1
}

# Plain file edits of the new tree (no chroot, no boot).
post_process() {
    local dir=$1 unit
    : >"$dir/etc/hostname"
    # apt's and man-db's timers would start apt/dpkg under the role's feet: mask them.
    for unit in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer; do
        ln -sfn /dev/null "$dir/etc/systemd/system/$unit"
    done
    # dnf as on RHEL: report repository errors instead of skipping the repository (Debian's default
    # skip_if_unavailable=True turns a bad signature into "no match"), and no `local` plugin (Debian's
    # dnf-plugins-core enables it; it breaks every gpgcheck install with a _dnf_local repository).
    printf '[main]\ngpgcheck=1\ninstallonly_limit=3\nclean_requirements_on_remove=True\nbest=True\nskip_if_unavailable=False\n' \
        >"$dir/etc/dnf/dnf.conf"
    printf '[main]\nenabled=0\n' >"$dir/etc/dnf/plugins/local.conf"
    mkdir -p "$dir/etc/yum.repos.d"
    # Package lists so that `apt-get install` works without a first `apt-get update`.
    cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
    chroot "$dir" apt-get update -qq
    chroot "$dir" apt-get clean
    rm -f "$dir/etc/resolv.conf"
}

build() {
    need_cmd debootstrap "apt-get install -y debootstrap"
    local new=$BASE.new url
    url=$(mirror)
    rm -rf "$new"
    step "debootstrap $SUITE minbase from $url into $new"
    debootstrap --variant=minbase --include="$(
        IFS=,
        printf '%s' "${PACKAGES[*]}"
    )" "$SUITE" "$new" "$url" >"$CACHE/rootfs-base.log" 2>&1 \
        || {
            tail -20 "$CACHE/rootfs-base.log" >&2
            die "debootstrap failed (log: $CACHE/rootfs-base.log)"
        }
    post_process "$new"
    rm -rf "$BASE"
    mv "$new" "$BASE"
    want_stamp >"$STAMP"
}

main() {
    [[ $(id -u) -eq 0 ]] || die "run as root (debootstrap, chroot, systemd-nspawn)"
    apt_ensure debootstrap systemd-container openssh-client gnupg >&2 # nodes.py: ssh; apt_repo.py: gpg
    mkdir -p "$CACHE"
    exec 9>"$CACHE/rootfs.lock"
    flock 9
    local have=""
    [[ -f "$STAMP" ]] && have=$(cat "$STAMP")
    if [[ "${1:-}" != --force && "$have" == "$(want_stamp)" && -x "$BASE/usr/bin/python3" ]]; then
        log "$BASE"
        return 0
    fi
    if compgen -G "$CACHE/*/nspawn.pid" >/dev/null; then
        die "nodes are running on the old base; stop them first: tests/nodes/nodes.py down --all"
    fi
    build >&2
    log "$BASE"
}

main "$@"
