"""vfkit.images: image content parts to pixels and back, and what it refuses (with reasons)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from vfkit.images import (
    MAX_IMAGE_PIXELS,
    ImageError,
    image_part,
    load_image,
    message_image_urls,
    to_data_url,
)


def _png(size=(5, 3), colour=(10, 200, 30)) -> Image.Image:
    return Image.new("RGB", size, colour)


def test_a_data_url_part_round_trips_the_pixels_in_prompt_order() -> None:
    red, blue = _png(colour=(255, 0, 0)), _png(colour=(0, 0, 255))
    messages = [
        {"role": "system", "content": "plain text"},
        {"role": "user", "content": [image_part(red), {"type": "text", "text": "and"}]},
        {"role": "tool", "content": [{"type": "image", "image": to_data_url(blue)}]},
    ]
    urls = message_image_urls(messages)
    assert [load_image(u).getpixel((0, 0)) for u in urls] == [(255, 0, 0), (0, 0, 255)]
    jpeg = io.BytesIO()
    red.save(jpeg, format="JPEG")
    assert to_data_url(jpeg.getvalue()).startswith("data:image/jpeg;base64,")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64,@@@", "invalid base64"),
        ("data:image/png,rawtext", "expected data:image"),
        ("data:image/png;base64,aGVsbG8=", "not a readable image"),
        ("https://example.com/cat.png", "not fetched"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(ImageError, match=says):
        load_image(url)


def test_local_files_only_from_allowed_directories(tmp_path: Path) -> None:
    path = tmp_path / "media" / "a.png"
    path.parent.mkdir()
    _png().save(path)
    with pytest.raises(ImageError, match="outside the allowed local media directories"):
        load_image(str(path))
    with pytest.raises(ImageError, match="outside"):  # no escaping through ..
        load_image(f"file://{path.parent}/../media/../a.png", allowed_local_dirs=[path.parent])
    assert load_image(f"file://{path}", allowed_local_dirs=[path.parent]).size == (5, 3)


def test_an_oversized_image_is_refused_before_decoding() -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 10
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG")  # a few KB on disk, 40M+ pixels
    with pytest.raises(ImageError, match="downscale"):
        load_image(to_data_url(buf.getvalue()))
