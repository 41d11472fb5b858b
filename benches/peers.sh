#!/usr/bin/env bash
# Installs the peer routers `llm-gateway bench --peers` runs, where the bench
# looks for them first: $LLM_GATEWAY_PEERS_DIR (default target/peers, from
# the checkout's root, which is where the bench is run from).
#
#   vllm-router 0.1.17    -> $DIR/vllm/bin/vllm-router    (PyPI, a venv)
#   sglang-router 0.3.2   -> $DIR/sglang/bin/smg           (PyPI, a venv)
#   nginx                 -> the system's (Debian nginx-light), on PATH
#
# Pinned, so a comparison names the versions it beat; a venv whose pin
# matches is left alone, so running this twice installs nothing twice.
#
#   bash benches/peers.sh
#   ./target/release/llm-gateway bench --peers --modes load_aware,reference
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${LLM_GATEWAY_PEERS_DIR:-target/peers}

# venv NAME PIN: $DIR/NAME holds PIN, rebuilt when the pin changes.
venv() {
  local dir=$DIR/$1 pin=$2
  if [ "$(cat "$dir/.pin" 2>/dev/null)" = "$pin" ]; then
    echo "peers: $pin already in $dir" >&2
    return 0
  fi
  python3 -c 'import ensurepip' >/dev/null 2>&1 || {
    echo "peers: python3 with venv (Debian: python3-venv) is needed for $pin" >&2
    return 1
  }
  echo "peers: installing $pin into $dir" >&2
  rm -rf "$dir"
  mkdir -p "$DIR"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$pin"
  echo "$pin" > "$dir/.pin"
}

venv vllm vllm-router==0.1.17
venv sglang sglang-router==0.3.2

# Debian's nginx is in /usr/sbin, which the bench also looks in.
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  echo "peers: nginx already installed" >&2
elif [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "peers: installing nginx-light" >&2
  # The package starts a system nginx on port 80 where it can; the bench
  # runs its own per cell and never uses that one.
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light
else
  echo "peers: nginx is missing and this is not root with apt-get: install nginx" \
    "(Debian: sudo apt-get install nginx-light); until then --peers skips nginx-hash" >&2
fi
echo "peers: done; llm-gateway bench --peers finds them under $DIR and on PATH" >&2
