#!/usr/bin/env bash
# Install Debian's Chromium and chromedriver for the web environment and tests/test_envs_web.py
# (/usr/lib/chromium/chromium, /usr/bin/chromedriver). Quick when they are there. As root on a
# machine with apt-get it installs them; elsewhere it says why not and exits 0: `make test` goes
# on and the web tests skip (CI sets CLAWRL_REQUIRE_CHROMIUM=1, so there they fail instead).
set -euo pipefail

[ -x /usr/lib/chromium/chromium ] && [ -x /usr/bin/chromedriver ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-chromium: not root or no apt-get: install chromium and chromium-driver to run the web tests"
  exit 0
fi
echo "install-chromium: installing Debian's chromium and chromium-driver (about 300 MB)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
