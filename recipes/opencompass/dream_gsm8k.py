# opencompass recipes/opencompass/dream_gsm8k.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# Dream-v0-Instruct-7B: entropy order, T 0.2, top-p 0.95, one token per step.
# gsm8k: the reference's dataset config gsm8k_gen, 256 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.gsm8k.gsm8k_gen import gsm8k_datasets

datasets = gsm8k_datasets
models = [dict(type=DARECompassModel, abbr="dream-7b-instruct", path="Dream-org/Dream-v0-Instruct-7B", max_seq_len=8192,
               max_out_len=256, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=256, steps=256, temperature=0.2, top_p=0.95, remasking='entropy'))]
