#!/usr/bin/env bash
# Installs the three containerd lines the conformance tests run against (tests/conformance/lab.py):
#
#   1.6  Debian 12's own package (apt-get install containerd runc busybox-static), in /usr/bin
#   1.7  newest 1.7.x .deb from Debian trixie, extracted (not installed) into .cache/containerd/1.7/
#   2.x  newest 2.x .deb from Debian sid that runs on this machine's glibc, into .cache/containerd/2.x/
#
# The .debs come through a PRIVATE apt configuration under .cache/containerd/apt (own sources.list,
# lists and archive cache); the system's apt sources and state are not touched. The mirror is the one
# the machine's apt already uses. Writes .cache/containerd/versions.json (read by lab.py).
#
#   ./scripts/install-containerd.sh            # cached: no network when .cache/containerd is complete
#   ./scripts/install-containerd.sh --refresh  # resolve the newest .debs again
#
# Pin a line instead of taking the newest (Debian version strings, as 'apt-cache madison' prints them):
#   K3S_GPU_CONTAINERD_1_7=1.7.24~ds1-6+deb13u1 K3S_GPU_CONTAINERD_2_X=2.1.9+ds1-5 ./scripts/install-containerd.sh
#
# Also extracts upstream containerd 2.2.7 and 2.3.4 (the lines k3s 1.33.10+ and 1.36.2+/1.37 embed; not
# packaged by Debian) from the project's shared material ($K3S_GPU_SHARED, else <repo>/../shared:
# bin/containerd-<ver>-linux-amd64.tar.xz, checked against their sha256) into
# .cache/containerd-upstream/<ver>/bin/, for tests only (never on PATH, never installed):
#   ./scripts/install-containerd.sh --upstream  # only those (no apt, no network)
# and nvidia-ctk 1.20.0 (bin/nvidia-container-toolkit-1.20.0-linux-amd64.tar.xz) into .cache/nvidia-container-toolkit-1.20.0/.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
ROOT=$(repo_root)
CACHE=$ROOT/.cache/containerd
APT_DIR=$CACHE/apt
MANIFEST=$CACHE/versions.json
STAMP=.k3s-gpu-deb-version      # inside each extracted line: the Debian version it came from

REFRESH=0
UPSTREAM_ONLY=0
for arg in "$@"; do
    case $arg in
        --refresh) REFRESH=1 ;;
        --upstream) UPSTREAM_ONLY=1 ;;
        -h | --help)
            sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

# line -> suite it is taken from, version prefix, pin variable
declare -A SUITE=([1.7]=trixie [2.x]=sid)
declare -A PREFIX=([1.7]=1.7. [2.x]=2.)
declare -A PIN=([1.7]=${K3S_GPU_CONTAINERD_1_7:-} [2.x]=${K3S_GPU_CONTAINERD_2_X:-})
LINES=(1.7 2.x)

# ---------------------------------------------------------------- private apt
apt_private() {
    apt-get \
        -o Dir::Etc::SourceList="$APT_DIR/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$APT_DIR/lists" \
        -o Dir::Cache="$APT_DIR/cache" \
        -o APT::Sandbox::User=root \
        -o Debug::NoLocking=1 \
        "$@"
}
madison_private() {
    apt-cache \
        -o Dir::Etc::SourceList="$APT_DIR/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$APT_DIR/lists" \
        -o Dir::Cache="$APT_DIR/cache" \
        madison "$@"
}

# debian_mirror: the Debian archive URL this machine's apt uses (not the security archive).
debian_mirror() {
    local uri=""
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
        uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
            /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z "$uri" && -f /etc/apt/sources.list ]]; then
        # deb [opts] URI suite comp...
        uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }' \
            /etc/apt/sources.list)
    fi
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

APT_UPDATED=0
apt_private_update() {
    ((APT_UPDATED)) && return 0
    need_cmd apt-get "this script expects Debian (apt-get)"
    need_cmd dpkg-deb "apt-get install dpkg"
    local mirror
    mirror=$(debian_mirror)
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/debs"
    printf 'deb %s trixie main\ndeb %s sid main\n' "$mirror" "$mirror" >"$APT_DIR/sources.list"
    step "private apt update (trixie, sid from $mirror) in $APT_DIR"
    apt_private update -qq
    APT_UPDATED=1
}

# candidates LINE: Debian versions of 'containerd' for LINE, newest first (pin only, when pinned).
candidates() {
    local line=$1 v sorted=() i j tmp
    if [[ -n "${PIN[$line]}" ]]; then
        printf '%s\n' "${PIN[$line]}"
        return 0
    fi
    while IFS= read -r v; do
        [[ "$v" == "${PREFIX[$line]}"* ]] && sorted+=("$v")
    done < <(madison_private containerd | awk -F'|' '{ gsub(/ /, "", $2); print $2 }' | sort -u)
    # insertion sort with Debian version ordering, newest first
    for ((i = 1; i < ${#sorted[@]}; i++)); do
        for ((j = i; j > 0; j--)); do
            if dpkg --compare-versions "${sorted[j]}" gt "${sorted[j - 1]}"; then
                tmp=${sorted[j]}
                sorted[j]=${sorted[j - 1]}
                sorted[j - 1]=$tmp
            else
                break
            fi
        done
    done
    ((${#sorted[@]})) || die "no containerd ${PREFIX[$line]}x in ${SUITE[$line]} (private apt in $APT_DIR); pin one with K3S_GPU_CONTAINERD_*"
    printf '%s\n' "${sorted[@]}"
}

# runs DIR: the extracted binaries start on this machine (glibc new enough, right architecture).
runs() {
    local dir=$1
    "$dir/usr/bin/containerd" --version >/dev/null 2>&1 \
        && "$dir/usr/bin/ctr" --version >/dev/null 2>&1 \
        && "$dir/usr/bin/containerd-shim-runc-v2" -v >/dev/null 2>&1
}

# cached LINE: the extracted tree is complete, runs, and matches the pin if one is set.
cached() {
    local line=$1 dir=$CACHE/$1 have
    [[ -f "$dir/$STAMP" ]] || return 1
    have=$(cat "$dir/$STAMP")
    [[ -z "${PIN[$line]}" || "${PIN[$line]}" == "$have" ]] || return 1
    runs "$dir"
}

# fetch LINE: download + extract the newest candidate that runs here.
fetch() {
    local line=$1 dest=$CACHE/$1 v deb tmp err skipped=()
    apt_private_update
    while IFS= read -r v; do
        step "containerd $line: trying $v (${SUITE[$line]})"
        rm -f "$APT_DIR/debs"/containerd_*.deb
        (cd "$APT_DIR/debs" && apt_private download -qq "containerd=$v") \
            || die "apt-get download containerd=$v failed"
        deb=$(find "$APT_DIR/debs" -maxdepth 1 -name 'containerd_*.deb' -print -quit)
        [[ -n "$deb" ]] || die "apt-get download containerd=$v wrote no .deb"
        tmp=$(mktemp -d "$CACHE/.extract.XXXXXX")
        dpkg-deb -x "$deb" "$tmp"
        if runs "$tmp"; then
            printf '%s\n' "$v" >"$tmp/$STAMP"
            rm -rf "$dest"
            mv "$tmp" "$dest"
            rm -f "$deb"
            if ((${#skipped[@]})); then
                warn "containerd $line: newer ${skipped[*]} do not run on this machine; using $v"
            fi
            return 0
        fi
        err=$("$tmp/usr/bin/containerd" --version 2>&1 | head -n2 || true)
        warn "containerd $v does not run here: $err"
        skipped+=("$v")
        rm -rf "$tmp" "$deb"
    done < <(candidates "$line")
    die "no containerd ${PREFIX[$line]}x from ${SUITE[$line]} runs on this machine (tried: ${skipped[*]})"
}

# upstream_version BIN: '1.7.24~ds1' from 'containerd github.com/containerd/containerd 1.7.24~ds1 <commit>'
upstream_version() {
    local out
    out=$("$1" --version) || die "$1 --version failed"
    out=$(awk '{ print $3 }' <<<"$out")
    printf '%s\n' "${out%+unknown}"   # sid's 2.x build reports '2.1.9+unknown'
}

json_str() {
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# ---------------------------------------------------------------- upstream 2.2 / 2.3
UPSTREAM=$ROOT/.cache/containerd-upstream
# version -> sha256 of bin/containerd-<version>-linux-amd64.tar.xz (shared/bin/README.md)
declare -A UPSTREAM_SHA256=(
    [2.2.7]=d099214174cd9f9ce3144a3fafb26fe771edf3d993067206de1f0f1b00fd81a4
    [2.3.4]=c0bda2401767bf2d77396378dbfe6059e178415beeef5cca6d6e2d7d3a0828cf
)
UPSTREAM_VERSIONS=(2.2.7 2.3.4)

shared_dir() {
    local dir=${K3S_GPU_SHARED:-$ROOT/../shared}
    [[ -d "$dir/bin" ]] || return 1
    (cd "$dir" && pwd)
}

# upstream_runs DIR VERSION: the extracted containerd starts here and is that version.
upstream_runs() {
    local out
    out=$("$1/bin/containerd" --version 2>/dev/null) || return 1
    [[ "$out" == *" v$2 "* ]] && "$1/bin/ctr" --version >/dev/null 2>&1 \
        && "$1/bin/containerd-shim-runc-v2" -v >/dev/null 2>&1
}

# install_upstream: extract each upstream version (cached when it is there and runs). Returns 1 when the
# shared material is missing (the tests that need these binaries then fail with the hint).
install_upstream() {
    local shared v dest archive sum tmp
    if ! shared=$(shared_dir); then
        warn "no shared material at ${K3S_GPU_SHARED:-$ROOT/../shared} (set K3S_GPU_SHARED): containerd ${UPSTREAM_VERSIONS[*]} not extracted"
        return 1
    fi
    [[ "$(uname -m)" == x86_64 ]] || { warn "the upstream containerd archives are linux/amd64 only; this is $(uname -m)"; return 1; }
    mkdir -p "$UPSTREAM"
    for v in "${UPSTREAM_VERSIONS[@]}"; do
        dest=$UPSTREAM/$v
        if ((REFRESH == 0)) && upstream_runs "$dest" "$v"; then
            log "containerd $v (upstream): cached in $dest"
            continue
        fi
        archive=$shared/bin/containerd-$v-linux-amd64.tar.xz
        [[ -f "$archive" ]] || die "$archive missing (see $shared/bin/README.md)"
        sum=$(sha256sum "$archive" | awk '{ print $1 }')
        [[ "$sum" == "${UPSTREAM_SHA256[$v]}" ]] || die "$archive: sha256 $sum, expected ${UPSTREAM_SHA256[$v]}"
        tmp=$(mktemp -d "$UPSTREAM/.extract.XXXXXX")
        tar -xJf "$archive" -C "$tmp" bin/containerd bin/ctr bin/containerd-shim-runc-v2
        upstream_runs "$tmp" "$v" || die "containerd $v from $archive does not run here: $("$tmp/bin/containerd" --version 2>&1 | head -n1)"
        rm -rf "$dest"
        mv "$tmp" "$dest"
        log "containerd $v (upstream): extracted into $dest"
    done
}

# ---------------------------------------------------------------- NVIDIA Container Toolkit 1.20.0
# nvidia-ctk, the peer the plain-containerd tests compare with (shared/bin/README.md); tests only
TOOLKIT=$ROOT/.cache/nvidia-container-toolkit-1.20.0
TOOLKIT_SHA256=48eb2631f8217c764e9cbc3f94aaf223c5b56e111b96f01f0563e4ce518817e7

install_toolkit() {
    local shared archive sum tmp
    if ((REFRESH == 0)) && "$TOOLKIT/bin/nvidia-ctk" --version 2>/dev/null | grep -q 'version 1.20.0'; then
        log "nvidia-ctk 1.20.0: cached in $TOOLKIT"
        return 0
    fi
    shared=$(shared_dir) || { warn "no shared material: nvidia-ctk 1.20.0 not extracted"; return 1; }
    archive=$shared/bin/nvidia-container-toolkit-1.20.0-linux-amd64.tar.xz
    [[ -f "$archive" ]] || die "$archive missing (see $shared/bin/README.md)"
    sum=$(sha256sum "$archive" | awk '{ print $1 }')
    [[ "$sum" == "$TOOLKIT_SHA256" ]] || die "$archive: sha256 $sum, expected $TOOLKIT_SHA256"
    mkdir -p "$(dirname "$TOOLKIT")"
    tmp=$(mktemp -d "$TOOLKIT.extract.XXXXXX")
    tar -xJf "$archive" -C "$tmp" bin/nvidia-ctk
    "$tmp/bin/nvidia-ctk" --version | grep -q 'version 1.20.0' || die "nvidia-ctk from $archive does not run here"
    rm -rf "$TOOLKIT"
    mv "$tmp" "$TOOLKIT"
    log "nvidia-ctk 1.20.0: extracted into $TOOLKIT"
}

# ---------------------------------------------------------------- main
start=$(date +%s)
if ((UPSTREAM_ONLY)); then
    install_upstream || die "containerd ${UPSTREAM_VERSIONS[*]} could not be extracted (see above)"
    install_toolkit || die "nvidia-ctk 1.20.0 could not be extracted (see above)"
    exit 0
fi
apt_ensure containerd runc busybox-static
for bin in /usr/bin/containerd /usr/bin/ctr /usr/bin/containerd-shim-runc-v2 /usr/sbin/runc /bin/busybox; do
    [[ -x "$bin" ]] || die "$bin missing after apt-get install containerd runc busybox-static"
done
mkdir -p "$CACHE"

for line in "${LINES[@]}"; do
    if ((REFRESH == 0)) && cached "$line"; then
        log "containerd $line: cached $(cat "$CACHE/$line/$STAMP") in $CACHE/$line"
    else
        fetch "$line"
    fi
done

tmp_manifest=$(mktemp "$CACHE/.versions.XXXXXX")
{
    printf '{\n'
    printf '  "1.6": {"version": %s, "package": %s, "suite": "bookworm", "bin_dir": "/usr/bin"},\n' \
        "$(json_str "$(upstream_version /usr/bin/containerd)")" \
        "$(json_str "$(dpkg-query -W -f='${Version}' containerd)")"
    sep=,
    for line in "${LINES[@]}"; do
        [[ "$line" == "${LINES[-1]}" ]] && sep=
        printf '  "%s": {"version": %s, "package": %s, "suite": "%s", "bin_dir": %s}%s\n' "$line" \
            "$(json_str "$(upstream_version "$CACHE/$line/usr/bin/containerd")")" \
            "$(json_str "$(cat "$CACHE/$line/$STAMP")")" "${SUITE[$line]}" \
            "$(json_str "$CACHE/$line/usr/bin")" "$sep"
    done
    printf '}\n'
} >"$tmp_manifest"
mv -f "$tmp_manifest" "$MANIFEST"

for bin_dir in /usr/bin "$CACHE/1.7/usr/bin" "$CACHE/2.x/usr/bin"; do
    log "$("$bin_dir/containerd" --version)   ($bin_dir)"
done
install_upstream || true   # the Debian lines stand on their own; the 2.2/2.3 tests name what is missing
install_toolkit || true    # likewise the tests that compare with nvidia-ctk
log "runc: $(/usr/sbin/runc --version | head -n1); manifest: $MANIFEST ($(($(date +%s) - start))s)"
