#!/usr/bin/env bash
# GPU smoke test: TorchTitan's llama3 debug model with zephon's loader, once with FlexAttention
# (llama3_debugmodel) and once with varlen attention (llama3_debugmodel_varlen_attn), each with
# per-document masks from zephon's positions: 6 steps on 1 GPU with a checkpoint at step 3, then
# a resume from step 3 on another rank count: 2 GPUs where there are 2, else 2 CPU ranks (gloo,
# zephon's CPU attention: the same masks, dense kernels), which also checks that CPU runs train
# as the GPU does. Passes when steps 4-6 of each resumed run see the same global batches
# (digests) as the uninterrupted run, and losses within 1e-3 relative (1e-2 from GPU to CPU:
# other kernels, TF32 matmuls). Prints every step's digest and loss.
#   scripts/gpu_smoke.sh            (ALLOW_CPU=1 to run it without a GPU: every run on CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu_smoke}
rm -rf "$OUT" && mkdir -p "$OUT"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" = 0 ] && [ "${ALLOW_CPU:-0}" != 1 ]; then
  echo "no GPU here (ALLOW_CPU=1 runs it on CPU)" >&2
  exit 1
fi
# TorchTitan that cannot import (0.3.0 needs torch 2.13: torch.distributed.fsdp.DataParallelMeshDims): say so at once
if ! WHY=$(python -c "import torchtitan.train" 2>&1); then
  echo "TorchTitan cannot be imported here (torch $(python -c 'import torch; print(torch.__version__)')); the cause:" >&2
  echo "$WHY" | tail -3 >&2
  exit 2
fi
python -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"

STATUS=0
for ATTENTION in flex varlen; do
  MODEL=llama3_debugmodel
  [ "$ATTENTION" = varlen ] && MODEL=llama3_debugmodel_varlen_attn  # TorchTitan's registry: attn_backend="varlen"
  DUMP="$OUT/$ATTENTION"
  COMMON=(--config "$MODEL" --dump_folder "$DUMP" --training.steps 6 --checkpoint.interval 3 --metrics.disable_color_printing)
  echo "== $ATTENTION attention ($MODEL): 6 steps on 1 rank, a checkpoint at step 3"
  NGPU=1 ./run_train.sh "${COMMON[@]}" 2>&1 | tee "$OUT/$ATTENTION-first.log" | grep -E "step: |Error" || true
  cp "$DUMP/batch_digests.jsonl" "$OUT/$ATTENTION-first-digests.jsonl" || true
  if [ "$GPUS" -ge 2 ]; then
    WHERE="2 GPUs"; HIDE=(); TOLERANCE=1e-3
  else
    WHERE="2 CPU ranks"; HIDE=(env CUDA_VISIBLE_DEVICES=)  # no GPU visible: zephon's CPU support
    TOLERANCE=$([ "$GPUS" = 0 ] && echo 1e-3 || echo 1e-2)
  fi
  echo "== $ATTENTION attention: resumed from step 3 on $WHERE"
  "${HIDE[@]}" env NGPU=2 ./run_train.sh "${COMMON[@]}" --checkpoint.load_step 3 2>&1 \
    | tee "$OUT/$ATTENTION-resumed.log" | grep -E "step: |Error" || true
  python - "$OUT" "$ATTENTION" "$WHERE" "$TOLERANCE" <<'PY' || STATUS=1
import json, os, sys
from zephon.testing import logged_losses
out, attention, where, tolerance = sys.argv[1:]
def lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]
first = {d["step"]: d["digest"] for d in lines(f"{out}/{attention}-first-digests.jsonl")}
resumed = {d["step"]: d["digest"] for d in lines(f"{out}/{attention}/batch_digests.jsonl")[len(first):]}
with open(f"{out}/{attention}-first.log") as f:
    a = logged_losses(f.read())
with open(f"{out}/{attention}-resumed.log") as f:
    b = logged_losses(f.read())
ok = sorted(first) == [1, 2, 3, 4, 5, 6] and sorted(resumed) == [4, 5, 6]
ok = ok and all(resumed[s] == first[s] for s in resumed)
ok = ok and sorted(b) == [4, 5, 6] and all(abs(b[s] - a[s]) <= float(tolerance) * a[s] for s in b)
print(f"{attention} attention: step  digest (1 rank)            resumed on {where:<12} loss      resumed")
for s in range(1, 7):
    print(f"{s:>21}  {first.get(s, '-')[:24]:<24}  {resumed.get(s, '-')[:24]:<24}  {a.get(s, '-')!s:<9} {b.get(s, '-')}")
print(f"{attention} attention:", "PASSED" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
done
echo "GPU smoke test" "$([ $STATUS = 0 ] && echo PASSED || echo FAILED)"
exit $STATUS
