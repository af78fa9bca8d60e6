"""An autoregressive checkpoint turned into a diffusion one (A2D), saved as a normal DARE folder that ``train_sft.py``
then adapts:

    python -m dare.convert Qwen/Qwen2.5-0.5B-Instruct outputs/a2d-qwen --to dream
    python train_sft.py --model outputs/a2d-qwen --data.path task:sum4 --output-dir outputs/a2d-qwen-sft

``--to dream`` makes a masked-diffusion model of the ``dream`` family, which is exactly what Dream itself is (Qwen2.5
initialised, arXiv 2508.15487): the same weights under bidirectional attention, the prediction for token i still read
at position i - 1 (the family's shifted logits), so the AR model's next-token head is the denoiser's starting point.
Sources: Qwen2 (Qwen2.5) and Llama-architecture models (Llama, Mistral-style dense; their q/k/v take zero biases, an
exact identity). A mask token is added to the tokenizer where it has none (its embedding row the mean of the others,
if the vocabulary must grow). Nothing else changes: given a causal attention mask the converted model reproduces the
source's logits at every position (tests/test_convert.py); without one it attends both ways, which the A2D SFT then
teaches it to use.
"""

import argparse
import sys

import torch

from .models.dream import DreamConfig, DreamModel

# source model_type -> what DARE reads from it (the rest of its config.json describes the same decoder)
SOURCES = {"qwen2": "Qwen2 / Qwen2.5", "llama": "Llama", "mistral": "Mistral"}
TARGETS = ("dream",)
DROPPED = ("model_type", "architectures", "transformers_version", "auto_map", "attention_bias", "mlp_bias",
           "pretraining_tp", "head_dim", "_name_or_path")


def dream_config(source, mask_token_id: int) -> DreamConfig:
    """The ``dream`` config of the decoder ``source`` describes, or a one-line error naming what it cannot carry."""
    kind = source.model_type
    if kind not in SOURCES:
        raise ValueError(f"cannot convert model_type {kind!r}: the dream target takes {', '.join(SOURCES.values())}")
    if getattr(source, "attention_bias", False) or getattr(source, "mlp_bias", False):
        raise ValueError(f"{kind}: biases on the attention output or the MLP have no place in the dream decoder")
    head_dim = getattr(source, "head_dim", None)
    if head_dim not in (None, source.hidden_size // source.num_attention_heads):
        raise ValueError(f"{kind}: head_dim {head_dim} differs from hidden_size / heads (the dream decoder derives it)")
    rope = getattr(source, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{kind}: rope scaling {rope.get('rope_type')!r} is not the dream decoder's plain RoPE")
    if getattr(source, "sliding_window", None) and getattr(source, "use_sliding_window", kind != "qwen2"):
        raise ValueError(f"{kind}: sliding-window attention is not the dream decoder's full attention")
    fields = {k: v for k, v in source.to_dict().items() if k not in DROPPED}
    fields["use_sliding_window"] = False
    return DreamConfig(**fields, mask_token_id=mask_token_id, architectures=["DreamModel"])


def convert(source: str, target: str, to: str = "dream", mask_token: str = "<|mask|>", dtype: str = "auto"):
    """Convert the causal LM at ``source`` (a folder or hub name) and save it to ``target``; the converted model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if to not in TARGETS:
        raise ValueError(f"--to {to!r}: the targets are {', '.join(TARGETS)}")
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    if tokenizer.mask_token is None:
        if mask_token in tokenizer.get_vocab():
            tokenizer.mask_token = mask_token
        else:
            tokenizer.add_special_tokens({"mask_token": mask_token})
    mask_id = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    new = dream_config(config, mask_id)  # refusals before the weights load
    if tokenizer.pad_token is None:  # DARE pads batches: the EOS pads as in the AR model's own generate
        tokenizer.pad_token = tokenizer.eos_token
    causal = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    if len(tokenizer) > causal.get_input_embeddings().weight.shape[0]:  # the mask token needs a row of its own
        causal.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        new.vocab_size = len(tokenizer)
    new.pad_token_id, new.eos_token_id, new.bos_token_id = \
        tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id
    weights = causal.state_dict()
    model = DreamModel(new).to(weights["model.embed_tokens.weight"].dtype)  # then every weight is the source's
    missing, unexpected = model.load_state_dict(weights, strict=False)
    biases = {k for k in missing if k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))}
    rest = [k for k in missing if k not in biases and not (k == "lm_head.weight" and new.tie_word_embeddings)]
    if rest or unexpected:
        raise ValueError(f"{config.model_type} -> dream: weights that do not map (missing {rest[:4]}, unexpected "
                         f"{list(unexpected)[:4]})")
    with torch.no_grad():
        for name in biases:  # Llama's q/k/v have no bias: a zero one is the same layer
            model.get_parameter(name).zero_()
    model.eval()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return model, tokenizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dare.convert", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="the causal LM: a folder or a hub name")
    parser.add_argument("target", help="the folder the diffusion model is saved to")
    parser.add_argument("--to", default="dream", choices=TARGETS, help="the DARE family it becomes")
    parser.add_argument("--mask-token", default="<|mask|>", help="the mask token, added if the tokenizer has none")
    parser.add_argument("--dtype", default="auto", help="the weights' dtype (auto: the checkpoint's)")
    args = parser.parse_args(argv)
    try:
        model, tokenizer = convert(args.source, args.target, args.to, args.mask_token, args.dtype)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{args.source} -> {args.target}: a {args.to} model, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, mask token {tokenizer.mask_token!r} (id {tokenizer.mask_token_id})")


if __name__ == "__main__":
    main()
