"""Likelihood mode: the ELBO of a continuation given a context, with N Monte-Carlo samples (stratified mask counts,
as LLaDA's own evaluation), for multiple-choice benchmarks and OpenCompass's ``get_ppl``. Uniform-noise families
(DiffusionGemma): the uniform ELBO's time integral on N Gauss-Legendre nodes, one noise draw at each.

    scores = continuation_elbo(model, family, tokenizer, ["2+2="] * 2, ["4", "5"], samples=32)   # higher = likelier
"""

import torch

from ..likelihood import MCElbo, QuadratureElbo


@torch.no_grad()
def continuation_elbo(model, family, tokenizer, contexts: list[str], continuations: list[str], samples: int = 32,
                      seed: int = 0) -> torch.Tensor:
    """``[N]`` ELBO estimates of ``log p(continuation | context)`` (a lower bound; exact in expectation for the
    masked-diffusion bound). Rows are scored in groups of equal continuation length, so no padding sits after a
    continuation; block families score through their ``[x_t ‖ x_0]`` layout."""
    ctx = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in contexts]
    cont = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in continuations]
    return elbo_of_ids(model, family, ctx, cont, samples, seed)


@torch.no_grad()
def elbo_of_ids(model, family, ctx: list[list[int]], cont: list[list[int]], samples: int = 32,
                seed: int = 0) -> torch.Tensor:
    """:func:`continuation_elbo` on token ids."""
    device = next(model.parameters()).device
    if any(not c for c in cont):
        raise ValueError("every continuation needs at least one token")
    out = torch.zeros(len(cont), dtype=torch.float64)
    for length in sorted({len(c) for c in cont}):
        rows = [i for i, c in enumerate(cont) if len(c) == length]
        width = max(len(ctx[i]) for i in rows)
        prompt = torch.full((len(rows), width), family.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompt)
        for r, i in enumerate(rows):
            if ctx[i]:
                prompt[r, width - len(ctx[i]):], prompt_mask[r, width - len(ctx[i]):] = torch.tensor(ctx[i]), 1
        completion = torch.tensor([cont[i] for i in rows])
        ones = torch.ones_like(completion)
        batch = {"prompt_ids": prompt.to(device), "prompt_mask": prompt_mask.to(device),
                 "completion_ids": completion.to(device), "completion_mask": ones.to(device),
                 "loss_mask": ones.to(device)}
        estimator = MCElbo(samples) if family.noise == "mask" else QuadratureElbo(points=samples)
        noise = estimator.corrupt(family, batch, torch.Generator(device).manual_seed(seed))
        out[rows] = (estimator.score(model, family, batch, noise).logp.mean(-1) * length).double().cpu()
    return out
