"""Rollout / evaluation backends behind one interface: ``engine.generate(prompts, n, config, seed) -> Rollout``.

``hf`` runs DARE's own samplers on the in-process model (every family); ``sglang`` runs SGLang's dLLM engine
(block-diffusion families; ``dare/engines/sglang.py``). A trainer holds one engine server (``InProcessEngine`` or
``SGLangServer``) and asks it for an engine with the policy's current weights around each rollout.
"""

from .base import Rollout
from .hf import HFEngine, InProcessEngine, encode

__all__ = ["HFEngine", "InProcessEngine", "Rollout", "encode"]
