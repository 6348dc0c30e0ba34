#!/usr/bin/env bash
# The main job on the built-in demo node: sets up the venv, builds a sandbox k3s GPU agent under
# .tmp/demo-node (k3s data dir, stub NVIDIA toolkit binaries), and runs demo/demo.yml on it:
# what was detected, what will be written, the diff, and a second run that changes nothing.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
enter_dev_env

NODE=$ROOT/.tmp/demo-node
demo/make-node.sh "$NODE"
export ANSIBLE_COLLECTIONS_PATH=$COLL_PATH ANSIBLE_NOCOWS=1 ANSIBLE_RETRY_FILES_ENABLED=0
printf 'demo ansible_connection=local ansible_python_interpreter=%s demo_root=%s\n' "$VENV/bin/python" "$NODE" \
    >"$ROOT/.tmp/demo-inventory.ini"
"$VENV/bin/ansible-playbook" -i "$ROOT/.tmp/demo-inventory.ini" demo/demo.yml "$@"
