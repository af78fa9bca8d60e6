"""MMaDA (Gen-Verse/MMaDA-8B-Base, -MixCoT): LLaDA's Transformer over one vocabulary of text and picture tokens,
134,656 rows under LLaDA's key names: a picture's code c (of the 8,192 of the MAGVIT-v2 image tokenizer,
``dare.models.magvit``) is token ``len(tokenizer) + c``, right after the text tokenizer's 126,349 ids (MMaDA's
``inference_mmu.py``; MaskGRPO scores codes on rows 126349..134540), inside LLaDA's 126,464 rows + 8,192. A picture
is read as tokens, ``<|mmu|> <|soi|> codes <|eoi|>`` before the chat text (``dare.models.readers.PictureTokens``), so
the trunk is LLaDA's and nothing downstream sees features.

Read, not copied: Gen-Verse/MMaDA ``models/modeling_mmada.py`` (``MMadaConfig``'s keys; ``MMadaModelLM`` is
``LLaDAModelLM``), ``training/prompting_utils.py`` (the reserved ids of ``<|soi|>`` ..., ``mmu_prompt``),
``inference_mmu.py`` (codes + the text tokenizer's length); Gen-Verse/dLLM-RL ``sample/mmada_v_sample.py`` (RL's
pictures: padded square with white, bicubic to the resolution, scaled to [-1, 1]).

    model = AutoModelForCausalLM.from_pretrained("Gen-Verse/MMaDA-8B-MixCoT")  # pictures: showlab/magvitv2
"""

import math

from huggingface_hub.dataclasses import strict

from .llada import LLaDAConfig, LLaDAModelLM

# MMaDA's task and picture tokens: LLaDA's reserved ids (prompting_utils.reserved_token_mapping)
RESERVED = {"soi_token_id": 126084, "eoi_token_id": 126085, "t2i_token_id": 126088, "mmu_token_id": 126089}
TINY_TOKENIZER = "tiny:magvit"  # vq_model_name of the tiny models: a seeded random MAGVIT-v2 (magvit.tiny_config)


@strict
class MMadaConfig(LLaDAConfig):
    """LLaDA's fields, the vocabulary grown by the codebook, and MMaDA's keys. ``vq_model_name`` and the four picture
    token ids, and the drawing prompt's text width, are DARE's (the official config has none: they default to
    MMaDA's)."""

    model_type = "mmada"
    vocab_size: int = 134656
    embedding_size: int | None = 134656
    new_vocab_size: int = 134656
    llm_vocab_size: int = 126464  # LLaDA's rows; a picture's code c is token len(tokenizer) + c (126349 + c)
    codebook_size: int = 8192
    num_vq_tokens: int = 1024  # a picture's codes: (512 px / 16)^2
    num_new_special_tokens: int = 0
    vq_model_name: str = "showlab/magvitv2"  # where the image tokenizer's weights are (hub name or folder)
    drawing_text_length: int = 512  # a text-to-image prompt's text width (MMaDA's preprocessing.max_seq_length)
    soi_token_id: int = RESERVED["soi_token_id"]
    eoi_token_id: int = RESERVED["eoi_token_id"]
    t2i_token_id: int = RESERVED["t2i_token_id"]
    mmu_token_id: int = RESERVED["mmu_token_id"]

    @property
    def resolution(self) -> int:
        """The side pictures are resized to: the codes' grid side times the tokenizer's /16."""
        return math.isqrt(self.num_vq_tokens) * 16


class MMadaModelLM(LLaDAModelLM):
    config_class = MMadaConfig


def tiny_config(vocab_size: int, **overrides) -> MMadaConfig:
    """``vocab_size`` text ids (the tiny tokenizer's), then a tiny MAGVIT's 8192 codes, then 64 rows no id uses (as
    LLaDA's rows outnumber its tokenizer's ids: the codes start at the tokenizer's length); 16 codes a picture (64
    px)."""
    rows = vocab_size + 8192 + 64
    kw = dict(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128, vocab_size=rows,
              embedding_size=rows, new_vocab_size=rows, llm_vocab_size=vocab_size + 64, num_vq_tokens=16,
              max_sequence_length=1024, vq_model_name=TINY_TOKENIZER, drawing_text_length=48)
    return MMadaConfig(**{**kw, **overrides})
