"""Tiny in-process tokenizers that mimic the real LLaDA / Dream / SDAR / LLaDA2 ones.

`tiny_tokenizer(family)` trains a ~512-entry byte-level BPE on a small built-in corpus
(a few ms, cached per family) and returns a fresh `PreTrainedTokenizerFast` carrying the
family's real special-token strings (at ids 0..k-1) and a compact copy of the official
chat template, which renders identically to the official one for tool-free chats.
Used by tests and tiny random models so nothing has to be downloaded.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

FAMILIES = ("llada", "dream", "sdar", "llada2", "diffusion_gemma", "nemotron_diffusion", "mmada")  # sdar_moe: sdar's
VOCAB_SIZE = 512  # including special tokens

# Token the model emits to end its turn.
TURN_END = {"llada": "<|eot_id|>", "dream": "<|im_end|>", "sdar": "<|im_end|>", "llada2": "<|role_end|>",
            "diffusion_gemma": "<turn|>", "nemotron_diffusion": "<|im_end|>", "llada_v": "<|eot_id|>",
            "mmada": "<|eot_id|>"}  # LLaDA-V's and MMaDA's: LLaDA's

# The mask token of families whose tokenizer declares none (the id is config.mask_token_id): its string here.
MASK_IN_CONFIG = {"llada": "<|mdm_mask|>", "nemotron_diffusion": "<SPECIAL_100>", "llada_v": "<|mdm_mask|>",
                  "mmada": "<|mdm_mask|>"}

# Config fields naming special tokens of a tiny tokenizer (the real ones are reserved ids, the config's defaults).
TOKENS_IN_CONFIG = {"mmada": {"soi_token_id": "<|soi|>", "eoi_token_id": "<|eoi|>", "t2i_token_id": "<|t2i|>",
                              "mmu_token_id": "<|mmu|>"}}

# ---- chat templates (compact, tool-free rewrites of the official ones) ----

# LLaDA-8B-Instruct: note the official template ALWAYS appends the assistant header.
LLADA_TEMPLATE = (
    "{%- for m in messages %}{%- if loop.first %}{{- bos_token }}{%- endif %}"
    r"{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + (m.content | trim) + '<|eot_id|>' }}"
    r"{%- endfor %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
)

# Dream-v0-Instruct-7B (Qwen2.5 style, default system prompt).
DREAM_TEMPLATE = r"""
{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}
{%- for m in messages if m.role in ('system', 'user', 'assistant') %}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# SDAR-8B-Chat / SDAR-30B-A3B-Chat (Qwen3 style: <think> handling, enable_thinking flag).
SDAR_TEMPLATE = r"""
{%- set ns = namespace(last=messages|length - 1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
    {%- if m.role in ('system', 'user') %}
        {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set content = m.content %}{%- set reasoning = '' %}
        {%- if m.reasoning_content is defined and m.reasoning_content is not none %}
            {%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
"""

# LLaDA2.0-mini / LLaDA2.1-mini (identical templates; thinking is hard-wired off).
LLADA2_TEMPLATE = r"""
{{- '<role>SYSTEM</role>' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n' }}{%- endif %}
{{- 'detailed thinking off<|role_end|>' }}
{%- set ns = namespace(last=messages|length - 1) %}
{%- for m in messages %}{%- if m.role == 'user' and m.content is string %}
    {%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
    {%- set content = m.content if m.content is string else '' %}
    {%- if m.role == 'user' %}{{- '<role>HUMAN</role>' + m.content + '<|role_end|>' }}
    {%- elif m.role == 'system' and not loop.first %}{{- '<role>SYSTEM</role>' + m.content + '<|role_end|>' }}
    {%- elif m.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last and reasoning %}
            {{- '<role>ASSISTANT</role>\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}{{- '<role>ASSISTANT</role>' + content }}{%- endif %}
        {{- '<|role_end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<role>ASSISTANT</role>' }}{%- endif %}
"""

# DiffusionGemma (Gemma 4 turns: <|turn>role ... <turn|>; the assistant's role is "model"). The format of Google's
# fine-tuning prompts (google-deepmind/gemma, gemma/gm/text); the checkpoint's own template is not public here.
DIFFUSION_GEMMA_TEMPLATE = r"""
{{- bos_token }}
{%- for m in messages %}
    {{- '<|turn>' + ('model' if m.role == 'assistant' else m.role) + '\n' + (m.content | trim) + '<turn|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|turn>model\n' }}{%- endif %}
"""

# Nemotron-Labs-Diffusion: ChatML turns after an always-present system turn; the answer follows an empty
# "<think></think>" unless thinking is on (enable_thinking, default off). The checkpoint's template is not public
# here: this one renders what NVIDIA's TensorRT parity tests pin for a single user turn (TensorRT model connect,
# nemotron_labs_diffusion chat_templates: "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n
# <|im_start|>assistant\n<think></think>", "<think>\n" with thinking), and its assistant turns carry the same marker.
NEMOTRON_DIFFUSION_TEMPLATE = r"""
{%- set enable_thinking = enable_thinking if enable_thinking is defined else false %}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else '' %}
{{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}
{%- for m in messages %}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set content = m.content if '<think>' in m.content else '<think></think>' + m.content %}
        {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' + ('<think>\n' if enable_thinking else '<think></think>') }}
{%- endif %}
"""

# ---- per-family special tokens (real strings; listed first -> ids 0..k-1) ----

_SPEC = {
    # LLaDA declares no mask_token: its mask id (<|mdm_mask|>) comes from config.mask_token_id.
    "llada": dict(
        bos="<|startoftext|>", eos="<|endoftext|>", mask=None, template=LLADA_TEMPLATE,
        extra=["<|mdm_mask|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<role>", "</role>"],
    ),
    "dream": dict(
        bos="<|beginoftext|>", eos="<|endoftext|>", mask="<|mask|>", template=DREAM_TEMPLATE,
        extra=["<|im_start|>", "<|im_end|>"],
    ),
    "sdar": dict(
        bos=None, eos="<|endoftext|>", mask="<|MASK|>", template=SDAR_TEMPLATE,
        extra=["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    ),
    "llada2": dict(
        bos="<|startoftext|>", eos="<|endoftext|>", mask="<|mask|>", template=LLADA2_TEMPLATE,
        extra=["<role>", "</role>", "<|role_end|>"],
    ),
    # Gemma's order: <pad> 0, <eos> 1, <bos> 2 (as in the real vocabulary); uniform noise needs no mask token
    "diffusion_gemma": dict(
        pad="<pad>", bos="<bos>", eos="<eos>", mask=None, template=DIFFUSION_GEMMA_TEMPLATE,
        extra=["<unk>", "<|turn>", "<turn|>"],
    ),
    # Tekken's <s>; EOS: the turn end (id 11 in NVIDIA's parity tests); the mask token (config id 100) is undeclared
    "nemotron_diffusion": dict(
        bos="<s>", eos="<|im_end|>", mask=None, template=NEMOTRON_DIFFUSION_TEMPLATE,
        extra=["<SPECIAL_100>", "<|im_start|>", "<think>", "</think>"],
    ),
}
# MMaDA: LLaDA's tokenizer, whose reserved tokens it uses for its task and picture tokens (named here)
_SPEC["mmada"] = {**_SPEC["llada"], "extra": _SPEC["llada"]["extra"] + list(TOKENS_IN_CONFIG["mmada"].values())}

_CORPUS = r"""Question: What is 2 + 3? Answer: 2 + 3 = 5. The answer is 5.
Question: Natalia sold 48 clips in April and half as many in May. How many clips did she sell?
Step 1: In May she sold 48 / 2 = 24 clips. Step 2: In total she sold 48 + 24 = 72 clips.
#### 72
The answer is 42. The final answer is \boxed{42}.
Let's think step by step. First, compute 12 * 3 = 36. Then 36 - 18 = 18.
#### 18
Solve for x: 3x + 4 = 19, so 3x = 15 and x = 5. Therefore the answer is \boxed{5}.
What is the sum of the first 10 positive integers? The sum is 10 * 11 / 2 = 55.
If a train travels 60 miles per hour for 3 hours, it travels 180 miles.
The square root of 144 is 12, and 7 squared is 49. 100 divided by 4 is 25.
def f(x): return x+1
def add(a, b):
    return a + b
for i in range(10): print(i * i)
if n % 2 == 0: result = n // 2
else: result = 3 * n + 1
You are a helpful assistant. Please reason step by step, and put your final answer within \boxed{}.
The user asks a question and the assistant answers it with a short and clear explanation.
Answer the following math problem. Show your work and then give the number.
Tom has 5 apples and buys 7 more. Now he has 5 + 7 = 12 apples.
A rectangle is 8 meters long and 3 meters wide, so its area is 24 square meters.
There are 365 days in a year, 24 hours in a day, and 60 minutes in an hour.
The quick brown fox jumps over the lazy dog. Hello, world! This is a test.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000 3.14 -7 1/2 50%
"""


def _train(family: str) -> str:
    """Train the byte-level BPE for `family`; returns the tokenizer JSON."""
    spec = _SPEC[family]
    first = (spec["pad"], spec["eos"], spec["bos"]) if "pad" in spec else (spec["bos"], spec["eos"], spec["mask"])
    specials = [t for t in first if t] + spec["extra"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok.to_str()


_CACHE: dict[str, str] = {}


def tiny_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A fresh tiny tokenizer for `family` (one of FAMILIES; 'sdar_moe' maps to 'sdar', 'llada_v' to 'llada': LLaDA-V
    ships LLaDA's tokenizer)."""
    family = {"sdar_moe": "sdar", "llada_v": "llada"}.get(family, family)
    if family not in _SPEC:
        raise ValueError(f"unknown tokenizer family {family!r}; known: {', '.join(FAMILIES)}")
    if family not in _CACHE:
        _CACHE[family] = _train(family)
    spec = _SPEC[family]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_CACHE[family]),
        bos_token=spec["bos"], eos_token=spec["eos"], pad_token=spec.get("pad", spec["eos"]), mask_token=spec["mask"],
        extra_special_tokens=spec["extra"], chat_template=spec["template"],
        add_bos_token=False, add_eos_token=False, clean_up_tokenization_spaces=False,
    )
