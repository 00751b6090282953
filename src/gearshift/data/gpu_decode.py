"""`data.decode=gpu`: JPEG files decoded on the training device, a batch at a time.

The loader's workers only read each file's bytes (`JpegFiles`), and a batch is those bytes
laid end to end in one tensor (`collate_jpegs`: one buffer to pin and hand over, whatever
the images' sizes). `DeviceDecodedBatches` then decodes each batch with one call of
`torchvision.io.decode_jpeg(list, device=...)` (batched nvJPEG on CUDA) and resizes it as
the host path does (each image's centre square to `data.image_size`), in a thread of its
own a few batches ahead of the training loop (on CUDA on a side stream). The loop gets
uint8 batches already on the device, in the `memory_format` gear's layout, exactly as from
the host's uint8 path: its DeviceTransforms scales them to [0, 1], augments them
(`data.augment`) and normalises them (`data.mean`/`data.std`) there.

Only JPEGs can be decoded this way: while indexing, `find_non_jpegs` reads the first bytes
of every file and a non-JPEG (a PNG, an HTML page saved as .jpg) stops the run before it
starts, named. A file with a JPEG header but damaged data fails its batch's decode; the
batch is then decoded image by image to name the file (`DamagedJpeg`).

Every function here is device-agnostic (decode_jpeg decodes on the CPU too), so the tests
check them on a CPU; config/disk_checks.py refuses `data.decode=gpu` for a run on the CPU,
where it would only move the decoding from the workers into the training loop.

torchvision deprecates its image decoders from 0.29 in favour of TorchCodec; decode_jpeg
still works there, and `decode_batch` is the one place that calls it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from gearshift.data.decode import UnreadableImage, centre_square

JPEG_MAGIC = b"\xff\xd8\xff"  # start-of-image marker, then the first segment's marker


class DamagedJpeg(UnreadableImage):
    """A JPEG that passed the magic-bytes check but whose data cannot be decoded (the loop
    checkpoints and ends the run with its one line, like any UnreadableImage)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot decode image {path}: {reason}")
        self.path = path


# ---------------------------------------------------------------- indexing


def file_kind(path: str) -> str | None:
    """None for a JPEG, else what the first bytes say the file is."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        return error.strerror or type(error).__name__
    if head.startswith(JPEG_MAGIC):
        return None
    known = {b"\x89PNG": "PNG", b"GIF8": "GIF", b"BM": "BMP", b"RIFF": "WebP", b"II*": "TIFF"}
    for magic, name in known.items():
        if head.startswith(magic):
            return f"a {name} file, not a JPEG"
    return "empty, not a JPEG" if not head else "not a JPEG file"


def find_non_jpegs(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(path, what it is) for every file that is not a JPEG: a read of 8 bytes per file."""
    with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool:
        kinds = list(pool.map(file_kind, paths, chunksize=64))
    return [(path, kind) for path, kind in zip(paths, kinds, strict=True) if kind]


# ---------------------------------------------------------------- reading, collating


class JpegBatch(NamedTuple):
    """The encoded images of a batch: their bytes end to end, each one's length, its file."""

    data: torch.Tensor  # uint8, 1-D
    lengths: list[int]
    paths: list[str]

    def images(self) -> list[torch.Tensor]:
        """One 1-D uint8 view per image (what decode_jpeg takes)."""
        return list(self.data.split(self.lengths))


def read_bytes(path: str) -> torch.Tensor:
    with open(path, "rb") as handle:
        return torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)


def collate_jpegs(
    samples: Sequence[tuple[tuple[torch.Tensor, str], int]],
) -> tuple[JpegBatch, torch.Tensor]:
    """((bytes, path), label) samples -> (JpegBatch, int64 labels)."""
    encoded = [item for item, _ in samples]
    data = torch.cat([b for b, _ in encoded]) if encoded else torch.empty(0, dtype=torch.uint8)
    batch = JpegBatch(data, [len(b) for b, _ in encoded], [p for _, p in encoded])
    return batch, torch.tensor([label for _, label in samples], dtype=torch.int64)


class JpegFiles(Dataset):
    """(path, label) pairs read as undecoded bytes: decoding is the device's (`data.decode=gpu`).

    `device_transforms` (the source's stage of data/device_transforms.py: `data.augment`,
    `data.mean`, `data.std`) is what the loop does to the decoded uint8 batches.
    """

    collate = staticmethod(collate_jpegs)

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        classes: list[str],
        image_size: int,
        channels: int,
        device_transforms: dict[str, Any] | None,
        train: bool,
    ) -> None:
        self.samples, self.classes = list(samples), classes
        self.image_size, self.channels, self.train = image_size, channels, train
        self.device_transforms = device_transforms
        self.gears = {
            "data_batch_dtype": "uint8",
            "decoder": "nvjpeg",
            "decoder_reason": "data.decode=gpu: torchvision.io.decode_jpeg on the training device",
        }

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, str], int]:
        path, label = self.samples[index]
        return (read_bytes(path), path), label


# ---------------------------------------------------------------- decoding on the device


def _reason(error: Exception) -> str:
    """decode_jpeg's message without the C++ source location torchvision puts first."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return re.sub(r"^.*?\.(?:cpp|cu|h):\d+, ", "", line)


def decode_batch(batch: JpegBatch, channels: int, device: torch.device) -> list[torch.Tensor]:
    """Every image of the batch as a uint8 CHW tensor on `device`, in one batched decode.

    A batch that fails is decoded image by image to name the damaged file.
    """
    # torchvision here, not at the top: importing it (and the torch._dynamo it imports) costs a
    # run that never decodes a JPEG about as much again as importing torch
    from torchvision.io import ImageReadMode, decode_jpeg

    encoded = batch.images()
    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    # No warnings.catch_warnings around torchvision's deprecation notice: it runs in the
    # decoding thread and is not thread-safe. A DeprecationWarning is hidden by default.
    try:
        return decode_jpeg(encoded, mode=mode, device=device)
    except RuntimeError as error:
        batch_error = error
    for data, path in zip(encoded, batch.paths, strict=True):
        try:
            decode_jpeg(data, mode=mode, device=device)
        except RuntimeError as error:
            raise DamagedJpeg(path, _reason(error)) from None
    raise DamagedJpeg(", ".join(batch.paths), _reason(batch_error))  # no image fails alone


def resize_crop(images: Sequence[torch.Tensor], size: int) -> torch.Tensor:
    """uint8 CHW images of any sizes -> one uint8 N x C x size x size batch, each image's
    centre square resized to `size` as the host path does (decode.py centre_square).

    Images of one shape are resized together, so a folder of equal sizes costs one call.
    """
    by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        by_shape[tuple(image.shape)].append(i)
    out: list[torch.Tensor | None] = [None] * len(images)
    for members in by_shape.values():
        group = centre_square(torch.stack([images[i] for i in members]), size)
        if len(by_shape) == 1:
            return group
        for i, image in zip(members, group, strict=True):
            out[i] = image
    return torch.stack(out)  # type: ignore[arg-type]


class DeviceDecodedBatches:
    """Batches of JPEG bytes from `batches` (a loader over `JpegFiles`), yielded decoded and
    resized on `device` (uint8, in `memory_format`), with the labels there too; the run's
    DeviceTransforms then scales, augments and normalises them (`dataset.device_transforms`).

    A thread of its own decodes up to AHEAD batches ahead of the training loop: nvJPEG
    holds the calling thread until its batch is decoded, and on a CUDA device that thread
    issues its work on a side stream, so decoding overlaps the training step instead of
    stalling it (and the loop's data wait measures only real waiting). Before a batch is
    handed out, the loop's stream waits for its decoding (an event, no host sync), and its
    tensors are marked as used there (`record_stream`), as in data/prefetch.py. An error
    while decoding (a damaged file) is raised in the loop's thread, in order.
    """

    AHEAD = 2

    def __init__(
        self,
        batches,
        dataset: JpegFiles,
        device: torch.device,
        memory_format: torch.memory_format,
        non_blocking: bool,
    ) -> None:
        self.batches, self.dataset, self.device = batches, dataset, device
        self.memory_format, self.non_blocking = memory_format, non_blocking
        self.size, self.channels = dataset.image_size, dataset.channels

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.batches.set_epoch(epoch, start)

    def decode(self, batch: JpegBatch) -> torch.Tensor:
        """A JpegBatch -> uint8 N x C x size x size on the device, in the memory format."""
        images = resize_crop(decode_batch(batch, self.channels, self.device), self.size)
        return images.contiguous(memory_format=self.memory_format)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ready: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        stop = threading.Event()
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        thread = threading.Thread(
            target=self._decode_ahead, args=(ready, stop, side), name="jpeg-decode", daemon=True
        )
        thread.start()
        try:
            while (item := ready.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                images, labels, decoded = item
                if decoded is not None:  # CUDA: the loop's stream waits for the side stream
                    compute = torch.cuda.current_stream(self.device)
                    compute.wait_event(decoded)
                    images.record_stream(compute)
                    labels.record_stream(compute)
                yield images, labels
        finally:  # the loop ended or stopped early: let the thread finish and go
            stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)  # room for a put that is waiting
            thread.join()

    def _decode_ahead(
        self, ready: queue.Queue, stop: threading.Event, side: torch.cuda.Stream | None
    ) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    ready.put(item, timeout=0.05)
                    return True
            return False

        on_side = (
            (torch.cuda.device(self.device), torch.cuda.stream(side)) if side is not None else ()
        )
        try:
            with contextlib.ExitStack() as stack:
                for context in on_side:
                    stack.enter_context(context)
                for encoded, labels in self.batches:
                    labels = labels.to(self.device, non_blocking=self.non_blocking)
                    images = self.decode(encoded)
                    decoded = None
                    if side is not None:
                        decoded = torch.cuda.Event()
                        decoded.record(side)
                    if not put((images, labels, decoded)):
                        return
            put(_END)
        except BaseException as error:  # handed to the loop's thread, which raises it
            put(error)


_END = object()  # the decoding thread's last item: the epoch is over


def decoded_on_device(
    batches: Iterable,
    dataset: Dataset,
    device: torch.device,
    memory_format: torch.memory_format,
    non_blocking: bool,
):
    """`batches` decoded on the device when they come from `JpegFiles`, else untouched."""
    if not isinstance(dataset, JpegFiles):
        return batches
    return DeviceDecodedBatches(batches, dataset, device, memory_format, non_blocking)
