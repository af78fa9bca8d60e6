"""Re-create and run the bad-input cases of shared/reports/bad-inputs.md (72 cases) plus our own (x.., "added").

    python bench/bad_inputs.py --out /tmp/bad                   # ~25 min on 2 cores; table in /tmp/bad/table.md
    python bench/bad_inputs.py --out /tmp/bad --only 'resume|2[67]_' --jobs 2

Fixtures are built under <out>/bad, each case writes to <out>/runs/<case>, its command and output to
<out>/logs/<case>.log. A case PASSes when its exit code is the expected one and, for an expected refusal (exit 2):
exactly one one-line `error:` message, no traceback, the message matching the case's `mention` (what the report
asked it to name) and its --output-dir, where one existed, unchanged; for an expected success: its `mention` in the
output and its `creates` file made. Cases that need ../shared (official configs, reference data) skip when it is absent.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
       "DARE_DEBUG": "0", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # the package of this checkout
RL = ("--algo d1 --model tiny:llada --max-steps 1 --prompts-per-step 2 --num-generations 4 --micro-batch-size 4 "
      "--rollout.gen-length 16 --data.path tests/data/addition.jsonl")
SFT = ("--model tiny:llada --data.path tests/data/arith.jsonl --data.prompt-key q --data.response-key a "
       "--data.max-length 64 --max-steps 1")
EV = "--model tiny:llada --prompt hi --gen-length 16"
EVB = "--model tiny:llada --bench task:addition --limit 2 --gen-length 16"
RES = "--max-steps 2 --save-steps 1 --resume"  # the settings of the 2-step run the checkpoints come from
BADUTF = "hi \udcff\udcfe"  # argv bytes 0xFF 0xFE (surrogateescape)
LONG = "the quick brown fox jumps over the lazy dog " * 230  # ~10k characters


def merge(base: str, change: str) -> list[str]:
    """``base`` flags with ``change``'s flags replacing theirs (a flag's values run to the next ``--flag``)."""
    def groups(text):
        out = []
        for tok in text.split():
            if tok.startswith("--"):
                out.append([tok])
            else:
                out[-1].append(tok)
        return out
    flags = {g[0]: g for g in groups(base)}
    flags.update({g[0]: g for g in groups(change)})
    return [t for g in flags.values() for t in g]


def rl(change=""): return ("train_rl.py", merge(RL, change))
def sft(change=""): return ("train_sft.py", merge(SFT, change))
def ev(change=""): return ("evaluate.py", merge(EV, change))
def evb(change=""): return ("evaluate.py", merge(EVB, change))
def raw(script, args): return (script, args.split())
def res(folder, change=""): return rl(f"{RES} {change} --output-dir {{B}}/{folder}")  # resume a copy of ck_src


# name, (script, args), expected exit, mention: a regex the error line (a success: its output) must match, then
# options: absent (a regex the output must not match), creates (a file the success makes), stdin, ro (the output
# dir is under a read-only folder), shared (needs ../shared). An expected refusal must also leave its --output-dir
# as it was, when there was one.
CASES = [
    ("01_missing_file", rl("--data.path /nonexistent/data.parquet"), 2, "/nonexistent/data.parquet"),
    ("02_wrong_columns", rl("--data.path {B}/wrong_cols.parquet"), 2, "wrong_cols.parquet"),
    ("03_empty_parquet", rl("--data.path {B}/empty.parquet"), 2, "empty.parquet"),
    ("04_empty_jsonl", rl("--data.path {B}/empty.jsonl"), 2, "empty.jsonl"),
    ("05_garbage_parquet", rl("--data.path {B}/garbage.parquet"), 2, "garbage.parquet"),
    ("06_emptydir", rl("--data.path {B}/emptydir"), 2, "emptydir"),
    ("07_unknown_algo", rl("--algo foo"), 2, "foo"),
    ("08_unknown_bench", evb("--bench gsm9k"), 2, "gsm9k"),
    ("09_unknown_reward", rl("--rewards nosuch"), 2, "nosuch"),
    ("10_unknown_family", rl("--model tiny:gpt2"), 2, "gpt2"),
    ("11_neg_genlen", rl("--rollout.gen-length -5"), 2, "gen_length"),
    ("12_nondividing_block", rl("--rollout.gen-length 30 --rollout.block-length 8"), 2, "block_length"),
    ("13_eval_neg_genlen", ev("--gen-length -3"), 2, "gen_length"),
    ("14_eval_steps_gt", ev("--steps 0"), 2, "steps"),
    ("15_yaml_wrong_types", rl("--config {B}/wrong_types.yaml"), 2, "learning_rate"),
    ("16_yaml_list_for_int", rl("--config {B}/wrong_types2.yaml"), 2, "max_steps"),
    ("14b_eval_steps_neg", ev("--steps -4"), 2, "steps"),
    ("17_yaml_unknown_key", rl("--config {B}/unknown_key.yaml"), 2, "learning_rat"),
    ("18_yaml_syntax", rl("--config {B}/syntax.yaml"), 2, "syntax.yaml"),
    ("19_config_missing", rl("--config {B}/nope.yaml"), 2, "nope.yaml"),
    ("20_model_dir_missing", ev("--model /nonexistent/model"), 2, "/nonexistent/model.*(not exist|not found|no such)"),
    ("21_model_noweights", rl("--model {B}/noweights"), 2, "noweights"),
    ("21b_eval_noweights", ev("--model {B}/noweights"), 2, "noweights"),
    ("22_corrupt_safetensors", ev("--model {B}/corrupt"), 2, "corrupt"),
    ("22b_truncated_safetensors", ev("--model {B}/truncated"), 2, "truncated"),
    ("23_no_mask_token", ev("--model {B}/nomask"), 2, "mask"),
    ("23b_no_mask_token_rl", rl("--model {B}/nomask"), 2, "mask"),
    ("21c_official_config_only", ev("--model {S}/models/LLaDA-8B-Instruct"), 2, None, {"shared": 1}),
    ("21d_official_sdar_config_only", ev("--model {S}/models/SDAR-8B-Chat"), 2, None, {"shared": 1}),
    ("24_outdir_is_file_rl", rl("--output-dir {B}/output_is_file"), 2, "output_is_file"),
    ("24b_outdir_is_file_sft", sft("--output-dir {B}/output_is_file"), 2, "output_is_file"),
    ("24c_outdir_is_file_eval", evb("--output-dir {B}/output_is_file"), 2, "output_is_file"),
    ("25_readonly_outdir_rl", rl("--output-dir {B}/ro/run"), 2, None, {"ro": 1}),
    ("25b_readonly_outdir_eval", evb("--output-dir {B}/ro/eval"), 2, None, {"ro": 1}),
    ("25c_readonly_outdir_sft", sft("--output-dir {B}/ro/sft"), 2, None, {"ro": 1}),
    # README: --resume with no complete checkpoint says so on stderr and starts anew
    ("26_resume_ckpt_empty", res("ck_empty"), 0, "no complete checkpoint"),
    ("26_resume_ckpt_corrupt_weights", res("ck_weights"), 2, "model.safetensors"),
    ("26_resume_ckpt_corrupt_state", res("ck_state"), 2, "trainer_state.json"),
    ("26_resume_ckpt_incomplete", res("ck_incomplete"), 0, "^step 2/2  loss",  # from checkpoint-1: trains step 2
     {"absent": "^step 1/", "creates": "{B}/ck_incomplete/checkpoint-2/COMPLETE"}),
    ("26_resume_ckpt_corrupt_optim", res("ck_optim", "--max-steps 3"), 2, "optimizer.pt"),
    ("27_resume_ckpt_mid_corrupt_optim", res("ck_mid_optim"), 2, "optimizer.pt"),
    ("27_resume_ckpt_mid_corrupt_weights", res("ck_mid_weights"), 2, "model.safetensors"),
    ("27_resume_ckpt_mid_corrupt_rng", res("ck_mid_rng"), 2, "rng_state.pth"),
    ("28_nonutf8_prompt_arg", ev("--prompt {BADUTF}"), 2, "utf-8"),
    ("28b_nonutf8_jsonl", rl("--data.path {B}/nonutf8.jsonl"), 2, "nonutf8.jsonl"),
    # the chat refuses the line and reads on: exit 0 at end of input, with the error said
    ("28c_nonutf8_stdin_chat", raw("evaluate.py", "--model tiny:llada --gen-length 16"), 0,
     "^error: .*utf-8", {"stdin": b"\xff\xfe hi\n"}),
    ("29_10k_prompt", ev("--prompt {LONG}"), 2, "positions"),
    ("29b_10k_prompt_bigpos", ev("--model tiny:llada:max_sequence_length=8192 --prompt {LONG}"), 0, "tokens in"),
    ("30_conflict_prompt_bench", evb("--prompt hi"), 2, "--prompt"),
    ("31_conflict_compare_model", raw("evaluate.py", "--model tiny:llada --compare {B}/eval_tiny/report.json "
                                      "{B}/eval_tiny2/report.json"), 2, "--compare"),
    ("32_plot_without_compare", evb("--plot {R}/x.png"), 2, "--plot"),
    ("33_passk_gt_samples", evb("--pass-k 1 4"), 2, "pass-k|pass@"),
    ("34_mdpo_threshold", rl("--algo mdpo --rollout.threshold 0.9"), 2, "threshold"),
    ("35_batch_not_split", rl("--prompts-per-step 1 --num-generations 3 --micro-batch-size 2"), 2, "micro_batch"),
    ("36_bad_threshold_rule", rl("--rollout.threshold 0.9 --rollout.threshold-rule bogus"), 2, "bogus"),
    ("37_neg_temperature", rl("--rollout.temperature -1"), 2, "temperature"),
    ("38_top_p_gt1", ev("--top-p 1.5"), 2, "top_p"),
    ("39_sp_single_proc", rl("--sequence-parallel 2"), 2, "sequence_parallel"),
    ("40_datadir_missing", evb("--bench gsm8k --data-dir /nonexistent/dir"), 2, "/nonexistent/dir"),
    ("41_eval_fingerprint_mismatch", evb("--model tiny:sdar --output-dir {B}/eval_tiny"), 2, "eval_tiny"),
    ("42_sft_bad_prompt_key", sft("--data.prompt-key nope"), 2, "nope"),
    ("43_neg_limit", evb("--limit -2"), 2, "limit"),
    ("44_lora_neg_rank", rl("--lora.rank -4"), 2, "rank"),
    ("45_code_reward_on_math", rl("--rewards code"), 2, "code"),
    ("46_tiny_bad_value", rl("--model tiny:llada:n_layers=abc"), 2, "n_layers"),
    ("47_tiny_neg_layers", ev("--model tiny:llada:n_layers=-1"), 2, "n_layers"),
    ("14c_rl_neg_steps", rl("--rollout.steps -4"), 2, "steps"),
    ("48_localdir_missing_rl", rl("--data.path openai/gsm8k:main --data.local-dir /nonexistent"), 2, "/nonexistent"),
    ("50_recipe_bf16_on_cpu", raw("train_rl.py", "--config recipes/sdar/d1_math.yaml --model tiny:sdar "
                                  "--data.local-dir {S}/data/rl --max-steps 1"), 2, None, {"shared": 1}),
    ("49b_localdir_wrong_kind_sft", raw("train_sft.py", "--model tiny:llada --data.local-dir {S}/data/rl "
                                        "--data.max-length 64 --max-steps 1"), 2, None, {"shared": 1}),
    ("51_resume_changed_settings", res("ck_lora", "--max-steps 3 --lora.rank 4"), 2, "lora"),
    ("52_resume_changed_algo_lr", res("ck_algo", "--algo coupled-grpo --learning-rate 1e-3 --rollout.gen-length 32"),
     2, "learning_rate"),
    # --- additions (x..): cases the report's list implies ---
    ("x01_eval_top_p_zero", ev("--top-p 0"), 2, "top_p"),
    ("x02_eval_top_k_zero", ev("--top-k 0"), 2, "top_k"),
    ("x03_eval_genlen_zero", ev("--gen-length 0"), 2, "gen_length"),
    ("x04_rl_top_p_gt1", rl("--rollout.top-p 1.5"), 2, "top_p"),
    ("x05_rl_temperature_nan", rl("--rollout.temperature nan"), 2, "temperature"),
    ("x06_lora_rank_zero_is_full_ft", rl("--lora.rank 0"), 0, None, {"creates": "{R}/model.safetensors"}),
    ("x07_lora_alpha_zero", rl("--lora.rank 4 --lora.alpha 0"), 2, "alpha"),
    ("x08_sft_lora_neg_rank", sft("--lora.rank -4"), 2, "rank"),
    ("x09_eval_samples_zero", evb("--samples 0"), 2, "samples"),
    ("x10_eval_limit_zero", evb("--limit 0"), 2, "limit"),
    ("x11_rl_prompts_per_step_zero", rl("--prompts-per-step 0"), 2, "prompts.per.step"),
    ("x12_rl_num_generations_zero", rl("--num-generations 0"), 2, "num.generations"),
    ("x13_yaml_unknown_nested_key", rl("--config {B}/unknown_nested.yaml"), 2, "gen_lenght"),
    ("x14_unknown_task", rl("--data.path task:nosuch"), 2, "nosuch"),
    ("x15_rl_corrupt_safetensors", rl("--model {B}/corrupt"), 2, "corrupt"),
    ("x16_sft_nonutf8_jsonl", sft("--data.path {B}/nonutf8.jsonl --data.prompt-key prompt "
                                  "--data.response-key extra_info.solution"), 2, "nonutf8.jsonl"),
    ("x17_sft_empty_parquet", sft("--data.path {B}/empty.parquet"), 2, "empty.parquet"),
    ("x18_compare_missing_report", raw("evaluate.py", "--compare {B}/nope/report.json {B}/eval_tiny/report.json"), 2,
     "nope"),
    ("x19_resume_must_without_ckpt", res("ck_must", "--resume-must"), 2, "ck_must"),
    ("x20_resume_finished_more_steps", res("ck_more", "--max-steps 3"), 0, "^step 3/3  loss",
     {"absent": "^step [12]/", "creates": "{B}/ck_more/checkpoint-3/COMPLETE"}),
    ("x21_resume_mid_intact", res("ck_mid_ok"), 0, "^step 2/2  loss",
     {"absent": "^step 1/", "creates": "{B}/ck_mid_ok/checkpoint-2/COMPLETE"}),
    # --- a new user's first hour (issue 57): numbers misread in silence, backends not installed ---
    ("x22_sft_max_steps_zero", sft("--max-steps 0"), 2, "max-steps"),
    ("x23_sft_max_steps_negative", sft("--max-steps -5"), 2, "max-steps"),
    ("x24_sft_accumulation_zero", sft("--gradient-accumulation-steps 0"), 2, "gradient-accumulation-steps"),
    ("x25_sft_dtype_float64", sft("--dtype float64"), 2, "float64"),
    ("x26_sft_dtype_bf16_alias", sft("--dtype bf16"), 0, None, {"creates": "{R}/model.safetensors"}),
    ("x27_rl_resume_must_alone", rl("--resume-must"), 2, "resume-must"),
    ("x28_sft_flash_attention_missing", sft("--attn-implementation flash_attention_2"), 2, "flash-attn"),
    ("x29_rl_report_to_wandb_missing", rl("--report-to wandb"), 2, "wandb"),
    ("x30_sft_task_without_keys", raw("train_sft.py", "--model tiny:llada --data.path task:sum4 --data.limit 8 "
                                      "--data.max-length 96 --max-steps 1 --output-dir {R}"), 0, None,
     {"creates": "{R}/model.safetensors"}),
]


def sh(argv, **kw):
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, **kw)
    if out.returncode:
        sys.exit(f"fixture command failed: {shlex.join(argv)}\n{out.stderr[-3000:]}")


def damage(path: Path, seed=0):
    """Overwrite the first 4 kB with random bytes (the size stays: only reading the content finds it)."""
    data = bytearray(path.read_bytes())
    n = min(4096, len(data))
    data[:n] = random.Random(seed).randbytes(n)
    path.write_bytes(bytes(data))


def build_fixtures(B: Path, ro_mode: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if B.exists():
        if (B / "ro").exists():
            (B / "ro").chmod(0o755)  # a chmod 0555 folder of an earlier run
        shutil.rmtree(B)
    (B / "emptydir").mkdir(parents=True)
    rows = [json.loads(line) for line in (ROOT / "tests/data/addition.jsonl").read_text().splitlines()]
    pq.write_table(pa.table({"question": ["What is 2 + 5?"], "answer": ["7"]}), B / "wrong_cols.parquet")
    pq.write_table(pa.Table.from_pylist(rows).slice(0, 0), B / "empty.parquet")
    (B / "empty.jsonl").write_text("")
    (B / "garbage.parquet").write_bytes(random.Random(1).randbytes(4096))
    lines = [json.dumps(r).encode() for r in rows]
    lines[1] = lines[1].replace(b'"content": "', b'"content": "\xff\xfe', 1)
    (B / "nonutf8.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for name, text in [("wrong_types", "learning_rate: fast\n"), ("wrong_types2", "max_steps: [1, 2]\n"),
                       ("unknown_key", "learning_rat: 1.0e-5\n"), ("syntax", "model: [tiny:llada\nmax_steps: 2\n"),
                       ("unknown_nested", "rollout:\n  gen_lenght: 16\n")]:
        (B / f"{name}.yaml").write_text(text)
    (B / "output_is_file").write_text("keep me\n")
    (B / "ro").mkdir(0o555 if ro_mode == "chmod" else 0o755)
    # model folders from a saved tiny SDAR
    sh(["-c", "import sys; from dare.models import save_tiny; save_tiny('sdar', sys.argv[1])", str(B / "tiny_sdar")])
    for name in ("noweights", "corrupt", "truncated", "nomask"):
        shutil.copytree(B / "tiny_sdar", B / name)
    (B / "noweights/model.safetensors").unlink()
    (B / "corrupt/model.safetensors").write_bytes(random.Random(2).randbytes(4096))
    full = (B / "truncated/model.safetensors").read_bytes()
    (B / "truncated/model.safetensors").write_bytes(full[: len(full) // 2])
    for file, key in (("config.json", "mask_token_id"), ("tokenizer_config.json", "mask_token")):
        config = json.loads((B / "nomask" / file).read_text())
        config.pop(key, None)
        (B / "nomask" / file).write_text(json.dumps(config, indent=2))
    # checkpoints of a 2-step run, one file damaged in each copy; "mid" copies lack checkpoint-2 (resume trains step 2)
    sh(["train_rl.py", *merge(RL, f"--max-steps 2 --save-steps 1 --output-dir {B}/ck_src")], timeout=600)
    damaged = {"ck_weights": "checkpoint-2/model.safetensors", "ck_state": "checkpoint-2/trainer_state.json",
               "ck_optim": "checkpoint-2/optimizer.pt", "ck_mid_optim": "checkpoint-1/optimizer.pt",
               "ck_mid_weights": "checkpoint-1/model.safetensors", "ck_mid_rng": "checkpoint-1/rng_state.pth",
               "ck_incomplete": None, "ck_lora": None, "ck_algo": None, "ck_more": None, "ck_mid_ok": None}
    for name, file in damaged.items():
        shutil.copytree(B / "ck_src", B / name)
        if "mid" in name:
            shutil.rmtree(B / name / "checkpoint-2")
        if file:
            damage(B / name / file)
    (B / "ck_incomplete/checkpoint-2/COMPLETE").unlink()  # as if killed while writing it
    (B / "ck_incomplete/checkpoint-2/optimizer.pt").unlink()
    for name in ("ck_empty", "ck_must"):
        (B / name / "checkpoint-2").mkdir(parents=True)  # created, nothing written yet
    sh(["evaluate.py", *EVB.split(), "--output-dir", str(B / "eval_tiny")], timeout=600)
    shutil.copytree(B / "eval_tiny", B / "eval_tiny2")


def digest(path: Path) -> str:
    """A hash of a file, or of a folder's file names and contents."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def run_case(case, out: Path, ro_mode: str, timeout: int):
    name, (script, args), expect, mention, *rest = case
    opt = rest[0] if rest else {}
    B, R = out / "bad", out / "runs" / name
    subst = {"B": str(B), "R": str(R), "S": str(SHARED), "BADUTF": BADUTF, "LONG": LONG}
    fill = lambda s: re.sub(r"\{(B|R|S|BADUTF|LONG)\}", lambda m: subst[m[1]], s)
    args = [fill(a) for a in args]
    if (script != "evaluate.py" or "--bench" in args) and "--output-dir" not in args:
        args += ["--output-dir", str(R)]
    if opt.get("shared") and not SHARED.is_dir():
        return name, "-", 0.0, "", f"SKIP: {SHARED} is absent"
    if opt.get("ro") and ro_mode == "skip":
        return name, "-", 0.0, "", "SKIP: root ignores permission bits and `unshare -m` is unavailable"
    argv = [sys.executable, script, *args]
    if opt.get("ro") and ro_mode == "unshare":  # a private mount namespace with <B>/ro bound read-only
        argv = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift '
                '&& exec "$@"', "sh", str(B / "ro"), *argv]
    keep = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else None
    keep = keep if expect == 2 and keep and keep.exists() else None
    before = keep and digest(keep)
    start = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=ROOT, env=ENV, input=opt.get("stdin", b""), capture_output=True, timeout=timeout)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", e.stdout or b"", e.stderr or b""
    stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    wall = time.perf_counter() - start
    (out / "logs").mkdir(exist_ok=True)
    with open(out / "logs" / f"{name}.log", "w", errors="backslashreplace") as f:
        f.write(f"{shlex.join(argv)}\n# exit {rc}, {wall:.1f} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    lines = [s for s in re.split(r"[\r\n]+", stderr) if s.strip()]
    errors = [i for i, s in enumerate(lines) if s.startswith("error:")]
    last = ([s for s in re.split(r"[\r\n]+", stderr + "\n" + stdout) if s.strip()] or [""])[-1]
    first = (lines[errors[0]] if errors else f"(no error line) last: {last.strip()}").replace("`", "'")
    problems = [] if rc == expect else [f"exit {rc}, expected {expect}"]
    if expect == 2:
        if len(errors) != 1:
            problems.append(f"{len(errors)} `error:` lines")
        elif errors[0] + 1 < len(lines) and not lines[errors[0] + 1].startswith("(traceback in"):
            problems.append("the message spans several lines")
        if "Traceback (most recent call last)" in stderr:
            problems.append("traceback printed")
    text = (stdout + "\n" + stderr).replace("\r", "\n")
    if mention and not re.search(mention, first if expect == 2 else text, re.I | re.M):
        problems.append(f"does not mention /{mention}/")
    if opt.get("absent") and re.search(opt["absent"], text, re.M):
        problems.append(f"shows /{opt['absent']}/")
    if keep and digest(keep) != before:
        problems.append(f"changed files in {keep.name}/")
    if "creates" in opt and not Path(fill(opt["creates"])).exists():
        problems.append(f"{Path(fill(opt['creates'])).relative_to(out)} not made")
    return name, rc, wall, first, "PASS" if not problems else "FAIL: " + "; ".join(problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/bad", help="fixtures, runs, logs and table.md go here")
    ap.add_argument("--only", help="regex: run only the cases whose name matches")
    ap.add_argument("--jobs", type=int, default=1, help="cases run in parallel")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per case")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    unshare = root and shutil.which("unshare") and subprocess.run(["unshare", "-m", "true"]).returncode == 0
    ro_mode = "unshare" if unshare else "skip" if root else "chmod"
    cases = [c for c in CASES if not a.only or re.search(a.only, c[0])]
    print(f"building fixtures in {out / 'bad'} ...", flush=True)
    build_fixtures(out / "bad", ro_mode)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        futures = [pool.submit(run_case, c, out, ro_mode, a.timeout) for c in cases]
        for f in futures:
            name, rc, wall, _, verdict = f.result()
            print(f"{name}: exit {rc}, {wall:.1f} s, {verdict}", flush=True)
        results = [f.result() for f in futures]
    rows = ["| case | exit | wall s | first line | verdict |", "|---|---|---|---|---|"]
    for name, rc, wall, first, verdict in results:
        label = f"{name} (added)" if name.startswith("x") else name
        first = f"`{first[:150]}`".replace("|", "\\|") if first else ""
        rows.append(f"| {label} | {rc} | {wall:.1f} | {first} | {verdict.replace('|', '/')} |")
    tally = collections.Counter(verdict.split(":")[0] for *_, verdict in results)
    n_report = sum(not r[0].startswith("x") for r in results)
    rows += ["", f"Tally ({n_report} report cases + {len(results) - n_report} added): "
             + ", ".join(f"**{v} {k}**" for k, v in sorted(tally.items())) + "."]
    text = "\n".join(rows) + "\n"
    print("\n" + text)
    (out / "table.md").write_text(text, errors="backslashreplace")
    return 0 if not tally.get("FAIL") else 1


if __name__ == "__main__":
    sys.exit(main())
