#!/usr/bin/env bash
# GPU smoke test: TorchTitan's llama3 debug model on one GPU with zephon's loader, 6 steps with a
# checkpoint at step 3, then a resume from step 3. Passes when steps 4-6 of the resumed run see
# the same global batches (digests) and losses (1e-3 relative) as the uninterrupted run.
#   scripts/gpu_smoke.sh            (ALLOW_CPU=1 to run it without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu_smoke}
rm -rf "$OUT" && mkdir -p "$OUT"
if [ "${ALLOW_CPU:-0}" != 1 ]; then
  python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no GPU here (ALLOW_CPU=1 runs it on CPU)')"
fi
python -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"

COMMON=(--dump_folder "$OUT/run" --training.steps 6 --checkpoint.interval 3 --metrics.disable_color_printing)
NGPU=1 ./run_train.sh "${COMMON[@]}" 2>&1 | tee "$OUT/first.log" | grep -E "step: |Error" || true
cp "$OUT/run/batch_digests.jsonl" "$OUT/first_digests.jsonl"
NGPU=1 ./run_train.sh "${COMMON[@]}" --checkpoint.load_step 3 2>&1 | tee "$OUT/resumed.log" | grep -E "step: |Error" || true

python - "$OUT" <<'PY'
import json, sys
from zephon.testing import logged_losses
out = sys.argv[1]
def losses(path):
    with open(path) as f:
        return logged_losses(f.read())
with open(f"{out}/first_digests.jsonl") as f:
    first = {d["step"]: d["digest"] for d in map(json.loads, f)}
with open(f"{out}/run/batch_digests.jsonl") as f:
    resumed = {d["step"]: d["digest"] for d in map(json.loads, f.readlines()[len(first):])}
a, b = losses(f"{out}/first.log"), losses(f"{out}/resumed.log")
ok = sorted(resumed) == [4, 5, 6] and all(resumed[s] == first[s] for s in resumed)
ok = ok and sorted(b) == [4, 5, 6] and all(abs(b[s] - a[s]) <= 1e-3 * a[s] for s in b)
for s in range(1, 7):
    print(f"step {s}: loss {a.get(s)} / resumed {b.get(s, '-')}  digest {first[s][:12]} / {resumed.get(s, '-')[:12]}")
print("GPU smoke test", "PASSED" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
