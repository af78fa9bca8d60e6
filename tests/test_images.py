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
