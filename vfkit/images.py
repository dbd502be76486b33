"""Images in chat messages: the one place that turns pictures into content parts and back.

Environments put images into prompts and tool results as OpenAI content parts, the shape vLLM
and vf-serve accept:

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,...."}}

    part = image_part(pil_image)                # a PIL image (or PNG/JPEG bytes) -> data URL
    urls = message_image_urls(messages)         # every image URL, in prompt order
    image = load_image(urls[0])                 # -> PIL.Image (RGB)

A data URL carries the pixels with the message, so rollouts saved to disk keep their images and
an update-only phase never re-renders them. `file://` URLs and bare paths name local files and
are read only from directories the caller allows (vLLM's `--allowed-local-media-path`); http(s)
URLs are refused (nothing here fetches from the network). Pillow is imported lazily, so text-only
users never pay for it.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

IMAGE_PART_TYPES = ("image_url", "image")
MAX_IMAGE_PIXELS = 40_000_000  # larger images are refused before their pixels are decoded
# a longer side over 200x the shorter is refused too: processors scale the short side up to
# their size, so a 274-byte 1,000,000 x 1 PNG became gigabytes (vLLM's Qwen limit is also 200)
MAX_ASPECT_RATIO = 200
MAX_IMAGE_FILE_BYTES = 64 * 2**20  # a local image file larger than this is not read
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")  # what PNG stores as it is


class ImageError(ValueError):
    """An image part that cannot be read; the message says which and why."""


def image_part(image: Any, *, format: str | None = None) -> dict[str, Any]:
    """An `image_url` content part holding `image` (PIL image or encoded bytes) as a data URL."""
    return {"type": "image_url", "image_url": {"url": to_data_url(image, format=format)}}


def to_data_url(image: Any, *, format: str | None = None) -> str:
    """`image` (a PIL image, or PNG/JPEG/... bytes) as a base64 data URL.

    `format` None: a photo decoded from a JPEG stays a JPEG (as PNG it grew ~7x, and two made
    a request too large to serve), anything else is a PNG. Modes PNG cannot store (CMYK, F,
    YCbCr, ...) are converted to RGB first, as a server would.
    """
    if isinstance(image, bytes | bytearray):
        data, mime = bytes(image), _sniff_mime(bytes(image))
        return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    format = (format or ("JPEG" if image.format == "JPEG" else "PNG")).upper()
    if format == "JPEG" and image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    elif format == "PNG" and image.mode not in PNG_MODES:
        image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
    buf = io.BytesIO()
    image.save(buf, format=format, **({"quality": 95} if format == "JPEG" else {}))
    return f"data:image/{format.lower()};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def part_url(part: dict[str, Any]) -> str | None:
    """The URL of an image content part (None for any other part)."""
    if not isinstance(part, dict) or part.get("type") not in IMAGE_PART_TYPES:
        return None
    value = part.get("image_url") if part.get("type") == "image_url" else part.get("image")
    url = value.get("url") if isinstance(value, dict) else value
    return url if isinstance(url, str) else None


def iter_image_parts(messages: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, str]]:
    """(message index, part index, url) of every image part, in prompt order."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            url = part_url(part)
            if url is not None:
                yield i, j, url


def map_image_urls(messages: Any, fn: Callable[[str], str]) -> Any:
    """A copy of `messages` with each image part's URL replaced by `fn(url)`, every part's
    shape kept (anything that is not a list of messages comes back as it is)."""
    if not isinstance(messages, list):
        return messages
    out = copy.deepcopy(messages)
    for i, j, url in list(iter_image_parts(out)):
        part = out[i]["content"][j]
        key = "image_url" if part.get("type") == "image_url" else "image"
        if isinstance(part[key], dict):
            part[key]["url"] = fn(url)
        else:
            part[key] = fn(url)
    return out


def message_image_urls(messages: Iterable[dict[str, Any]]) -> list[str]:
    """Every image URL in `messages`, in the order a chat template renders them."""
    return [url for _, _, url in iter_image_parts(messages)]


def has_images(messages: Iterable[dict[str, Any]]) -> bool:
    return next(iter_image_parts(messages), None) is not None


def load_image(url: str, *, allowed_local_dirs: Iterable[str | Path] = ()) -> Any:
    """The image a content-part URL names, as an RGB PIL image.

    data: URLs always; `file://` URLs and paths only inside `allowed_local_dirs`.
    Raises ImageError saying what is wrong with the URL.
    """
    from PIL import Image, UnidentifiedImageError

    head, sep, _ = url[:16].partition(":")
    scheme = head.lower() if sep and head.isalpha() else ""
    if scheme == "data":
        raw = _data_url_bytes(url)
    elif scheme in ("http", "https"):
        raise ImageError(
            f"image URL {url[:80]!r}: remote images are not fetched; send the image as a "
            "data URL (vfkit.images.image_part)"
        )
    else:
        raw = _local_file_bytes(url, allowed_local_dirs)
    try:
        with Image.open(io.BytesIO(raw)) as img:  # reads the header only
            _check_size(url, *img.size)
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ImageError(f"image URL {url[:60]!r}: not a readable image ({exc})") from exc


def image_digest(url: str) -> str:
    """A short stable name for an image URL's content (file names in results)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


def _check_size(url: str, width: int, height: int) -> None:
    """ImageError for sizes a processor cannot take in bounded memory."""
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"image URL {url[:60]!r}: {width}x{height} pixels is more than the "
            f"{MAX_IMAGE_PIXELS:,} accepted; downscale it before sending"
        )
    if max(width, height) > MAX_ASPECT_RATIO * max(1, min(width, height)):
        raise ImageError(
            f"image URL {url[:60]!r}: {width}x{height} is more than {MAX_ASPECT_RATIO} times "
            "longer than it is wide (a processor would scale it up to gigabytes); crop or pad it"
        )


def _data_url_bytes(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ImageError(f"image data URL {url[:60]!r}: expected data:image/...;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image data URL {url[:60]!r}: invalid base64 ({exc})") from exc


def _local_path(url: str) -> Path:
    """The path a `file://` URL (percent-encoded, host empty or localhost) or bare path names."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        return Path(url)
    if parts.netloc not in ("", "localhost"):
        raise ImageError(f"image URL {url[:80]!r}: a file URL on another host is not read")
    return Path(unquote(parts.path))


def _local_file_bytes(url: str, allowed_local_dirs: Iterable[str | Path]) -> bytes:
    path = _local_path(url).resolve()
    roots = [Path(d).resolve() for d in allowed_local_dirs]
    if not any(path.is_relative_to(root) for root in roots):
        where = ", ".join(map(str, roots)) or "none allowed"
        raise ImageError(
            f"image path {str(path)!r} is outside the allowed local media directories ({where}); "
            "send a data URL, or allow its directory (vf-serve --allowed-local-media-path)"
        )
    try:  # a FIFO would block the reader (and every request after it); a huge file, fill it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ImageError(f"image path {str(path)!r}: not a regular file")
            if info.st_size > MAX_IMAGE_FILE_BYTES:
                raise ImageError(f"image path {str(path)!r}: {info.st_size:,} bytes is more than "
                                 f"the {MAX_IMAGE_FILE_BYTES:,} read; downscale it")
            return f.read(MAX_IMAGE_FILE_BYTES + 1)
    except OSError as exc:
        raise ImageError(f"image path {str(path)!r}: cannot read it ({exc.strerror})") from exc


def _sniff_mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    raise ImageError("image bytes: not PNG, JPEG, WebP or GIF")
