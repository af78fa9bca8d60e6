# opencompass recipes/opencompass/dream_olympiadbench.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# Dream-v0-Instruct-7B: entropy order, T 0.2, top-p 0.95, one token per step.
# olympiadbench: dataset config OlympiadBench_0shot_gen_be8b13, 2048 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.OlympiadBench.OlympiadBench_0shot_gen_be8b13 import olympiadbench_datasets

datasets = olympiadbench_datasets
models = [dict(type=DARECompassModel, abbr="dream-7b-instruct", path="Dream-org/Dream-v0-Instruct-7B", max_seq_len=8192,
               max_out_len=2048, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=2048, steps=2048, temperature=0.2, top_p=0.95, remasking='entropy'))]
