"""DARE: post-training toolkit for diffusion large language models."""

__version__ = "0.1.0"
