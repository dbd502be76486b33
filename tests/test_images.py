"""vfkit.images: image content parts to pixels and back, and what it refuses (with reasons)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from vfkit.images import (
    MAX_IMAGE_FILE_BYTES,
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


def test_thin_images_fifos_and_huge_files_are_refused_without_reading_them(tmp_path) -> None:
    with pytest.raises(ImageError, match="more than 200 times longer"):
        load_image(to_data_url(Image.new("L", (200_001, 1))))  # a processor makes it gigabytes
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)  # reading it would block forever (and every request behind it)
    with pytest.raises(ImageError, match="not a regular file"):
        load_image(str(fifo), allowed_local_dirs=[tmp_path])
    huge = tmp_path / "huge.png"
    with huge.open("wb") as f:
        f.truncate(MAX_IMAGE_FILE_BYTES + 1)
    with pytest.raises(ImageError, match="more than the"):
        load_image(str(huge), allowed_local_dirs=[tmp_path])


def test_file_urls_are_parsed_as_urls_and_schemes_ignore_case(tmp_path) -> None:
    folder = tmp_path / "with space"
    folder.mkdir()
    _png(colour=(1, 2, 3)).save(folder / "a b.png")
    uri = (folder / "a b.png").as_uri()  # file:///.../with%20space/a%20b.png
    assert load_image(uri, allowed_local_dirs=[tmp_path]).getpixel((0, 0)) == (1, 2, 3)
    localhost = uri.replace("file://", "FILE://localhost")
    assert load_image(localhost, allowed_local_dirs=[tmp_path]).size == (5, 3)
    with pytest.raises(ImageError, match="another host"):
        load_image(uri.replace("file://", "file://server"), allowed_local_dirs=[tmp_path])
    with pytest.raises(ImageError, match="not fetched"):
        load_image("HTTPS://example.com/cat.png")
    upper = to_data_url(_png()).replace("data:", "DATA:", 1)
    assert load_image(upper).size == (5, 3)


def test_pil_modes_png_cannot_store_are_converted_and_jpegs_stay_jpegs() -> None:
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # red in CMYK
    assert load_image(to_data_url(cmyk)).getpixel((0, 0))[0] > 200
    assert load_image(to_data_url(Image.new("F", (4, 4), 3.5))).size == (4, 4)
    buf = io.BytesIO()
    _png(size=(64, 48)).save(buf, format="JPEG")
    photo = Image.open(io.BytesIO(buf.getvalue()))  # as datasets decodes a JPEG column
    assert to_data_url(photo).startswith("data:image/jpeg;base64,")
    assert to_data_url(_png()).startswith("data:image/png;base64,")
