"""The OpenCompass path offline: DARECompassModel (a tiny model) on a tiny local jsonl through the real
`opencompass` CLI (in-process --debug mode), producing a score; get_ppl ranks a continuation by its ELBO.
Skipped, with the reason, when the optional extra is not installed (requirements-opencompass.txt)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opencompass", reason="optional extra: pip install --no-deps opencompass==0.5.4 "
                    "mmengine-lite==0.11.0rc3 && pip install -r requirements-opencompass.txt")

CONFIG = '''
from dare.eval.opencompass import DARECompassModel
from opencompass.datasets import CustomDataset, Gsm8kEvaluator, gsm8k_dataset_postprocess, gsm8k_postprocess
from opencompass.openicl.icl_inferencer import GenInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import ZeroRetriever

datasets = [dict(abbr="tiny_sums", type=CustomDataset, path="{data}",
                 reader_cfg=dict(input_columns=["question"], output_column="answer"),
                 infer_cfg=dict(prompt_template=dict(type=PromptTemplate, template="Question: {{question}}\\nAnswer:"),
                                retriever=dict(type=ZeroRetriever), inferencer=dict(type=GenInferencer, max_out_len=8)),
                 eval_cfg=dict(evaluator=dict(type=Gsm8kEvaluator), pred_postprocessor=dict(type=gsm8k_postprocess),
                               dataset_postprocessor=dict(type=gsm8k_dataset_postprocess)))]
models = [dict(type=DARECompassModel, abbr="tiny-llada", path="tiny:llada", max_seq_len=512, max_out_len=8,
               batch_size=4, sampling=dict(temperature=0.0), run_cfg=dict(num_gpus=0))]
'''


def test_opencompass_cli_scores_a_tiny_model(tmp_path):
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + {a}?", "answer": f"#### {2 * a}"}) + "\n"
                            for a in range(3)))
    config = tmp_path / "eval_tiny.py"
    config.write_text(CONFIG.format(data=data))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "opencompass.cli.main", str(config), "-w", str(tmp_path / "work"),
                             "--debug"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = list((tmp_path / "work").rglob("summary_*.csv"))
    assert summaries, result.stdout[-3000:]
    row = next(line for line in summaries[0].read_text().splitlines() if line.startswith("tiny_sums"))
    score = row.split(",")[-1]
    assert score not in ("-", ""), row  # OpenCompass exits 0 even when a task failed: the score must be there
    assert 0.0 <= float(score) <= 100.0


@pytest.mark.parametrize("path", ["tiny:llada", "tiny:diffusion_gemma"])  # DiffusionGemma: the uniform-noise ELBO
def test_dare_compass_model_methods(path):
    from dare.eval.opencompass import DARECompassModel, to_messages
    model = DARECompassModel(path=path, elbo_samples=4)
    text = "What is 2+2? 4"
    context = model.get_token_len("What is 2+2? ")
    ppl = model.get_ppl([text, text], [context, context])
    assert model.get_ppl([text, text], [context, context]) == ppl and min(ppl) > 0  # seeded; a positive NLL bound
    if path == "tiny:llada":  # the stratified mask counts are shared by the rows (DiffusionGemma: noise per row)
        assert ppl[0] == pytest.approx(ppl[1])
    assert model.get_token_len("hello world") > 0 and len(model.generate(["Hi"], 4)) == 1
    assert to_messages([{"role": "SYSTEM", "prompt": "s"}, {"role": "HUMAN", "prompt": "q"}]) == \
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def test_dare_compass_model_refuses_what_sglang_cannot_serve():
    """``engine="sglang"``: a masked family, or a tiny: model (not a checkpoint), fails at once."""
    from dare.eval.opencompass import DARECompassModel
    with pytest.raises(ValueError, match="block-diffusion models only"):
        DARECompassModel(path="tiny:llada", engine="sglang")
    with pytest.raises(ValueError, match="serves a checkpoint"):
        DARECompassModel(path="tiny:sdar", engine="sglang")


def test_dare_compass_model_takes_the_engines_options_and_refuses_before_loading(monkeypatch):
    from dare.eval.opencompass import DARECompassModel
    for name in ("llada", "diffusion_gemma"):
        model = DARECompassModel(path=f"tiny:{name}", options=dict(compile=True))
        assert model.engine.settings.compile and model.engine.decoder is not model.engine.model
    import dare.eval.opencompass as compass
    monkeypatch.setattr(compass, "load_weights", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    with pytest.raises(ValueError, match=r"unknown options \['compiled'\]; the hf engine's: \['compile', "):
        DARECompassModel(path="tiny:llada", options=dict(compiled=True))


def test_example_config_loads():
    from mmengine.config import Config

    from dare.eval.opencompass import DARECompassModel
    config = Config.fromfile(str(Path(__file__).resolve().parents[1] / "recipes" / "opencompass" / "llada_gsm8k.py"))
    assert config.models[0]["type"] is DARECompassModel and config.datasets
    assert config.models[0]["sampling"]["block_length"] == 8


CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "opencompass").glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_family_config_loads_and_its_sampling_fits_the_family(path):
    from mmengine.config import Config

    from dare.eval.opencompass import DARECompassModel
    from dare.models.loading import load_config
    from dare.sampling import SamplingConfig
    config = Config.fromfile(str(path))
    [model] = config.models
    assert model["type"] is DARECompassModel and config.datasets
    family = path.stem.split("_")[0]
    _, _, stand_in = load_config(f"tiny:{family}")
    SamplingConfig(**model["sampling"]).check(stand_in, path.name)  # refuses what the family's sampler cannot do
    assert model["sampling"]["gen_length"] == model["max_out_len"]


def test_gsm8k_config_renders_the_four_shot_chat_the_reference_wrapper_sends():
    """OpenCompass's gsm8k_gen template through OpenCompass's PromptTemplate, then DARE's turn mapping and the
    official LLaDA chat template: the few-shot turns become chat turns (models-and-sampling.md §7), ending on the
    question and the assistant header."""
    from mmengine.config import Config
    from opencompass.openicl.icl_prompt_template import PromptTemplate

    from dare.eval.opencompass import to_messages
    from dare.models.tokenizers import tiny_tokenizer
    config = Config.fromfile(str(CONFIGS[0].parent / "llada_gsm8k.py"))
    template = config.datasets[0]["infer_cfg"]["prompt_template"]["template"]
    question = "Janet has 3 apples and buys 4. How many?"
    prompt = PromptTemplate(template).generate_item({"question": question})
    messages = to_messages(prompt)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 4 + ["user"]
    assert messages[0]["content"].startswith("Question: Angelo and Melanie want to plan how many hours")
    assert messages[-1]["content"] == f"Question: {question}\nLet's think step by step\nAnswer:"
    text = tiny_tokenizer("llada").apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nQuestion: Angelo")
    assert text.endswith(f"Question: {question}\nLet's think step by step\nAnswer:<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert text.count("<|start_header_id|>assistant") == 5 and "The answer is 146<|eot_id|>" in text
