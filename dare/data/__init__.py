"""Datasets: loading local files or hub datasets, chat formatting, collators."""

from .loading import get_field, load_rows
from .sft import SFTCollator, SFTDataConfig, tokenize_sft

__all__ = ["SFTCollator", "SFTDataConfig", "get_field", "load_rows", "tokenize_sft"]
