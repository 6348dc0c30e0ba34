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
# Upstream containerd 2.2/2.3 (what k3s 1.33.10+ and 1.36.2+/1.37 embed; not packaged by Debian) and the
# NVIDIA Container Toolkit are built from the Go module proxy by scripts/build-test-binaries.sh into a
# cache outside the clone; --upstream runs only that build (no apt):
#   ./scripts/install-containerd.sh --upstream
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
            sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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
# the options that point apt (apt-get, apt-cache) at the private lists and cache
APT_PRIVATE=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache")
apt_private() { apt-get "${APT_PRIVATE[@]}" -o APT::Sandbox::User=root -o Debug::NoLocking=1 "$@"; }
madison_private() { apt-cache "${APT_PRIVATE[@]}" madison "$@"; }

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

# ---------------------------------------------------------------- main
start=$(date +%s)
if ((UPSTREAM_ONLY)); then
    exec bash "$HERE/build-test-binaries.sh" containerd-2.2 containerd-2.3 nvidia-container-toolkit
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
log "runc: $(/usr/sbin/runc --version | head -n1); manifest: $MANIFEST ($(($(date +%s) - start))s)"
