#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh needs on the GPU machine, downloaded here into .whl/ (ignored by git).
#
# That machine has Python 3.12 with torch, transformers' own dependencies, peft and httpx, but not
# the rest of clawrl's requirements, and it cannot reach a package registry. The versions are this
# checkout's .venv's, so the GPU machine runs what the tests ran. Its huggingface_hub is kept (ours
# needs httpx2, which it lacks); transformers accepts it.
#
#   bash benchmarks/gpu_wheels.sh && echo /.whl/ >> .git/info/exclude
#   then the device tool: run `bash benchmarks/gpu_check.sh` with carry [".whl"]
set -euo pipefail
cd "$(dirname "$0")/.."
packages="pydantic pydantic_core pydantic-settings python-dotenv annotated-types typing-inspection fastapi starlette
uvicorn sqlalchemy opentelemetry-api peft transformers tokenizers annotated-doc typing_extensions threadpoolctl
prometheus-client llguidance"
mkdir -p .whl
for package in $packages; do
    version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$package")
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$package==$version"
done
ls .whl
