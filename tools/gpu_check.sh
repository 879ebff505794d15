#!/usr/bin/env bash
# GPU check of the training engines (nccl + bf16) through the real recipe, on the small real corpora shipped in
# corpora/tiny_fsdd and corpora/tiny_lj: data prep once, then for torch_ddp, deepspeed (ZeRO 2) and torch_fsdp (zero2)
# 20 epochs of conf/train_tiny.yaml (batch 8) in bf16, averaging, a recognize.py decode and WER. Prints what it saw:
# GPU, versions, the per-step losses, the median seconds per step and the RESULTS table of each engine. Needs only the
# repository (with corpora/tiny_*) and, if the machine lacks them, a folder of the requirements it lacks: wheels,
# and the sdists of deepspeed and kenlm (PyPI has no wheels of them), built there against the machine's own torch.
# Decodes without the word LM (--lm_order 0): its stage 2 needs wordfreq, whose word lists are 57 MB.
#
#   bash tools/gpu_check.sh [WHEEL_DIR]          # output under $OUT (or /tmp/gpu_check)
#
# One H200 (2026-12-04): 4.4 minutes, of which 1.3 building and installing the wheels, 32 s data prep and about 80 s
# for each engine (docs/multi-gpu-and-nodes.md); torch_fsdp was added later and has not run on a GPU yet.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-/tmp/gpu_check}
wheels=${1:-}
mkdir -p "$out"
if [ -n "$wheels" ]; then
  # NOTE: --no-deps keeps pip from replacing the machine's CUDA torch with anything from the wheel folder.
  { python -m pip install --no-index --no-deps "$wheels"/*.whl &&
    if compgen -G "$wheels/*.tar.gz" > /dev/null; then
      python -m pip install --no-index --no-deps --no-build-isolation "$wheels"/*.tar.gz
    fi; } > "$out/pip.log" 2>&1 || { tail -30 "$out/pip.log"; exit 1; }
fi
command -v python torchrun
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'bf16',
torch.cuda.is_bf16_supported(), '| deepspeed', deepspeed.__version__)"

recipe=$repo/examples/english/s0
overrides="train_conf.dtype bf16;train_conf.max_epoch 20;train_conf.log_interval 1;dataset_conf.batch_conf.batch_size 8"
common=(--corpus_dir "$repo/corpora" --corpora "tiny_fsdd tiny_lj" --data "$out/data"
        --train_config conf/train_tiny.yaml --decode_modes "ctc_greedy_search attention_rescoring"
        --average_num 2 --lm_order 0 --overrides "$overrides")
cd "$recipe"
SECONDS=0
bash run.sh --stage -1 --stop_stage 3 "${common[@]}" > "$out/prep.log" 2>&1
echo "data prep: ${SECONDS} s"

for engine in torch_ddp deepspeed torch_fsdp; do
  extra=()
  [ "$engine" = deepspeed ] && extra=(--deepspeed_config conf/ds_stage2.json)
  SECONDS=0
  bash run.sh --stage 4 "${common[@]}" --dir "$out/exp_$engine" --tensorboard_dir "$out/tb_$engine" \
    --train_engine "$engine" "${extra[@]}" > "$out/$engine.log" 2>&1 || { tail -40 "$out/$engine.log"; exit 1; }
  echo "== $engine: train + decode in ${SECONDS} s"
  python - "$out/$engine.log" <<'EOF'
import re, sys, datetime, statistics
steps = []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\S+ \S+) rank0 INFO epoch (\d+) \| step (\d+) \| loss ([\d.]+)", line)
    if m:
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        steps.append((int(m.group(2)), int(m.group(3)), float(m.group(4)), t))
print("losses:", " ".join(f"{loss:.2f}" for _, _, loss, _ in steps))
gaps = [(b[3] - a[3]).total_seconds() for a, b in zip(steps, steps[1:]) if a[0] == b[0]]
if gaps:
    print(f"steps {len(steps)}, median {statistics.median(gaps):.3f} s/step (log_interval 1, same epoch)")
EOF
  cat "$out/exp_$engine/RESULTS.md"
done
