# opencompass recipes/opencompass/llada2_mmlu_pro.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# LLaDA2.0-mini: blocks of 32, 32 steps per block, greedy, threshold 0.95.
# mmlu_pro: dataset config mmlu_pro_gen, 256 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.mmlu_pro.mmlu_pro_gen import mmlu_pro_datasets

datasets = mmlu_pro_datasets
models = [dict(type=DARECompassModel, abbr="llada2.0-mini", path="inclusionAI/LLaDA2.0-mini", max_seq_len=8192,
               max_out_len=256, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=256, steps=32, temperature=0.0, threshold=0.95))]
