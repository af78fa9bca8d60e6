"""Multimodal rows (``dare.data.images``) and the generated visual task (``task:shapes``): every picture shows its
scene and its answer, images round-trip through parquet and jsonl, bad images fail with one line naming the row, and
text models refuse rows that hold pictures."""

import io
import json

import pytest
from PIL import Image

from dare.data import load_rows
from dare.data.images import data_uri, load_image, png, row_images
from dare.data.tasks import CELL, COLOURS, GRID, make_task, write_task


def colour_cells(picture: Image.Image) -> dict[int, str]:
    """The colour of each non-empty cell, read from the pixels (the most common non-white one)."""
    found = {}
    for cell in range(GRID * GRID):
        x, y = cell % GRID * CELL, cell // GRID * CELL
        pixels = [picture.getpixel((x + i, y + j)) for i in range(CELL) for j in range(CELL)]
        named = [name for p in pixels for name, rgb in COLOURS.items() if p == rgb]
        if named:
            found[cell] = max(set(named), key=named.count)
    return found


def test_every_picture_shows_its_scene_and_its_answer():
    for row in make_task("shapes", 300, seed=5):
        picture = Image.open(io.BytesIO(row["images"][0]))
        assert picture.size == (GRID * CELL, GRID * CELL)
        cells = colour_cells(picture.convert("RGB"))
        scene = {int(part.split()[-1]): part.split()[0] for part in row["extra_info"]["scene"].split("; ")}
        assert cells == scene
        asked = row["prompt"][0]["content"].split("How many ")[1].split()[0]
        assert int(row["reward_model"]["ground_truth"]) == sum(c == asked for c in cells.values())
        assert row["prompt"][0]["content"].startswith("<image>\n")


def test_the_reference_answers_earn_full_reward_and_the_answers_spread():
    from dare.rewards import get_reward, score_for_source
    rows = make_task("shapes", 400, seed=6)
    fn = get_reward(score_for_source("shapes"))
    assert all(fn(r["extra_info"]["solution"], r["reward_model"]["ground_truth"], r["extra_info"]).score == 1.0
               for r in rows)
    answers = [r["reward_model"]["ground_truth"] for r in rows]
    assert {"0", "1", "2", "3"} <= set(answers) and max(answers.count(a) for a in set(answers)) < 0.5 * len(rows)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_images_round_trip_through_files_and_text_models_refuse_them(tmp_path, suffix):
    path = write_task("shapes", str(tmp_path / f"shapes{suffix}"), 6)
    with pytest.raises(ValueError, match="holds images.*reads text only"):
        load_rows(path)
    rows = load_rows(path, images=True)
    for row, made in zip(rows, make_task("shapes", 6), strict=True):
        (picture,) = row_images(row, row["prompt"][0]["content"], tmp_path, "row")
        assert picture.tobytes() == Image.open(io.BytesIO(made["images"][0])).convert("RGB").tobytes()
    with pytest.raises(ValueError, match="holds images"):
        load_rows("task:shapes", "test")
    from dare.eval.benchmarks import load_benchmark
    with pytest.raises(ValueError, match="questions are pictures"):
        load_benchmark("task:shapes", limit=2)


def test_every_form_of_an_image_entry_reads_the_same_picture(tmp_path):
    picture = Image.new("RGB", (5, 3), (10, 200, 30))
    data = png(picture)
    (tmp_path / "p.png").write_bytes(data)
    forms = [data, {"bytes": data, "path": None}, {"bytes": None, "path": "p.png"}, "p.png", str(tmp_path / "p.png"),
             data_uri(data), picture.convert("L")]
    for form in forms[:-1]:
        assert load_image(form, tmp_path).tobytes() == picture.tobytes()
    assert load_image(forms[-1]).mode == "RGB"


def test_bad_images_fail_with_one_line_naming_the_row(tmp_path):
    row = {"images": ["missing.png"]}
    with pytest.raises(FileNotFoundError, match="row 3 image 0: image file .*missing.png.* not found"):
        row_images(row, "<image>\nq", tmp_path, "row 3")
    with pytest.raises(ValueError, match="row 3 image 0: the image cannot be read"):
        row_images({"images": [b"not a png"]}, "<image> q", tmp_path, "row 3")
    with pytest.raises(ValueError, match="2 <image> placeholder.*holds 1 image"):
        row_images({"images": [b"x"]}, "<image> and <image>", tmp_path, "row 3")
    with pytest.raises(ValueError, match="needs 'bytes' or 'path'"):
        load_image({"url": "x"}, where="row 1")
    with pytest.raises(ValueError, match="got int"):
        load_image(7, where="row 1")
    assert row_images({"question": "q"}, "no pictures here", tmp_path) == []


def test_rl_rows_keep_their_pictures_checked_and_fit_by_their_placeholders(tmp_path):
    """prompt_rows with images: each row keeps its pictures' bytes (a jsonl's data URIs decoded); a row whose
    placeholders and pictures disagree, or whose picture cannot be read, fails naming the row; a text run refuses
    the file. fitting_prompts counts each picture as the placeholders it takes."""
    from dare.data import RLDataConfig, prompt_rows
    from dare.data.rl import fitting_prompts
    from dare.models import pictures, tiny

    path = write_task("shapes", str(tmp_path / "shapes.jsonl"), 4)
    rows = prompt_rows(path, "train", RLDataConfig(), images=True)
    assert [r["images"] for r in rows] == [m["images"] for m in make_task("shapes", 4)]
    with pytest.raises(ValueError, match="holds images"):
        prompt_rows(path, "train", RLDataConfig())
    lines = (tmp_path / "shapes.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    for change, match in (({"images": bad["images"] * 2}, "row 2: the prompt has 1 <image> placeholder.* 2 image"),
                          ({"images": ["data:image/png;base64,AAAA"]}, "row 2 image 0: the image cannot be read")):
        (tmp_path / "bad.jsonl").write_text("\n".join(lines[:2] + [json.dumps({**bad, **change})]) + "\n")
        with pytest.raises(ValueError, match=match):
            prompt_rows(str(tmp_path / "bad.jsonl"), "train", RLDataConfig(), images=True)
    model, tok = tiny("llada_v")
    reader = pictures(model.config)
    config = RLDataConfig(max_prompt_length=4096)
    _, longest = fitting_prompts(tok, path, "train", config, None, reader)
    text = max(len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True)) for r in rows)
    assert longest > text + reader.count((48, 48)) - 10
    with pytest.raises(ValueError, match="no prompt fits"):
        fitting_prompts(tok, path, "train", RLDataConfig(max_prompt_length=text), None, reader)


def picture_benchmarks(folder):
    """Local copies of MathVista's testmini and ChartQA's test split in the hubs' own schemas (parquet shards with
    hashed names under data/), two rows each."""
    import pandas as pd

    pictures = [png(Image.new("RGB", (8 + i, 6), (40 * i, 90, 200))) for i in range(2)]
    (folder / "mathvista" / "data").mkdir(parents=True)
    pd.DataFrame([
        {"pid": "1", "question": "Which bar is tallest?", "image": "images/1.jpg",
         "decoded_image": {"bytes": pictures[0], "path": "1.jpg"}, "choices": ["red", "blue", "green"],
         "answer": "blue", "question_type": "multi_choice", "answer_type": "text",
         "query": "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the "
                  "end.\nQuestion: Which bar is tallest?\nChoices:\n(A) red\n(B) blue\n(C) green"},
        {"pid": "2", "question": "How many bars?", "image": "images/2.jpg",
         "decoded_image": {"bytes": pictures[1], "path": "2.jpg"}, "choices": None, "answer": "7",
         "question_type": "free_form", "answer_type": "integer",
         "query": "Hint: Please answer the question requiring an integer answer.\nQuestion: How many bars?"},
    ]).to_parquet(folder / "mathvista" / "data" / "testmini-00000-of-00001-5a2c.parquet")
    (folder / "chartqa" / "data").mkdir(parents=True)
    pd.DataFrame([{"image": {"bytes": pictures[0], "path": None}, "query": "What is the peak value?",
                   "label": ["41.5"], "human_or_machine": 0},
                  {"image": {"bytes": pictures[1], "path": None}, "query": "Which year is highest?",
                   "label": ["2019"], "human_or_machine": 1}]).to_parquet(
        folder / "chartqa" / "data" / "test-00000-of-00001.parquet")
    return pictures


def test_mathvista_and_chartqa_read_their_local_hub_files_with_pictures(tmp_path):
    """The picture benchmarks from local copies of the hubs' own files: each row's picture, its question after an
    <image>, the boxed instruction; a multiple-choice answer becomes its option letter; a text run refuses them; the
    default rewards: math (MathVista), ChartQA's relaxed accuracy."""
    from dare.eval.benchmarks import load_benchmark
    from dare.rewards import get_reward, score_for_source

    pictures = picture_benchmarks(tmp_path)
    vista = load_benchmark("mathvista", str(tmp_path / "mathvista"), images=True)
    assert [r["ground_truth"] for r in vista] == ["B", "7"] and [r["images"] for r in vista] == [[p] for p in pictures]
    assert vista[0]["prompt"][0]["content"].startswith("<image>\nHint:") and "\\boxed{}" in vista[0]["prompt"][0][
        "content"]
    chart = load_benchmark("chartqa", str(tmp_path / "chartqa"), images=True)
    assert [r["ground_truth"] for r in chart] == ["41.5", "2019"] and chart[1]["data_source"] == "chartqa"
    with pytest.raises(ValueError, match="holds images"):
        load_benchmark("mathvista", str(tmp_path / "mathvista"))
    assert score_for_source("mathvista") == "math" and score_for_source("chartqa") == "relaxed"
    relaxed = get_reward("relaxed")
    scores = [relaxed(f"So \\boxed{{{answer}}}.", truth).score for answer, truth in
              (("43", "41.5"), ("44", "41.5"), ("45%", "45"), ("Yes", "yes"), ("No", "yes"), ("0.1", "0"))]
    assert scores == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]  # 43 is 3.6 % off 41.5, 44 is 6.0 % off
    assert relaxed("no box", "41.5").score == 0.0


def test_evaluate_scores_a_picture_benchmark_from_local_files(tmp_path):
    """evaluate.py --bench mathvista --data-dir with tiny:llada_v: every row decoded with its picture and scored."""
    import evaluate

    picture_benchmarks(tmp_path)
    args = evaluate.Args(model="tiny:llada_v", bench="mathvista", output_dir=str(tmp_path / "out"))
    args.data_dir, args.sampling.gen_length = str(tmp_path / "mathvista"), 4
    evaluate.main(args)
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.0.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["bench"] == "mathvista" for r in records)
