# opencompass recipes/opencompass/sdar_gsm8k.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# SDAR-8B-Chat: blocks of 4, 4 steps per block, greedy (the reference's top-k 1).
# gsm8k: the reference's dataset config gsm8k_0shot_v2_gen_17d799, 4096 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.gsm8k.gsm8k_0shot_v2_gen_17d799 import gsm8k_datasets

datasets = gsm8k_datasets
models = [dict(type=DARECompassModel, abbr="sdar-8b-chat", path="JetLM/SDAR-8B-Chat", max_seq_len=8192,
               max_out_len=4096, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=4096, steps=4, temperature=0.0))]
