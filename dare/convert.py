"""An autoregressive checkpoint turned into a diffusion one (A2D), saved as a normal DARE folder that ``train_sft.py``
then adapts:

    python -m dare.convert Qwen/Qwen2.5-0.5B-Instruct outputs/a2d-qwen --to dream
    python -m dare.convert Qwen/Qwen3-0.6B outputs/a2d-qwen3 --to sdar --block-size 4
    python -m dare.convert tiny:qwen2 outputs/a2d-tiny          # a random tiny Qwen2 built on the spot (offline)
    python train_sft.py --model outputs/a2d-qwen --data.path task:sum4 --output-dir outputs/a2d-qwen-sft

``--to dream`` makes a masked-diffusion model of the ``dream`` family, which is exactly what Dream itself is (Qwen2.5
initialised, arXiv 2508.15487): the same weights under bidirectional attention, the prediction for token i still read
at position i - 1 (the family's shifted logits), so the AR model's next-token head is the denoiser's starting point.
Its sources: Qwen2 (Qwen2.5) and Llama-architecture models (Llama, Mistral-style dense; their q/k/v take zero biases,
an exact identity). ``--to sdar`` makes a block-diffusion model of the ``sdar`` family from a Qwen3 checkpoint, which
is SDAR's own starting point (Qwen3 with block-causal attention); SDAR reads the prediction for token i at position i,
so, as in dllm's A2D recipes (github.com/ZHZisZZ/dllm, ``right_shift_logits`` off), SFT moves the head by one.
A mask token is added to the tokenizer where it has none (its embedding row the mean of the others, if the vocabulary
must grow). Nothing else changes: given a causal attention mask the converted model reproduces the source's logits at
every position (tests/test_convert.py); without one it attends both ways (or block-causally), which SFT then teaches
it to use.
"""

import argparse
import os
import sys

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from . import hub
from .models.dream import DreamConfig, DreamModel
from .models.loading import looks_local
from .models.sdar import SDARConfig, SDARForCausalLM
from .models.tokenizers import tiny_tokenizer

# target -> (the source model_types it takes, its config and model classes)
TARGETS = {"dream": ({"qwen2": "Qwen2 / Qwen2.5", "llama": "Llama", "mistral": "Mistral"}, DreamConfig, DreamModel),
           "sdar": ({"qwen3": "Qwen3"}, SDARConfig, SDARForCausalLM)}
DROPPED = ("model_type", "architectures", "transformers_version", "auto_map", "attention_bias", "mlp_bias",
           "pretraining_tp", "_name_or_path")


def target_config(source, to: str, mask_token_id: int, block_size: int):
    """The ``to`` config of the decoder ``source`` describes, or a one-line error naming what it cannot carry."""
    sources, config_class, model_class = TARGETS[to]
    kind = source.model_type
    if kind not in sources:
        raise ValueError(f"cannot convert model_type {kind!r} to {to}: it takes {', '.join(sources.values())}")
    if getattr(source, "attention_bias", False) or getattr(source, "mlp_bias", False):
        raise ValueError(f"{kind}: biases on the attention or the MLP beyond Qwen's q/k/v have no place in {to}")
    fields = {k: v for k, v in source.to_dict().items() if k not in DROPPED}
    head_dim = fields.pop("head_dim", None)
    if to == "sdar":
        fields.update(head_dim=head_dim or source.hidden_size // source.num_attention_heads, block_size=block_size)
    elif head_dim not in (None, source.hidden_size // source.num_attention_heads):
        raise ValueError(f"{kind}: head_dim {head_dim} differs from hidden_size / heads (the dream decoder derives it)")
    rope = getattr(source, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{kind}: rope scaling {rope.get('rope_type')!r} is not {to}'s plain RoPE")
    windowed = getattr(source, "use_sliding_window", kind not in ("qwen2", "qwen3"))  # Qwen's: off unless it says
    if getattr(source, "sliding_window", None) and windowed:
        raise ValueError(f"{kind}: sliding-window attention is not {to}'s attention")
    fields["use_sliding_window"] = False
    return config_class(**fields, mask_token_id=mask_token_id, architectures=[model_class.__name__])


TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6)


def tiny_causal(kind: str, seed: int = 0, tie: bool = False, mask_token: bool = True):
    """``(model, tokenizer)``: a random causal LM of ``kind`` (qwen2, qwen3, llama) with DARE's tiny Qwen-format
    tokenizer (``mask_token=False``: it declares none), to try and test the conversion offline. Its q/k/v biases are
    random too (transformers starts them at 0), so a dropped bias shows."""
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    if kind not in classes:
        raise ValueError(f"tiny:{kind}: the tiny causal models are {', '.join(f'tiny:{k}' for k in classes)}")
    tok = tiny_tokenizer("dream")
    if not mask_token:
        tok.mask_token = None
    config_class, model_class = classes[kind]
    config = config_class(**TINY_SHAPE, vocab_size=len(tok), tie_word_embeddings=tie, eos_token_id=tok.eos_token_id,
                          bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.5)
    return model, tok


def convert(source: str, target: str, to: str = "dream", mask_token: str = "<|mask|>", dtype: str = "auto",
            block_size: int = 4):
    """Convert the causal LM at ``source`` (a folder or hub name) and save it to ``target``; the converted model."""
    if to not in TARGETS:
        raise ValueError(f"--to {to!r}: the targets are {', '.join(TARGETS)}")
    if block_size < 1:
        raise ValueError(f"--block-size {block_size}: a block holds at least one token")
    if source.startswith("tiny:"):  # built on the spot, saved beside the target as its source
        model, tok = tiny_causal(source.removeprefix("tiny:"))
        source = f"{target.rstrip('/')}-source"
        model.save_pretrained(source)
        tok.save_pretrained(source)
    elif looks_local(source) and not os.path.isdir(os.path.expanduser(source)):
        raise FileNotFoundError(f"causal LM folder {source} does not exist (a hub name is 'org/name')")
    elif not looks_local(source):
        hub.before_loading()  # an unreachable hub: cached names load at once, a missing one fails in one line
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as e:
        raise hub.missing("model", source, e) from e
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.mask_token is None:
        if mask_token in tokenizer.get_vocab():
            tokenizer.mask_token = mask_token
        else:
            tokenizer.add_special_tokens({"mask_token": mask_token})
    mask_id = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    new = target_config(config, to, mask_id, block_size)  # refusals before the weights load
    if tokenizer.pad_token is None:  # DARE pads batches: the EOS pads as in the AR model's own generate
        tokenizer.pad_token = tokenizer.eos_token
    causal = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    if len(tokenizer) > causal.get_input_embeddings().weight.shape[0]:  # the mask token needs a row of its own
        causal.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        new.vocab_size = len(tokenizer)
    new.pad_token_id, new.eos_token_id, new.bos_token_id = \
        tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id
    weights = causal.state_dict()
    model = TARGETS[to][2](new).to(weights["model.embed_tokens.weight"].dtype)  # then every weight is the source's
    missing, unexpected = model.load_state_dict(weights, strict=False)
    biases = {k for k in missing if k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))}
    rest = [k for k in missing if k not in biases and not (k == "lm_head.weight" and new.tie_word_embeddings)]
    if rest or unexpected:
        raise ValueError(f"{config.model_type} -> {to}: weights that do not map (missing {rest[:4]}, unexpected "
                         f"{list(unexpected)[:4]})")
    with torch.no_grad():
        for name in biases:  # Llama's q/k/v have no bias: a zero one is the same layer
            model.get_parameter(name).zero_()
    model.eval()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return model, tokenizer


def main(argv=None) -> None:
    class Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """The module docstring as written (its commands), every default shown."""

    parser = argparse.ArgumentParser(prog="python -m dare.convert", description=__doc__, formatter_class=Help)
    parser.add_argument("source", help="the causal LM: a folder, a hub name, or tiny:qwen2 / tiny:qwen3 / tiny:llama")
    parser.add_argument("target", help="the folder the diffusion model is saved to")
    parser.add_argument("--to", default="dream", choices=list(TARGETS),
                        help="the DARE family it becomes: dream (masked; Qwen2, Llama) or sdar (block; Qwen3)")
    parser.add_argument("--block-size", type=int, default=4, help="sdar: tokens per block (SDAR's own: 4)")
    parser.add_argument("--mask-token", default="<|mask|>", help="the mask token, added if the tokenizer has none")
    parser.add_argument("--dtype", default="auto", help="the weights' dtype (auto: the checkpoint's)")
    args = parser.parse_args(argv)
    try:
        model, tokenizer = convert(args.source, args.target, args.to, args.mask_token, args.dtype, args.block_size)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"{args.source} -> {args.target}: a {args.to} model, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, mask token {tokenizer.mask_token!r} (id {tokenizer.mask_token_id})")


if __name__ == "__main__":
    main()
