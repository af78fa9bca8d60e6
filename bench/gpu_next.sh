#!/bin/bash
# The next lent-GPU session, one prepared run (the wheels of bench/gpu_wheels.txt in .whl/, carried; see gpu_check.py):
# the GPU rows still missing, most wanted first: compiled decoding against eager (issue 47: --hf.compile, CUDA graphs
# with reduce-overhead), SDAR-MoE and DiffusionGemma in gpu_check, and FlexAttention's training rows (forward +
# backward: torch has no FlexAttention backward on CPU). Copy $OUT into bench/results/<device>-<date>/.
#     run: bash bench/gpu_next.sh        (device tool, timeout_s 540, carry [".whl"])
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -c "import sys; sys.path.insert(0, '.'); import dare.algos, dare.engines, train_rl; print('imports ok')" 2>&1 | tee $OUT/env.txt
grep -q "imports ok" $OUT/env.txt || exit 2
date +%s > $OUT/t0
for mode in default reduce-overhead; do  # LLaDA without cache: one graph
    timeout 60 python3 bench/bench_compile.py --device cuda --dtype bfloat16 --mode $mode --families llada \
        --batch 8 --gen-length 256 2>&1 | grep -v "^W\|^ " | tee $OUT/bench_compile_llada_$mode.txt
done
for family in sdar llada2; do  # the fixed-size block cache: three graphs for any length, captured as CUDA graphs
    timeout 80 python3 bench/bench_compile.py --device cuda --dtype bfloat16 --mode reduce-overhead \
        --families $family --batch 8 --gen-length 256 2>&1 | grep -v "^W\|^ " | tee $OUT/bench_compile_$family.txt
done
timeout 120 python3 bench/gpu_check.py --families sdar_moe diffusion_gemma --lengths 256 512 2>&1 | tee $OUT/gpu_check.txt
timeout 80 python3 bench/bench_flex.py --device cuda --dtype bfloat16 --hidden 1024 --layers 8 --rows 8 \
    --lengths 1024 2048 4096 2>&1 | tee $OUT/bench_flex.txt
echo "total $(( $(date +%s) - $(cat $OUT/t0) )) s"
