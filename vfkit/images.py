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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

IMAGE_PART_TYPES = ("image_url", "image")
MAX_IMAGE_PIXELS = 40_000_000  # larger images are refused before their pixels are decoded


class ImageError(ValueError):
    """An image part that cannot be read; the message says which and why."""


def image_part(image: Any, *, format: str = "PNG") -> dict[str, Any]:
    """An `image_url` content part holding `image` (PIL image or encoded bytes) as a data URL."""
    return {"type": "image_url", "image_url": {"url": to_data_url(image, format=format)}}


def to_data_url(image: Any, *, format: str = "PNG") -> str:
    """`image` (a PIL image, or PNG/JPEG/... bytes) as a base64 data URL."""
    if isinstance(image, bytes | bytearray):
        data, mime = bytes(image), _sniff_mime(bytes(image))
    else:
        buf = io.BytesIO()
        image.save(buf, format=format)
        data, mime = buf.getvalue(), f"image/{format.lower()}"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


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

    if url.startswith("data:"):
        raw = _data_url_bytes(url)
    elif url.startswith(("http://", "https://")):
        raise ImageError(
            f"image URL {url[:80]!r}: remote images are not fetched; send the image as a "
            "data URL (vfkit.images.image_part)"
        )
    else:
        raw = _local_file_bytes(url, allowed_local_dirs)
    try:
        with Image.open(io.BytesIO(raw)) as img:  # reads the header only
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageError(
                    f"image URL {url[:60]!r}: {width}x{height} pixels is more than the "
                    f"{MAX_IMAGE_PIXELS:,} accepted; downscale it before sending"
                )
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ImageError(f"image URL {url[:60]!r}: not a readable image ({exc})") from exc


def image_digest(url: str) -> str:
    """A short stable name for an image URL's content (file names in results)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


def _data_url_bytes(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ImageError(f"image data URL {url[:60]!r}: expected data:image/...;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image data URL {url[:60]!r}: invalid base64 ({exc})") from exc


def _local_file_bytes(url: str, allowed_local_dirs: Iterable[str | Path]) -> bytes:
    path = Path(url.removeprefix("file://")).resolve()
    roots = [Path(d).resolve() for d in allowed_local_dirs]
    if not any(path.is_relative_to(root) for root in roots):
        where = ", ".join(map(str, roots)) or "none allowed"
        raise ImageError(
            f"image path {str(path)!r} is outside the allowed local media directories ({where}); "
            "send a data URL, or allow its directory (vf-serve --allowed-local-media-path)"
        )
    try:
        return path.read_bytes()
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
