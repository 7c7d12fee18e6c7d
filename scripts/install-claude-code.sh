#!/usr/bin/env bash
# Install the real Claude Code for tests/test_agent_claude_code.py: `@anthropic-ai/claude-code`,
# pinned, from the npm registry into a cache outside the repository:
#
#   ${CLAWRL_CLAUDE_CODE_DIR:-${XDG_CACHE_HOME:-~/.cache}/clawrl/claude-code}/bin/claude
#
# Claude Code is a native program (one self-contained executable): the `@anthropic-ai/claude-code`
# package is only a placeholder whose postinstall script (`node install.cjs`, on node >= 22, its
# `engines`) copies the binary of a platform package (`@anthropic-ai/claude-code-linux-x64`, ...),
# which npm installs as an optional dependency. npm skips an optional dependency without failing (an
# `omit=optional` setting, a platform it misjudges) and Debian's node (18 in bookworm) is too old for
# the postinstall, so both packages are installed without scripts, the platform package named
# explicitly, and bin/claude is the platform binary itself, which the postinstall would only copy:
# nothing but npm is needed to install it (Debian's npm will do) and no node of any version to run it.
#
# Idempotent and quick once installed (one file test). Where npm is missing or the registry cannot
# be reached it prints why, records the reason in `unavailable` for the test's skip message, and
# exits 0: `make test` goes on and the Claude Code test skips (CI sets CLAWRL_REQUIRE_CLAUDE_CODE=1,
# so there it fails instead). A registry that answers but an install that fails is an error.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332

DIR="${CLAWRL_CLAUDE_CODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clawrl/claude-code}"
STAMP="$DIR/installed-claude-code-$CLAUDE_CODE_VERSION"
[ -f "$STAMP" ] && [ -x "$DIR/bin/claude" ] && exit 0

unavailable() {
  mkdir -p "$DIR"
  echo "$1" > "$DIR/unavailable"
  echo "install-claude-code: $1; tests/test_agent_claude_code.py will skip"
  exit 0
}

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) PLATFORM=linux-x64 ;;
  Linux-aarch64 | Linux-arm64) PLATFORM=linux-arm64 ;;
  *) unavailable "no Claude Code $CLAUDE_CODE_VERSION package for $(uname -s) $(uname -m)" ;;
esac
# Alpine and other musl systems have builds of their own.
if ldd --version 2>&1 | grep -qi musl; then PLATFORM="$PLATFORM-musl"; fi
command -v npm >/dev/null || unavailable "npm is not installed"

PACKAGE="@anthropic-ai/claude-code"
NPM=(npm --no-fund --no-audit --no-update-notifier --loglevel=error --fetch-retries=1 --fetch-timeout=20000)
if ! "${NPM[@]}" view "$PACKAGE-$PLATFORM@$CLAUDE_CODE_VERSION" version >/dev/null 2>&1; then
  unavailable "the npm registry cannot be reached ($(npm config get registry 2>/dev/null))"
fi

mkdir -p "$DIR"
# One install at a time (two `make test` started together); the second finds the first's stamp.
exec 9>"$DIR/.lock"
flock 9
[ -f "$STAMP" ] && [ -x "$DIR/bin/claude" ] && exit 0

echo "install-claude-code: installing $PACKAGE $CLAUDE_CODE_VERSION ($PLATFORM) into $DIR (about 400 MB)"
WORK="$(mktemp -d "$DIR/.install.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# The package as users get it and its platform package; no scripts (see above). Its `engines`
# (node >= 22) is the postinstall's: older npm and node only warn, which --loglevel=error hides.
"${NPM[@]}" install --prefix "$WORK/claude-code" --no-save --no-package-lock --ignore-scripts \
  "$PACKAGE@$CLAUDE_CODE_VERSION" "$PACKAGE-$PLATFORM@$CLAUDE_CODE_VERSION" >/dev/null
BINARY="node_modules/$PACKAGE-$PLATFORM/claude"
[ -f "$WORK/claude-code/$BINARY" ] || { echo "install-claude-code: the package has no $BINARY" >&2; exit 1; }
chmod 755 "$WORK/claude-code/$BINARY"
# Run with a home of its own: `--version` must neither read nor write the user's ~/.claude.
VERSION_LINE="$(HOME="$WORK" CLAUDE_CONFIG_DIR="$WORK/.claude" DISABLE_AUTOUPDATER=1 "$WORK/claude-code/$BINARY" --version)"
case "$VERSION_LINE" in
  "$CLAUDE_CODE_VERSION "*) ;;
  *) echo "install-claude-code: 'claude --version' says '$VERSION_LINE'" >&2; exit 1 ;;
esac

# Swap the new tree in; an older pinned version, or a half-finished install, is removed.
rm -rf "$DIR/claude-code" "$DIR/bin" "$DIR"/installed-* "$DIR/unavailable"
mv "$WORK/claude-code" "$DIR/claude-code"
mkdir -p "$DIR/bin"
ln -s "../claude-code/$BINARY" "$DIR/bin/claude"
touch "$STAMP"
echo "install-claude-code: claude $VERSION_LINE"
