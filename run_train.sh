#!/usr/bin/env bash
# Launch TorchTitan with zephon: torchrun over NGPU processes (gloo on CPU, NCCL on GPUs).
#   NGPU=2 CONFIG_FILE=train_configs/llama3_debug.toml ./run_train.sh [--section.field value ...]
# NGPU: processes (default: the GPUs present, else 2); CONFIG_FILE: the job config;
# LOG_RANK: ranks whose output is shown (default 0). Extra arguments go to the trainer.
#
# Many nodes: run it on every node with the same NNODES, RDZV_ENDPOINT and arguments, and each
# node's NODE_RANK (0 .. NNODES-1); the dump folder (checkpoints, job plan, digests) on storage
# that every node shares:
#   NNODES=2 NODE_RANK=0 RDZV_ENDPOINT=node0:29400 NGPU=8 ./run_train.sh ...   # on node0
#   NNODES=2 NODE_RANK=1 RDZV_ENDPOINT=node0:29400 NGPU=8 ./run_train.sh ...   # on node1
# NNODES: nodes (default 1); RDZV_ENDPOINT: host:port of torchrun's c10d rendezvous (default
# localhost:0, a free port: one node only), a fixed port on node 0 that every node can reach;
# NODE_RANK: 0 on the node that hosts it (torchrun's is_host), any other on the rest. Global ranks
# follow the order in which the nodes join, not NODE_RANK (torchrun uses it with static
# rendezvous only), and the data does not depend on them.
# Several nodes on one machine (scripts/multinode_rehearsal.py): RDZV_ENDPOINT=127.0.0.1:PORT, a
# free PORT per job; nothing else is needed (GLOO_SOCKET_IFNAME=lo keeps gloo off other
# interfaces). Across machines with several interfaces, GLOO_SOCKET_IFNAME (CPU) or
# NCCL_SOCKET_IFNAME names the one the nodes reach each other on. At exit the nodes that did not
# host the rendezvous may warn "failed to shutdown the rendezvous": harmless.
#
# Paths are the caller's: CONFIG_FILE, --dump_folder and --dataloader.recipe relative to the folder
# it is run from (a config or recipe not found there: the repository's, as the shipped ones), and
# outputs land there. The job config and recipe are checked before torchrun starts, so that a
# mistake is the last thing printed (python -m zephon.torchtitan.check).
set -euo pipefail
CALLER_DIR=$(pwd)
cd "$(dirname "$0")"
export ZEPHON_CALLER_DIR="${CALLER_DIR}"

NGPU=${NGPU:-$(python -c "import torch; print(torch.cuda.device_count() or 2)")}
CONFIG_FILE=${CONFIG_FILE:-"./train_configs/llama3_debug.toml"}
if [[ "${CONFIG_FILE}" != /* && -f "${CALLER_DIR}/${CONFIG_FILE}" ]]; then
    CONFIG_FILE="${CALLER_DIR}/${CONFIG_FILE}"
fi
LOG_RANK=${LOG_RANK:-0}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
RDZV_ENDPOINT=${RDZV_ENDPOINT:-"localhost:0"}

NODES=()  # one node: torchrun's command line as it always was
if [[ "${NNODES}" != 1 ]]; then
    # node 0 hosts the rendezvous, the others join it: said, not guessed from host names
    NODES=(--nnodes="${NNODES}" --rdzv_conf="is_host=$([[ "${NODE_RANK}" == 0 ]] && echo 1 || echo 0)")
fi

python -m zephon.torchtitan.check --job "${CONFIG_FILE}" --world-size "$((NGPU * NNODES))" "$@"

PYTORCH_ALLOC_CONF="expandable_segments:True" \
torchrun --nproc_per_node="${NGPU}" "${NODES[@]}" --rdzv_backend c10d --rdzv_endpoint="${RDZV_ENDPOINT}" \
    --local-ranks-filter "${LOG_RANK}" --role rank --tee 3 \
    -m zephon.torchtitan.train --job.config_file "${CONFIG_FILE}" "$@"
