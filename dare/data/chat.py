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
    """Token-id lists as a left-padded ``[N, longest]`` batch and its attention mask (trl's ``pad`` did this, but
    importing trl costs seconds that evaluate.py and the chat would spend on every start)."""
    longest = max(map(len, rows), default=0)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, longest - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, longest - len(row):] = 1
    return ids, mask
