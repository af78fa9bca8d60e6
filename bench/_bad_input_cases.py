"""The bad-input cases that bench/bad_inputs.py runs: shared/reports/bad-inputs.md's 72, then our own (x..).

Each case: name, (script, args), expected exit, mention (a regex the error line, or a success's output, must match),
then options. ``{B}`` is the fixtures folder, ``{R}`` the case's run folder, ``{S}`` ../shared.
"""

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
    ("x31_rl_unknown_flag", rl("--lr 1e-5"), 2, "--lr .*--learning-rate"),
    ("x32_eval_unknown_flag", evb("--benchmarks gsm8k"), 2, "--benchmarks .*--bench"),
]
