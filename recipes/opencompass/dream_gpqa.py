# opencompass recipes/opencompass/dream_gpqa.py -w outputs/opencompass   (docs/evaluation.md "OpenCompass")
# Dream-v0-Instruct-7B: entropy order, T 0.2, top-p 0.95, one token per step.
# gpqa: dataset config gpqa_gen (the reference's gpqa_fewshot_gen is not in OpenCompass 0.5.4), 128 tokens
# (models-and-sampling.md §7.1-7.2). Keep configs to plain data and `from` imports (mmengine re-reads them).
from mmengine.config import read_base

from dare.eval.opencompass import DARECompassModel

with read_base():
    from opencompass.configs.datasets.gpqa.gpqa_gen import gpqa_datasets

datasets = gpqa_datasets
models = [dict(type=DARECompassModel, abbr="dream-7b-instruct", path="Dream-org/Dream-v0-Instruct-7B", max_seq_len=8192,
               max_out_len=128, batch_size=8, dtype="bfloat16", elbo_samples=32, run_cfg=dict(num_gpus=1),
               sampling=dict(gen_length=128, steps=128, temperature=0.2, top_p=0.95, remasking='entropy'))]
