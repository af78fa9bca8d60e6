"""Model families, registered with the transformers Auto classes under the official ``model_type`` names, so an
official checkpoint folder loads with ``from_pretrained`` and no ``trust_remote_code``."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .dream import DreamConfig, DreamModel
from .family import Family
from .llada import LLaDAConfig, LLaDAModelLM
from .llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
from .llada_v import LLaDAVConfig, LLaDAVModelLM
from .loading import load_pretrained, load_tokenizer
from .mmada import MMadaConfig, MMadaModelLM
from .nemotron_diffusion import NemotronDiffusionConfig, NemotronLabsDiffusionModel
from .readers import PictureReader, PictureTokens
from .sdar import SDARConfig, SDARForCausalLM, SDARMoeConfig, SDARMoeForCausalLM
from .tiny import TINY, save_tiny, tiny

for _config, _model in [(LLaDAConfig, LLaDAModelLM), (DreamConfig, DreamModel), (SDARConfig, SDARForCausalLM),
                        (SDARMoeConfig, SDARMoeForCausalLM), (LLaDA2MoeConfig, LLaDA2MoeModelLM),
                        (NemotronDiffusionConfig, NemotronLabsDiffusionModel), (LLaDAVConfig, LLaDAVModelLM),
                        (MMadaConfig, MMadaModelLM)]:
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

FAMILIES = tuple(TINY)
# model_type -> what reads its pictures (Family.pictures)
PICTURE_READERS = {"llava_llada": PictureReader, "mmada": PictureTokens}


def pictures(config):
    """The picture reader of a model that reads pictures (LLaDA-V's ``PictureReader``: features; MMaDA's
    ``PictureTokens``: tokens), None for a text model."""
    reader = PICTURE_READERS.get(getattr(config, "model_type", None))
    return reader(config) if reader is not None else None


__all__ = ["FAMILIES", "Family", "PICTURE_READERS", "TINY", "load_pretrained", "load_tokenizer", "pictures",
           "save_tiny", "tiny",
           "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM", "LLaDA2MoeConfig", "LLaDA2MoeModelLM",
           "LLaDAVConfig", "LLaDAVModelLM", "MMadaConfig", "MMadaModelLM",
           "NemotronDiffusionConfig", "NemotronLabsDiffusionModel", "SDARConfig", "SDARForCausalLM", "SDARMoeConfig",
           "SDARMoeForCausalLM"]
