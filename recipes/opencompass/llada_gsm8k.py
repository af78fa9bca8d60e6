# opencompass recipes/opencompass/llada_gsm8k.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# LLaDA-8B-Instruct on OpenCompass's GSM8K with DARE's sampler (models-and-sampling.md §7.2: 256 tokens, block 8,
# one token per step, greedy, prefix cache). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.gsm8k.gsm8k_gen import gsm8k_datasets

datasets = gsm8k_datasets
models = [dict(type=DARECompassModel, abbr="llada-8b-instruct", path="GSAI-ML/LLaDA-8B-Instruct", max_seq_len=4096,
               max_out_len=256, batch_size=8, dtype="bfloat16",
               sampling=dict(gen_length=256, steps=256, block_length=8, temperature=0.0, cache="prefix"),
               elbo_samples=32, run_cfg=dict(num_gpus=1))]
