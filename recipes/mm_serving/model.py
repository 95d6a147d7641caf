"""Images, preprocessing and a small vision step, shared by the front, the scheduler and tests.

Images travel as binary PPM (P6): a real image format that needs no imaging library to decode.
"""

from __future__ import annotations

import numpy as np
import torch

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
PATCH = 16
HIDDEN = 64
WEIGHT_SEED = 1234


def make_image(seed: int, width: int, height: int) -> bytes:
    """A seeded RGB image as PPM bytes: identical across arms for the same seed."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return b"P6\n%d %d\n255\n" % (width, height) + pixels.tobytes()


def decode_ppm(data: bytes) -> torch.Tensor:
    """PPM bytes → uint8 tensor (3, H, W).

    The header is three whitespace-separated fields after the magic, then exactly one whitespace
    byte: the pixels may start with bytes that look like whitespace, so they are not split.
    """
    fields: list[bytes] = []
    position = 0
    while len(fields) < 4:
        while position < len(data) and data[position : position + 1].isspace():
            position += 1
        end = position
        while end < len(data) and not data[end : end + 1].isspace():
            end += 1
        if end == position:
            raise ValueError("truncated PPM header")
        fields.append(data[position:end])
        position = end
    if fields[0] != b"P6" or fields[3] != b"255":
        raise ValueError("not a binary PPM image with 8-bit channels")
    width, height = int(fields[1]), int(fields[2])
    pixels = np.frombuffer(data, dtype=np.uint8, count=width * height * 3, offset=position + 1)
    return torch.from_numpy(pixels.reshape(height, width, 3).copy()).permute(2, 0, 1)


def preprocess(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize, normalise and patchify into pixel_values (patches, 3 * PATCH * PATCH)."""
    x = image.unsqueeze(0).to(torch.float32) / 255.0
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)[
        0
    ]
    x = (x - MEAN) / STD
    patches = x.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH)  # 3, gh, gw, P, P
    return patches.permute(1, 2, 0, 3, 4).reshape(-1, 3 * PATCH * PATCH).contiguous()


class VisionStep(torch.nn.Module):
    """Patch embedding, one MLP block and mean pooling: a stand-in for a vision encoder."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(WEIGHT_SEED)
        self.embed = torch.nn.Linear(3 * PATCH * PATCH, HIDDEN)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, HIDDEN * 2),
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN * 2, HIDDEN),
        )
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(pixel_values)
        hidden = hidden + self.mlp(hidden)
        return hidden.mean(dim=0)


def summary(output: torch.Tensor) -> list[float]:
    """What the scheduler answers: a few numbers that identify the result."""
    values = output.detach().to("cpu", torch.float64)
    return [float(values.sum()), float(values.abs().max()), *map(float, values[:4])]
