"""Datasets: loading local files or hub datasets, chat formatting, collators, RL prompts."""

from .loading import get_field, load_rows
from .rl import RLDataConfig, prompt_rows
from .sft import SFTCollator, SFTDataConfig, tokenize_sft

__all__ = ["RLDataConfig", "SFTCollator", "SFTDataConfig", "get_field", "load_rows", "prompt_rows", "tokenize_sft"]
