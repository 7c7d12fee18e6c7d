#!/usr/bin/env bash
# Install the real Codex CLI for tests/test_agent_codex.py: `@openai/codex`, pinned, from the npm
# registry into a cache outside the repository:
#
#   ${CLAWRL_CODEX_DIR:-${XDG_CACHE_HOME:-~/.cache}/clawrl/codex}/bin/codex
#
# Codex is a native program (Rust, statically linked): the `@openai/codex` package is only a node
# launcher, and the binary comes in a platform package (`@openai/codex-linux-x64`, an npm alias of
# `@openai/codex@<version>-linux-x64`) that npm installs as an optional dependency. npm skips an
# optional dependency without failing (an `omit=optional` setting, a platform it misjudges), so the
# platform package is named explicitly, and bin/codex is the binary itself, which the launcher would
# only exec: nothing but npm is needed to install it (Debian's npm will do) and no node of any
# version to run it.
#
# Idempotent and quick once installed (one file test). Where npm is missing or the registry cannot
# be reached it prints why, records the reason in `unavailable` for the test's skip message, and
# exits 0: `make test` goes on and the Codex test skips (CI sets CLAWRL_REQUIRE_CODEX=1, so there
# it fails instead). A registry that answers but an install that fails is an error.
set -euo pipefail

CODEX_VERSION=0.171.0

DIR="${CLAWRL_CODEX_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clawrl/codex}"
STAMP="$DIR/installed-codex-$CODEX_VERSION"
[ -f "$STAMP" ] && [ -x "$DIR/bin/codex" ] && exit 0

unavailable() {
  mkdir -p "$DIR"
  echo "$1" > "$DIR/unavailable"
  echo "install-codex: $1; tests/test_agent_codex.py will skip"
  exit 0
}

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) PLATFORM=linux-x64 TARGET=x86_64-unknown-linux-musl ;;
  Linux-aarch64 | Linux-arm64) PLATFORM=linux-arm64 TARGET=aarch64-unknown-linux-musl ;;
  *) unavailable "no Codex $CODEX_VERSION package for $(uname -s) $(uname -m)" ;;
esac
command -v npm >/dev/null || unavailable "npm is not installed"

NPM=(npm --no-fund --no-audit --no-update-notifier --loglevel=error --fetch-retries=1 --fetch-timeout=20000)
if ! "${NPM[@]}" view "@openai/codex@$CODEX_VERSION" version >/dev/null 2>&1; then
  unavailable "the npm registry cannot be reached ($(npm config get registry 2>/dev/null))"
fi

mkdir -p "$DIR"
# One install at a time (two `make test` started together); the second finds the first's stamp.
exec 9>"$DIR/.lock"
flock 9
[ -f "$STAMP" ] && [ -x "$DIR/bin/codex" ] && exit 0

echo "install-codex: installing @openai/codex $CODEX_VERSION ($PLATFORM) into $DIR (about 450 MB)"
WORK="$(mktemp -d "$DIR/.install.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# The launcher as users get it, and its platform package by the alias the launcher looks it up by.
"${NPM[@]}" install --prefix "$WORK/codex" --no-save --no-package-lock \
  "@openai/codex@$CODEX_VERSION" "@openai/codex-$PLATFORM@npm:@openai/codex@$CODEX_VERSION-$PLATFORM" >/dev/null
BINARY="node_modules/@openai/codex-$PLATFORM/vendor/$TARGET/bin/codex"
[ -x "$WORK/codex/$BINARY" ] || { echo "install-codex: the package has no $BINARY" >&2; exit 1; }
VERSION_LINE="$("$WORK/codex/$BINARY" --version)"
[ "$VERSION_LINE" = "codex-cli $CODEX_VERSION" ] || { echo "install-codex: 'codex --version' says '$VERSION_LINE'" >&2; exit 1; }

# Swap the new tree in; an older pinned version, or a half-finished install, is removed.
rm -rf "$DIR/codex" "$DIR/bin" "$DIR"/installed-* "$DIR/unavailable"
mv "$WORK/codex" "$DIR/codex"
mkdir -p "$DIR/bin"
ln -s "../codex/$BINARY" "$DIR/bin/codex"
touch "$STAMP"
echo "install-codex: $("$DIR/bin/codex" --version)"
