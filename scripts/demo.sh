#!/usr/bin/env bash
# Installs, builds, and runs the example DDP job on 2 local "nodes" x 2 ranks.
# Rank 1 crashes at step 25 on the first attempt; trainguard detects it,
# stops every rank, restarts them, and the job resumes from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
demo=$(mktemp -d /tmp/trainguard-demo.XXXXXX)
build/trainguard run --nnodes 2 --nproc-per-node 2 --max-restarts 3 --hang-timeout 30 \
  --store "$demo/trainguard.db" -- \
  /usr/bin/python3 examples/train_ddp.py --steps 60 --ckpt-dir "$demo/ckpt" --crash-at-step 25
echo
build/trainguard events --store "$demo/trainguard.db"
