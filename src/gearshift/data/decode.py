"""Image files -> uint8 CHW tensors at the training size: the decoders and the choice among them.

Three JPEG decoders (docs/data.md, "Real images"): PIL with draft mode (libjpeg's DCT scaling by
1/2, 1/4, 1/8 when the image is at least twice the training size), `torchvision.io.decode_jpeg`
on the CPU, and simplejpeg (optional: `pip install gearshift[jpeg]`; DCT scaling by any M/8).
`data.decoder=auto` takes the one `make bench-data` measured fastest for the size of the
dataset's JPEGs (`choose_decoder`). Files that are not JPEGs, and JPEGs a fast decoder refuses
(unusual markers, damage), are decoded by PIL.

After decoding, every path does the same in uint8: the centre square of the image, resized
(bilinear, antialiased) to `size` x `size`; that is the region a resize of the shorter side
followed by a centre crop keeps, with fewer pixels to resize.

A file that cannot be decoded raises `UnreadableImage`, which names it; raised in a
DataLoader worker it arrives in the main process rebuilt from the worker's traceback, and
keeps just that one line.
"""

from __future__ import annotations

import io
import logging
import random
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from gearshift.data import DataError

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"
PIL_MODES = {1: "L", 3: "RGB"}  # channels -> PIL's mode
SAMPLE_FILES = 16  # JPEGs timed per decoder by data.decoder=auto


class UnreadableImage(DataError):
    """`cannot decode image <path>: <why>`, one line, also when re-raised out of a worker."""

    remedy = "replace the file"

    def __init__(self, text: str) -> None:
        # A DataLoader worker's exception is rebuilt from "Caught ... Original Traceback ...";
        # its last line is "<module>.UnreadableImage: cannot decode image ...".
        prefix = f"{type(self).__name__}: "
        lines = [line for line in text.splitlines() if prefix in line]
        super().__init__(lines[-1].split(prefix, 1)[1] if lines else text)


def _pil(data: bytes, channels: int, size: int) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:
        image.draft(PIL_MODES[channels], (size, size))  # JPEG: DCT-scaled, still >= size
        pixels = np.array(image.convert(PIL_MODES[channels]))  # HWC (or HW), writable
    tensor = torch.from_numpy(pixels)  # tip 6: no copy
    return tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1)


def _torchvision(data: bytes, channels: int, size: int) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    with warnings.catch_warnings():  # deprecated for TorchCodec in 0.29; still the CPU path here
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)


def _simplejpeg(data: bytes, channels: int, size: int) -> torch.Tensor:
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    # Scaled IDCTs between 1/2 and 1 decoded slower than the full one (bench-data): scale
    # only when at least half the size is left.
    scale = {"min_height": size, "min_width": size} if min(height, width) >= 2 * size else {}
    pixels = simplejpeg.decode_jpeg(data, "RGB" if channels == 3 else "GRAY", **scale)
    return torch.from_numpy(pixels).permute(2, 0, 1)  # HWC (GRAY: HW1) -> CHW


JPEG_DECODERS: dict[str, Callable[[bytes, int, int], torch.Tensor]] = {
    "pil": _pil,
    "torchvision": _torchvision,
    "simplejpeg": _simplejpeg,
}


def installed(name: str) -> bool:
    if name != "simplejpeg":
        return True
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def centre_square(image: torch.Tensor, size: int) -> torch.Tensor:
    """The centre square of a uint8 CHW image, resized to `size` x `size`."""
    height, width = image.shape[-2:]
    side = min(height, width)
    if side != height or side != width:
        image = image[..., (height - side) // 2 :, (width - side) // 2 :][..., :side, :side]
    if side != size:
        from torchvision.transforms.v2 import functional as F  # lazily: see gpu_decode.py

        image = F.resize(image, [size, size], antialias=True)  # uint8 in, uint8 out
    return image.contiguous()


class ImageDecoder:
    """path -> uint8 CHW tensor of `size` x `size`, by the chosen JPEG decoder (PIL otherwise)."""

    def __init__(self, name: str, channels: int, size: int) -> None:
        self.name, self.channels, self.size = name, channels, size
        self.jpeg = JPEG_DECODERS[name]

    def decode(self, path: str, data: bytes) -> torch.Tensor:
        """Decoded at full size, or DCT-scaled to no less than `size`."""
        if data[:3] == JPEG_MAGIC and self.name != "pil":
            try:
                return self.jpeg(data, self.channels, self.size)
            except (RuntimeError, ValueError):  # CMYK, odd markers, damage: PIL decides
                pass
        try:
            return _pil(data, self.channels, self.size)
        except UnidentifiedImageError:  # its text names the BytesIO object, not the file
            raise UnreadableImage(
                f"cannot decode image {path}: not an image file PIL can identify "
                f"({len(data)} bytes, starting {bytes(data[:4]).hex()})"
            ) from None
        except (OSError, ValueError, SyntaxError) as error:  # damaged data behind a valid header
            raise UnreadableImage(f"cannot decode image {path}: {error}") from None

    def __call__(self, path: str) -> torch.Tensor:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise UnreadableImage(f"cannot decode image {path}: {error}") from None
        return centre_square(self.decode(path, data), self.size)


def choose_decoder(
    choice: str, paths: Sequence[str], channels: int, size: int
) -> tuple[ImageDecoder, str]:
    """(the decoder, why): `choice` itself, or for `auto` the fastest for the dataset's JPEGs.

    The fastest, as `make bench-data` (`time_decoders`) measured them on 2-core EPYCs:
    simplejpeg at every source size where it is installed; else torchvision below twice
    the training size and PIL from there on, where draft mode decodes at 1/2 or less. A rule
    of the sizes, not a timing at start: a timing on a busy machine can pick differently from
    one start to the next, and a resumed run would then see other pixels.
    """
    if choice != "auto":
        return ImageDecoder(choice, channels, size), f"data.decoder={choice}"
    sample = _jpeg_sample(paths)
    if not sample:
        return ImageDecoder("pil", channels, size), "auto: no JPEG files, PIL decodes them all"
    height, width = _jpeg_sample_shape(sample)
    if installed("simplejpeg"):
        name = "simplejpeg"
    else:
        name = "torchvision" if min(height, width) < 2 * size else "pil"
    return ImageDecoder(name, channels, size), (
        f"auto: the fastest for JPEGs of about {width}x{height} at {size} px "
        "(make bench-data times them)"
    )


def time_decoders(
    paths: Sequence[str], channels: int, size: int, rounds: int = 3
) -> dict[str, float]:
    """Seconds per image of each installed decoder (decode + centre square) on up to
    SAMPLE_FILES of the JPEGs in `paths`, in one thread as in a loader worker; the best of
    `rounds` interleaved rounds (a busy machine slows a round, not a decoder)."""
    files = [(path, _read(path)) for path in _jpeg_sample(paths)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best: dict[str, float] = {}
    try:
        for _ in range(rounds):
            for name in [n for n in JPEG_DECODERS if installed(n)]:
                decoder = ImageDecoder(name, channels, size)
                start = time.perf_counter()
                for path, data in files:
                    centre_square(decoder.decode(path, data), size)
                elapsed = (time.perf_counter() - start) / max(1, len(files))
                best[name] = min(best.get(name, elapsed), elapsed)
    finally:
        torch.set_num_threads(threads)
    return best


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _jpeg_sample(paths: Sequence[str]) -> list[str]:
    """Up to SAMPLE_FILES JPEG files among `paths`, picked the same way every run."""
    chosen = random.Random(0).sample(list(paths), min(len(paths), 4 * SAMPLE_FILES))
    found = []
    for path in chosen:
        try:
            with open(path, "rb") as handle:
                if handle.read(3) == JPEG_MAGIC:
                    found.append(path)
        except OSError:
            continue
        if len(found) == SAMPLE_FILES:
            break
    return found


def _jpeg_sample_shape(paths: list[str]) -> tuple[int, int]:
    """The median height and width of the sampled JPEGs (their headers only)."""
    shapes = []
    for path in paths:
        try:
            with Image.open(path) as image:
                shapes.append(image.size[::-1])
        except (OSError, ValueError):  # damaged (data.check_images=off): the loader names it
            continue
    if not shapes:
        return 0, 0
    heights, widths = zip(*shapes, strict=True)
    return int(np.median(heights)), int(np.median(widths))
