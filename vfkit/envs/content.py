"""Message content as OpenAI content parts: images from datasets and tools into a chat.

A message's `content` is a str or a list of parts (`{"type": "text", "text": ...}`,
`{"type": "image_url", "image_url": {"url": ...}}`). Environments meet images in two places:

    image_parts([pil_image, "data:image/png;base64,..."])   # a dataset's image column
    tool_content(pil_image)          # a tool's return value -> the tool message's content

Pixels always travel as data URLs (`vfkit.images.image_part`), so a rollout saved to disk keeps
them. Text-only values stay plain strings: text environments see exactly what they saw before.
Pillow is never imported here: a value can only be a PIL image if PIL is already loaded.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from vfkit.images import IMAGE_PART_TYPES, ImageError, image_part

Part = dict[str, Any]
PART_TYPES = ("text", *IMAGE_PART_TYPES)


def is_pil_image(value: Any) -> bool:
    """True for a PIL image (without importing Pillow when nothing has loaded it)."""
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def is_part(value: Any) -> bool:
    """True for an OpenAI content part dict (text or image)."""
    return isinstance(value, dict) and value.get("type") in PART_TYPES


def text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def url_part(url: str) -> Part:
    """An image part naming `url` (a data URL, or a local path the server is allowed to read)."""
    return {"type": "image_url", "image_url": {"url": url}}


def to_image_part(value: Any) -> Part:
    """One image as a content part: a PIL image, encoded bytes, a `datasets.Image` dict
    ({"bytes", "path"}), a URL string (data URL or a local path), or an image part already."""
    if is_part(value) and value["type"] != "text":
        return dict(value)
    if is_pil_image(value) or isinstance(value, bytes | bytearray):
        return image_part(value)
    if isinstance(value, dict) and (value.get("bytes") or value.get("path")):
        raw = value.get("bytes")
        return image_part(raw) if raw else url_part(value["path"])
    if isinstance(value, str) and value:
        return url_part(value)
    raise ImageError(
        f"cannot use a {type(value).__name__} as an image; give a PIL image, encoded image bytes, "
        "a data URL or a local path"
    )


def image_parts(values: Any) -> list[Part]:
    """Image parts for one image or a list of them (None entries are skipped)."""
    if values is None:
        return []
    items = values if isinstance(values, list | tuple) else [values]
    return [to_image_part(v) for v in items if v is not None]


def as_parts(content: Any) -> list[Part]:
    """A message's content as a list of parts (a str becomes one text part)."""
    if isinstance(content, list):
        return list(content)
    return [text_part("" if content is None else str(content))]


def tool_content(result: Any) -> str | list[Part]:
    """A tool's return value as tool-message content.

    A str stays text; a PIL image becomes one image part; a list of parts (PIL images allowed
    among them) becomes content parts; anything else is JSON (or str() when not JSON-able).
    """
    if isinstance(result, str):
        return result
    if is_pil_image(result):
        return [image_part(result)]
    if isinstance(result, list | tuple) and result and all(
        is_part(x) or is_pil_image(x) for x in result
    ):
        return [x if is_part(x) and x["type"] == "text" else to_image_part(x) for x in result]
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)


def drop_none_keys(part: Any) -> Any:
    """A part without None-valued keys (Arrow gives every part every struct field)."""
    if not isinstance(part, dict):
        return part
    return {k: drop_none_keys(v) for k, v in part.items() if v is not None}


def move_images_to_user(tool_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool messages with text content only, then one user message with their images (if any).

    For servers that accept images only from users (the OpenAI API); each tool message says
    where its images went, so the model can tell which image answered which call.
    """
    out, images = [], []
    for message in tool_messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        own = [part for part in content if part.get("type") in IMAGE_PART_TYPES]
        text = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        if own:
            text += f" [{len(own)} image(s) in the next user message]"
        out.append({**message, "content": text.strip()})
        images.extend(own)
    if images:
        out.append({"role": "user", "content": [text_part("Images from the tool calls:"),
                                                *images]})
    return out
