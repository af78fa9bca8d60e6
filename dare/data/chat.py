"""Prompts as token ids: chat messages through the tokenizer's chat template, batched with left padding."""

import torch


def encode(tokenizer, prompts: list) -> list[list[int]]:
    """Chats (lists of messages) go through the chat template; strings are used as they are."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tokenizer(p, add_special_tokens=False)["input_ids"])
        else:
            out.append(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"])
    return out


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as a left-padded ``[N, longest]`` batch and its attention mask."""
    from trl.trainer.utils import pad  # here, not at the top: --help imports this module and trl takes seconds

    ids = pad([torch.tensor(r, dtype=torch.long) for r in rows], pad_id, padding_side="left")
    mask = pad([torch.ones(len(r), dtype=torch.long) for r in rows], 0, padding_side="left")
    return ids, mask
