#!/usr/bin/env bash
# GPU checks on a machine with one NVIDIA GPU, in a few minutes:
#   1. the gpu-marked tests (fp16 + GradScaler, bf16, channels_last, pinned copies, compile,
#      the memory snapshot and the out-of-memory line, a CUDA profile,
#      peak CUDA memory, no host syncs between log steps);
#   2. a 1-GPU NCCL process group with DDP around a model (one step);
#   3. a gear ablation of resnet50 at 224x224 on synthetic data (the baseline, each gear
#      alone, all gears; then activation checkpointing, host data through the tuned loader
#      with and without prefetch_to_device, and batch_size=auto), the report table
#      (scripts/report.py), and each run's MFU and advisor findings;
#   4. real JPEGs: resnet50 experiment=fast on a generated folder of 400x400 JPEGs at 224,
#      decoded by the loader's workers (data.decode=host), on the GPU (data.decode=gpu), and
#      on the GPU from the resized JPEG copy (data.stage_format=jpeg), against the on-device
#      synthetic run of step 3: img/s and data wait;
#   5. make bench-data's loaders (workers, resized copies, data.decode=gpu) against the
#      torchvision recipe, with 4 workers, ending in normalised floats on the GPU
#      (GPU_CHECK_BENCH_DATA=0 skips it);
#   6. GPT-2 124M (model=gpt2, GPT-2's 50257-token head, windows of 1024 synthetic tokens):
#      every gear off (experiment=lm) against experiment=[fast,lm] with compile=on (bf16,
#      fused AdamW): tokens/s, MFU and which FLOP count it uses;
#   7. plan.check=true (docs/planning.md) for resnet50 at 224 (batch 128, amp=bf16) and
#      GPT-2 124M (16 x 1024, amp=bf16), a few steps each: the planned peak and step time
#      against the measured ones and their ratios (goal: within 10% and 25%).
# Usage: scripts/gpu_check.sh [OUT_DIR]     (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-gpu_check}
COMMON=${GPU_CHECK_COMMON:-"model=resnet50 data.image_size=224 data.num_samples=1024 \
data.num_val_samples=0 batch_size=128 max_steps=30 warmup_steps=10 log_every_n_steps=10 \
logger=none progress_bar=false device=cuda advise=true"}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

echo "== gpu tests"
"$PY" -m pytest -q -m gpu tests/test_gpu.py tests/test_gpu_pipeline.py \
  tests/test_gpu_decode.py \
  tests/test_profile.py \
  tests/test_nonfinite.py tests/test_clipping.py tests/test_blocks.py \
  tests/test_deterministic.py tests/test_ema.py -p no:cacheprovider

echo "== NCCL process group (1 rank) + DDP step"
"$PY" - <<'PY'
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(4, device="cuda"); dist.all_reduce(x)
model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[0])
model(torch.randn(4, 8, device="cuda")).sum().backward()
print("nccl", torch.cuda.nccl.version(), "all_reduce ok:", x.tolist() == [1.0] * 4,
      "ddp grad ok:", model.module.weight.grad is not None)
dist.destroy_process_group()
PY

echo "== ablation: $COMMON"
rm -rf "$OUT"
run() {
  local name=$1; shift
  echo "-- $name: $*"
  # shellcheck disable=SC2086  # COMMON is a list of overrides
  "$PY" train.py $COMMON "$@" "hydra.run.dir=$OUT/$name" > "$OUT.$name.log" 2>&1 \
    || { echo "   failed; tail of its log:"; tail -5 "$OUT.$name.log"; }
}
mkdir -p "$(dirname "$OUT")"
run baseline
run amp_bf16 amp=on
run amp_fp16 amp=fp16
run channels_last memory_format=channels_last
run cudnn_benchmark cudnn_benchmark=true
run tf32 matmul_precision=high
run fused_optimizer optimizer.fused=true optimizer.set_to_none=true
run compile compile=on
run all experiment=fast
run checkpointing model.checkpointing=true
run host_data data.on_device=false dataloader=tuned
run host_prefetch data.on_device=false dataloader=tuned dataloader.prefetch_to_device=true
run batch_auto batch_size=auto amp=on
"$PY" scripts/report.py "$OUT"

echo "== MFU and advisor findings per run"
"$PY" scripts/gpu_summaries.py runs "$OUT"

echo "== real JPEGs: experiment=fast, decoded in the workers vs on the GPU"
JPEGS="${OUT}_jpegs"
"$PY" - "$JPEGS" <<'PY'
# 4,096 JPEGs of 400x400 in 10 classes (ImageNet's typical size), once; 28 batches an
# epoch at batch 128, so the epoch boundaries (the loader's refill) weigh as in a real run
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
import numpy as np
from PIL import Image
root = Path(sys.argv[1])
def write(i):
    path = root / f"c{i % 10}" / f"{i}.jpg"
    if not path.exists():
        rng = np.random.default_rng(i)
        ramp = np.linspace(0, 255, 400)[None, :, None] * rng.uniform(0.3, 1, (1, 1, 3))
        pixels = np.clip(ramp + rng.normal(0, 20, (400, 400, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=90)
for k in range(10):
    (root / f"c{k}").mkdir(parents=True, exist_ok=True)
with ProcessPoolExecutor() as pool:
    list(pool.map(write, range(4096), chunksize=64))
PY
JPEG_RUNS="${OUT}_jpeg"
rm -rf "$JPEG_RUNS" "$JPEG_RUNS.stage"
OUT=$JPEG_RUNS
JPEG_DATA="data=imagefolder data.path=$JPEGS data.num_classes=10 data.num_samples=null \
max_steps=60"
# shellcheck disable=SC2086  # a list of overrides
run host_decode experiment=fast $JPEG_DATA data.decode=host
# shellcheck disable=SC2086
run gpu_decode experiment=fast $JPEG_DATA data.decode=gpu
# shellcheck disable=SC2086  # the GPU decodes the resized JPEG copy (~258 px) instead
run gpu_decode_staged experiment=fast $JPEG_DATA data.decode=gpu \
  "data.stage_to=$JPEG_RUNS.stage" data.stage_format=jpeg
"$PY" scripts/gpu_summaries.py images "${JPEG_RUNS%_jpeg}/all" "$JPEG_RUNS/host_decode" \
  "$JPEG_RUNS/gpu_decode" "$JPEG_RUNS/gpu_decode_staged"

if [ "${GPU_CHECK_BENCH_DATA:-1}" = 1 ]; then
  echo "== image loaders vs the torchvision recipe (make bench-data), on the GPU"
  "$PY" scripts/bench_data.py --images 1024 --workers 4 --repeats 3 --no-decoders
fi

echo "== GPT-2 124M: every gear off vs experiment=[fast,lm] compile=on"
OUT="${JPEG_RUNS%_jpeg}_gpt2"
rm -rf "$OUT"
# model.vocab_size: GPT-2's head (50304 rows once padded); the synthetic tokens use 64 ids
COMMON="model=gpt2 model.vocab_size=50257 data.num_samples=1024 data.num_val_samples=0 \
batch_size=32 max_steps=40 warmup_steps=15 log_every_n_steps=10 logger=none \
progress_bar=false device=cuda"
run gears_off experiment=lm
run fast_compiled "experiment=[fast,lm]" compile=on
"$PY" scripts/gpu_summaries.py tokens "$OUT/gears_off" "$OUT/fast_compiled"

echo "== plan.check: planned vs measured peak and step time (resnet50 224 bf16, GPT-2 124M)"
OUT="${JPEG_RUNS%_jpeg}_plan"
rm -rf "$OUT"
COMMON="data.num_samples=512 data.num_val_samples=0 max_steps=12 warmup_steps=4 \
log_every_n_steps=4 logger=none progress_bar=false device=cuda amp=bf16 plan.check=true"
run resnet50 model=resnet50 data.image_size=224 batch_size=128
run gpt2 experiment=lm model=gpt2 model.vocab_size=50257 batch_size=16
"$PY" scripts/gpu_summaries.py plan "$OUT/resnet50" "$OUT/gpt2"
