#!/bin/bash
# the lent-GPU session: bench/gpu_check.py and bench/bench_sglang.py (hf engine: SGLang's wheels do not fit the carry)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import torch, transformers, peft, trl, datasets, pyarrow, numpy, tyro; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
  python3 -c "import sys; sys.path.insert(0, '.'); import dare.algos, dare.engines, train_rl; print('imports ok')"; } 2>&1 | tee $OUT/env.txt
grep -q "imports ok" $OUT/env.txt || exit 2
date +%s > $OUT/t0
timeout 340 python3 bench/gpu_check.py --lengths 256 512 2>&1 | tee $OUT/gpu_check.txt
timeout 180 python3 bench/bench_sglang.py --engines hf --prompts 64 --rl-steps 2 --rl-prompts 8 --out /tmp/bs 2>&1 | tee $OUT/bench_sglang.txt
echo "total $(( $(date +%s) - $(cat $OUT/t0) )) s"
