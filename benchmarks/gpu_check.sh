#!/usr/bin/env bash
# The GPU check: the Qwen3-4B shape in bf16 on one H100/H200, in under 8 minutes, nothing fetched.
#
#   bash benchmarks/gpu_check.sh              # on the GPU machine (the device tool: carry .whl)
#   bash benchmarks/gpu_check.sh --dry-run    # the same stages on the tiny shape on this CPU (a test runs it)
#   bash benchmarks/gpu_check.sh --stages serve,swap --out "$OUT/again.json"   # more flags: real_shapes.py's
#
# What it measures (benchmarks/real_shapes.py): building the random-weight model, serving on the hf
# engine at 1/8/32 clients, an agent-shaped LoRA step with and without prefix sharing (a 1K-token prefix;
# 4K beside a 4-bit base with checkpointed layers), server + trainer with one base mapped through CUDA
# IPC, a copy each, and a 4-bit base, a 36-second swap under load (three phases of 12 s), and the
# planner's predictions beside the measurements. About 8 minutes on an H200 (the stages' times of the
# two checks of 2026-11-26/27, summed). One JSON file: $OUT/gpu-check.json (or benchmarks/results/).
#
# The GPU machine has torch, transformers and peft but not the rest of clawrl's requirements: they
# travel as wheels in .whl/ (see docs/benchmarks.md, "The GPU check") and are installed into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."

out_dir="${OUT:-benchmarks/results}"
mkdir -p "$out_dir"
python="${PYTHON:-python3}"
if [ "${1:-}" = "--dry-run" ]; then
    python="${PYTHON:-.venv/bin/python}"
    exec "$python" benchmarks/real_shapes.py --dry-run --out "$out_dir/gpu-check-dry-run.json"
fi

if compgen -G ".whl/*.whl" >/dev/null; then
    rm -rf /tmp/site  # a warm machine keeps what an earlier call installed
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
gpu_gib=$("$python" -c "import torch; print(round(torch.cuda.get_device_properties(0).total_memory / 2**30))")
exec "$python" benchmarks/real_shapes.py --like qwen3-4b --device cuda --gpu-memory-gib "$gpu_gib" \
    --serve-requests 16 --serve-max-tokens 32 --train-prefix 1024,4000:ckpt+nf4 --train-repeats 1 \
    --swap-seconds 12 --trainer-start-s 30 --cpu-threads 4 --stage-timeout-s 150 --workdir /tmp \
    --out "$out_dir/gpu-check.json" "$@"
