"""What reads a picture family's pictures (``dare.models.pictures(config)``), for the data, the trainers and the
engines: LLaDA-V's ``PictureReader`` (each ``<image>`` becomes placeholders the model fills with the picture's
features) and MMaDA's ``PictureTokens`` (the picture becomes MAGVIT-v2 codes, plain tokens of the prompt). Both turn a
rendered prompt and its PIL pictures into ids (``prompt_ids``); only features need the model handed its pictures
(``__call__``, ``wrap``). Kept apart from the family files, which ship with a checkpoint and import nothing of DARE.
"""

import functools
import re
from pathlib import Path

import torch

from ..hub import before_loading
from .llada_v import WithPictures, feature_count, image_processor
from .magvit import MAGVITv2
from .magvit import tiny_config as tiny_magvit
from .mmada import TINY_TOKENIZER

IMAGE = "<image>"  # dare.data.images.IMAGE (the data's placeholder; not imported: dare.models sits below the data)


def picture_prompt_ids(tokenizer, text: str, counts: list[int], first: int = 0) -> list[int]:
    """A rendered prompt's ids with each ``<image>`` replaced by its picture's placeholders: ``counts[i]`` ids
    ``-(j + 1)`` naming features ``j`` of the batch's pictures, numbered from ``first`` (the model's ``embed``). The
    text between pictures is tokenized piece by piece, as LLaVA's ``tokenizer_image_token`` does."""
    pieces = text.split(IMAGE)
    if len(pieces) - 1 != len(counts):
        raise ValueError(f"the prompt has {len(pieces) - 1} {IMAGE} placeholder(s) for {len(counts)} picture(s)")
    ids = tokenizer(pieces[0], add_special_tokens=False).input_ids
    for piece, count in zip(pieces[1:], counts, strict=True):
        ids += list(range(-1 - first, -1 - first - count, -1))
        first += count
        ids += tokenizer(piece, add_special_tokens=False).input_ids
    return ids


class PictureReader:
    """What the data, the trainers and the engines need of a family that reads pictures (``dare.models.pictures``):
    PIL pictures -> the model's inputs, the placeholders a picture takes, and the model handed its pictures."""

    features = True  # batches carry the pictures' inputs (pixel_values), the model is handed them (wrap)

    def __init__(self, config):
        self.config, self.processor = config, image_processor(config)

    def __call__(self, images: list) -> dict:
        """``pixel_values`` ``[N, crops, 3, S, S]`` and ``image_sizes`` ``[N, 2]`` of N pictures."""
        out = self.processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}

    def count(self, size) -> int:
        return feature_count(self.config, size)

    def prompt_ids(self, tokenizer, text: str, pictures) -> list[int]:
        """A rendered prompt's ids, each ``<image>`` its picture's placeholders (numbered from 0)."""
        return picture_prompt_ids(tokenizer, text, [self.count((p.height, p.width)) for p in pictures])

    def prompt_length(self, tokenizer, text: str, pictures) -> int:
        """``len(prompt_ids(...))``."""
        return len(self.prompt_ids(tokenizer, text, pictures))

    def wrap(self, model, pixel_values, image_sizes, fixed: bool = True, picture_at=None):
        """``model`` handed these pictures (``WithPictures``; ``picture_at``: ``LLaDAVModelLM.embed``'s)."""
        return WithPictures(model, pixel_values, image_sizes, fixed, picture_at)


@functools.cache
def image_tokenizer(name: str) -> MAGVITv2:
    """The MAGVIT-v2 of ``vq_model_name``: a folder, a hub name (downloaded once), or ``tiny:magvit`` (random, seed 0);
    loaded once per process, frozen."""
    if name == TINY_TOKENIZER:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = MAGVITv2(tiny_magvit()).eval()
    else:
        folder = name
        if not Path(name).is_dir():
            from huggingface_hub import snapshot_download

            before_loading()
            folder = snapshot_download(name)
        model = MAGVITv2.from_folder(folder)
    return model.requires_grad_(False)


def square(picture, side: int):
    """A PIL picture padded to a square with white (centred), then resized bicubically to ``side`` (dLLM-RL's RL
    transform), as ``[3, side, side]`` in [-1, 1]."""
    from PIL import Image

    picture = picture.convert("RGB")
    width, height = picture.size
    if width != height:
        big = max(width, height)
        canvas = Image.new("RGB", (big, big), (255, 255, 255))
        canvas.paste(picture, ((big - width) // 2, (big - height) // 2))
        picture = canvas
    picture = picture.resize((side, side), Image.BICUBIC)
    pixels = torch.frombuffer(bytearray(picture.tobytes()), dtype=torch.uint8).view(side, side, 3)
    return pixels.permute(2, 0, 1).float() / 127.5 - 1.0


class PictureTokens:
    """What the data, the trainers and the engines need of MMaDA's pictures (``dare.models.pictures``): a prompt's
    picture becomes ``<|mmu|> <|soi|> codes <|eoi|>`` ahead of its chat text, plain token ids (no features: the
    batches carry no picture inputs); a drawing's text-to-image prompt (``drawing_prompts``), its codes painted
    (``pictures_of``), and the model read over the codebook's rows to score a drawing (``wrap``)."""

    features = False  # the pictures are already prompt tokens: a batch needs nothing more of them

    def __init__(self, config):
        self.config = config

    @property
    def tokenizer(self) -> MAGVITv2:
        return image_tokenizer(self.config.vq_model_name)

    def codes(self, pictures) -> torch.Tensor:
        """``[N, num_vq_tokens]`` codes (0 .. codebook_size - 1) of N PIL pictures."""
        pixels = torch.stack([square(p, self.config.resolution) for p in pictures])
        with torch.no_grad():
            return self.tokenizer.codes(pixels)

    def first_code(self, tokenizer) -> int:
        """The token id of code 0: the text tokenizer's length (MMaDA's offset), checked against the model's rows."""
        first = len(tokenizer)
        if first + self.config.codebook_size > self.config.vocab_size:
            raise ValueError(f"the tokenizer's {first} ids and {self.config.codebook_size} picture codes exceed the "
                             f"model's {self.config.vocab_size} rows: not this MMaDA's tokenizer")
        return first

    def prompt_ids(self, tokenizer, text: str, pictures) -> list[int]:
        """A rendered prompt's ids: its picture's tokens, then the text without its ``<image>`` (MMaDA reads one
        picture, ahead of the chat)."""
        if text.count(IMAGE) != len(pictures):
            raise ValueError(f"the prompt has {text.count(IMAGE)} {IMAGE} placeholder(s) for {len(pictures)} "
                             "picture(s)")
        if len(pictures) > 1:
            raise ValueError(f"MMaDA reads one picture per prompt, this one has {len(pictures)}")
        c = self.config
        codes = (self.codes(pictures)[0] + self.first_code(tokenizer)).tolist() if pictures else []
        head = [c.mmu_token_id, c.soi_token_id, *codes, c.eoi_token_id] if pictures else []
        return head + self.text_ids(tokenizer, text)

    def prompt_length(self, tokenizer, text: str, pictures) -> int:
        """``len(prompt_ids(...))`` without reading the picture: its tokens are always ``num_vq_tokens`` + 3."""
        return (self.config.num_vq_tokens + 3) * min(len(pictures), 1) + len(self.text_ids(tokenizer, text))

    @staticmethod
    def text_ids(tokenizer, text: str) -> list[int]:
        return tokenizer(re.sub(re.escape(IMAGE) + r"\n?", "", text), add_special_tokens=False).input_ids

    def drawing_prompts(self, tokenizer, texts: list[str], max_text_len: int | None = None) -> dict:
        """MMaDA's text-to-image prompts (``t2i_gen_prompt``): ``[iPAD] .. <|t2i|> <bos> text <eos> <|soi|>`` +
        ``num_vq_tokens`` mask ids + ``<|eoi|>``, the text part left-padded (padding outside the attention, inside
        the positions) to ``max_text_len`` + 1 (the config's ``drawing_text_length``: MMaDA's 512), or cut to it ending
        with EOS; and the same without the text (guidance). What ``dare.sampling.maskgit.maskgit`` takes."""
        c, bos, eos = self.config, tokenizer.bos_token_id, tokenizer.eos_token_id
        width = (max_text_len or c.drawing_text_length) + 1

        def layout(text: str):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            ids = [c.t2i_token_id, *([] if ids[:1] == [bos] else [bos]), *ids, eos]
            if len(ids) > width:
                ids = ids[:width - 1] + [eos]
            pads = width - len(ids)
            picture = [c.soi_token_id] + [c.mask_token_id] * c.num_vq_tokens + [c.eoi_token_id]
            return [c.pad_token_id] * pads + ids + picture, [0] * pads + [1] * (len(ids) + len(picture))

        cond, free = ([layout(t) for t in batch] for batch in (texts, [""] * len(texts)))
        tensor = lambda rows, i: torch.tensor([r[i] for r in rows])  # noqa: E731
        return {"ids": tensor(cond, 0), "attention_mask": tensor(cond, 1), "uncond_ids": tensor(free, 0),
                "uncond_mask": tensor(free, 1), "start": width + 1, "first": self.first_code(tokenizer),
                "size": c.codebook_size}

    def drawing_example(self, tokenizer, text: str, picture) -> dict:
        """An SFT example that learns to draw ``picture`` (PIL) for ``text`` (MMaDA's ``t2i_prompt``): ``input_ids``
        = the text-to-image prompt through ``<|soi|>`` (``drawing_prompts``), the picture's codes and ``<|eoi|>``;
        ``prompt_attention`` (0 on the text's padding); ``uncond_ids`` / ``uncond_attention``: the prompt without its
        text (MMaDA's dropped condition), the same width."""
        laid = self.drawing_prompts(tokenizer, [text])
        start, first = laid["start"], laid["first"]
        codes = (self.codes([picture])[0] + first).tolist()
        return {"input_ids": laid["ids"][0, :start].tolist() + codes + [self.config.eoi_token_id],
                "prompt_length": start, "response_length": len(codes) + 1,
                "prompt_attention": laid["attention_mask"][0, :start].tolist(),
                "uncond_ids": laid["uncond_ids"][0, :start].tolist(),
                "uncond_attention": laid["uncond_mask"][0, :start].tolist()}

    def wrap(self, model, codebook, fixed: bool = True):
        """``model`` scoring a drawing (``Rollout.reading``): ``codebook`` ``[first, size]``."""
        return Codebook(model, int(codebook[0]), int(codebook[1]))

    def pictures_of(self, codes: torch.Tensor) -> list:
        """PIL pictures of codes ``[N, num_vq_tokens]`` (MAGVIT-v2's decoder, then ``painted``)."""
        with torch.no_grad():
            return painted(self.tokenizer.picture(codes.clamp(0, self.config.codebook_size - 1).cpu()))


def painted(pixels: torch.Tensor) -> list:
    """PIL pictures of decoded pixels ``[N, 3, S, S]`` in about [-1, 1] (-> 0..255, truncated: MMaDA's cast)."""
    from PIL import Image

    pixels = (((pixels + 1) / 2).clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(p) for p in pixels]


OUTSIDE = -1e4  # the logit of a row outside a drawing's codebook


class EveryPosition(torch.nn.Module):
    """``model`` read as MMaDA reads a drawing's prompt: every position counted (``position_ids`` 0 .. L-1, its
    padding included, unless given). Everything else (config, parameters, modes) is the model's."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("model"), name)


class Codebook(EveryPosition):
    """``model`` read as MaskGIT reads it when drawing: every position counted (``EveryPosition``) and only the
    codebook's rows ``first .. first + size - 1`` left in its logits (the others at -1e4: exp gives exactly 0, and a
    temperature or an entropy stays finite), so a log-softmax over them is MaskGIT's softmax over the codes."""

    def __init__(self, model, first: int, size: int):
        super().__init__(model)
        self.first, self.size = first, size

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
        outside = torch.ones(out.logits.shape[-1], dtype=torch.bool, device=out.logits.device)
        outside[self.first:self.first + self.size] = False
        out.logits = out.logits.masked_fill(outside, OUTSIDE)
        return out
