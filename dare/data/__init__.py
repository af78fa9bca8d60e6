"""Datasets: loading local files or hub datasets, chat formatting, collators, RL prompts, preference pairs."""

from .loading import get_field, load_rows
from .preference import PreferenceCollator, PreferenceDataConfig, pair_rows
from .rl import RLDataConfig, prompt_rows
from .sft import SFTCollator, SFTDataConfig, tokenize_sft

__all__ = ["PreferenceCollator", "PreferenceDataConfig", "RLDataConfig", "SFTCollator", "SFTDataConfig", "get_field",
           "load_rows", "pair_rows", "prompt_rows", "tokenize_sft"]
