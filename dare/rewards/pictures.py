"""Rewards of drawings: a drawing model's completion is its picture as a ``data:image/png;base64,...`` URI.

``colours`` scores how much of each named region of the picture has the asked colour: the share of the region's
pixels whose nearest palette colour is the asked one, averaged over the regions (a picture that is not one gets 0).
The ground truth names the regions and colours, ``"top:red,bottom:blue"`` (regions: ``all``, ``top``, ``bottom``,
``left``, ``right``). Accuracy: at least half of every region in its colour.
"""

import base64
import io
import re

from .base import RewardResult, reward

PALETTE = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (240, 210, 40),
           "white": (245, 245, 245), "black": (20, 20, 20)}
_URI = re.compile(r"data:image/[\w.+-]+;base64,(.*)", re.S)


def picture_of(completion: str):
    """The RGB ``PIL.Image`` of a data-URI completion, or None."""
    from PIL import Image, UnidentifiedImageError

    found = _URI.fullmatch(completion.strip())
    if not found:
        return None
    try:
        image = Image.open(io.BytesIO(base64.b64decode(found.group(1), validate=True)))
        image.load()
    except (ValueError, UnidentifiedImageError, OSError):
        return None
    return image.convert("RGB")


def regions(truth: str) -> list[tuple[str, str]]:
    """``"top:red,bottom:blue"`` -> ``[("top", "red"), ("bottom", "blue")]``, checked."""
    pairs = [tuple(part.strip().split(":")) for part in truth.split(",") if part.strip()]
    for pair in pairs:
        if len(pair) != 2 or pair[0] not in BOXES or pair[1] not in PALETTE:
            raise ValueError(f"colours ground truth {truth!r}: each part is REGION:COLOUR, regions {sorted(BOXES)}, "
                             f"colours {sorted(PALETTE)}")
    return pairs


BOXES = {"all": (0, 0, 1, 1), "top": (0, 0, 1, 0.5), "bottom": (0, 0.5, 1, 1), "left": (0, 0, 0.5, 1),
         "right": (0.5, 0, 1, 1)}  # (x0, y0, x1, y1) as shares of the width and height


def nearest(pixels) -> list[str]:
    """The palette colour nearest each RGB pixel."""
    names, values = list(PALETTE), list(PALETTE.values())
    return [names[min(range(len(values)), key=lambda i: sum((a - b) ** 2 for a, b in zip(p, values[i],
                                                                                          strict=True)))]
            for p in pixels]


@reward("colours")
def colours(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    picture = picture_of(completion)
    if picture is None:
        return RewardResult(0.0, 0.0, "not a picture")
    picture.thumbnail((64, 64))  # the regions' shares, not the pixels, matter: a 512 px drawing scores as fast
    width, height = picture.size
    shares = []
    for region, colour in regions(str(ground_truth)):
        x0, y0, x1, y1 = BOXES[region]
        box = picture.crop((round(x0 * width), round(y0 * height), round(x1 * width), round(y1 * height)))
        found = nearest(box.get_flattened_data())
        shares.append(found.count(colour) / max(len(found), 1))
    score = sum(shares) / len(shares)
    return RewardResult(score, float(min(shares) >= 0.5), f"{score:.2f}")
