#!/usr/bin/env bash
# Launch TorchTitan with zephon: torchrun over NGPU processes (gloo on CPU, NCCL on GPUs).
#   NGPU=2 CONFIG_FILE=train_configs/llama3_debug.toml ./run_train.sh [--section.field value ...]
# NGPU: processes (default: the GPUs present, else 2); CONFIG_FILE: the job config;
# LOG_RANK: ranks whose output is shown (default 0). Extra arguments go to the trainer.
set -euo pipefail
cd "$(dirname "$0")"

NGPU=${NGPU:-$(python -c "import torch; print(torch.cuda.device_count() or 2)")}
CONFIG_FILE=${CONFIG_FILE:-"./train_configs/llama3_debug.toml"}
LOG_RANK=${LOG_RANK:-0}

PYTORCH_ALLOC_CONF="expandable_segments:True" \
torchrun --nproc_per_node="${NGPU}" --rdzv_backend c10d --rdzv_endpoint="localhost:0" \
    --local-ranks-filter "${LOG_RANK}" --role rank --tee 3 \
    -m zephon.torchtitan.train --job.config_file "${CONFIG_FILE}" "$@"
