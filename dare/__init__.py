"""DARE: post-training toolkit for diffusion large language models."""

__version__ = "0.1.0"

from ._registration import install as _install_registration

_install_registration()  # the model families join the transformers Auto classes once those load (cheap until then)
