# opencompass recipes/opencompass/llada_mbpp.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# LLaDA-8B-Instruct: prefix cache, one token per step, greedy.
# mbpp: the reference's dataset config mbpp_gen, 512 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.mbpp.mbpp_gen import mbpp_datasets

datasets = mbpp_datasets
models = [dict(type=DARECompassModel, abbr="llada-8b-instruct", path="GSAI-ML/LLaDA-8B-Instruct", max_seq_len=8192,
               max_out_len=512, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=512, steps=512, block_length=32, temperature=0.0, cache='prefix'))]
