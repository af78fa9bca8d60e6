"""Rollout / evaluation backends behind one interface: ``engine.generate(prompts, n, config, seed) -> Rollout``.

``hf`` runs DARE's own samplers on the in-process model (every family); ``sglang`` (block-diffusion families)
comes later.
"""

from .base import Rollout
from .hf import HFEngine, encode

__all__ = ["HFEngine", "Rollout", "encode"]
