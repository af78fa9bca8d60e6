"""The GPU check cannot rot: its dry run (tiny models, CPU, short lengths) runs every row of the table."""

from conftest import ROOT, load_script


def test_gpu_check_dry_run_fills_every_row():
    check = load_script(ROOT / "bench" / "gpu_check.py", "dare_gpu_check")
    rows = check.main(["--dry-run"])
    families = {"llada", "dream", "sdar", "llada2"}
    assert {r[0] for r in rows} == families
    for family in families:
        measures = {r[1] for r in rows if r[0] == family}
        assert "numerics: argmax agreement" in measures and "rl d1: loss + backward s" in measures
        assert {f"sft{lora}{ckpt}: s / step" for lora in ("", " lora") for ckpt in ("", " ckpt")} <= measures
        assert sum(m.startswith("decode ") and "forwards" not in m for m in measures) == 4  # 2 variants x 2 lengths
    assert all(r[2] > 0 for r in rows if "tok/s" in r[3] or r[3] == "s")
    assert min(r[2] for r in rows if r[1] == "numerics: argmax agreement") > 0.9  # bf16 keeps the argmax
