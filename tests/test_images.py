"""easyrl.data.images: target sizes computed by hand, bounds/aspect properties, loading and errors."""

import io
import math

import pytest
from PIL import Image

from easyrl.data.images import process_image, target_size

MIN, MAX = 56 * 56, 28 * 28 * 1280  # 3136, 1003520: the Qwen2.5-VL processor's defaults


@pytest.mark.parametrize(
    "size, bounds, factor, expected",
    [
        # area 62750 already in range: 250/28 = 8.93 -> 9, 251/28 = 8.96 -> 9 => 252 x 252
        ((250, 251), (MIN, MAX), 28, (252, 252)),
        # 12e6 px > MAX: scale sqrt(1003520 / 12e6) = 0.28918 -> 1156.7 x 867.5; /28 = 41.31 -> 41, 30.98 -> 31
        # => 1148 x 868 = 996464 <= MAX
        ((4000, 3000), (MIN, MAX), 28, (1148, 868)),
        # 5000 px < 262144: scale sqrt(262144 / 5000) = 7.2408 -> 724.1 x 362.0; /28 = 25.86 -> 26, 12.93 -> 13
        # => 728 x 364 = 264992 >= 262144
        ((100, 50), (262144, 4194304), 28, (728, 364)),
        # rounding overshoots max: 300 x 300 with max 90000: 300/28 = 10.71 -> 11 => 308^2 = 94864 > 90000,
        # so floor: 10 * 28 = 280 => 280 x 280
        ((300, 300), (MIN, 90000), 28, (280, 280)),
        # rounding undershoots min: 290 x 290 with min 84100 = 290^2: 290/28 = 10.36 -> 10 => 280^2 < 84100,
        # so ceil: 11 * 28 = 308
        ((290, 290), (84100, MAX), 28, (308, 308)),
        # Qwen3-VL factor 32: 250/32 = 7.81 -> 8 => 256; 130/32 = 4.06 -> 4 => 128
        ((250, 130), (64 * 64, 32 * 32 * 1280), 32, (256, 128)),
    ],
)
def test_target_size_hand_computed(size, bounds, factor, expected):
    assert target_size(*size, *bounds, factor=factor) == expected


def test_target_size_properties_over_many_sizes():
    lo, hi = 262144, 4194304
    for width in (30, 97, 250, 333, 640, 1000, 1920, 4096, 7000):
        for height in (40, 121, 251, 480, 1080, 3000, 6000):
            w, h = target_size(width, height, lo, hi)
            assert w % 28 == 0 and h % 28 == 0
            assert lo <= w * h <= hi, (width, height, w, h)
            # aspect kept: each side is within one factor of the side scaled (aspect-preserving) into the bounds
            scale = math.sqrt(min(max(width * height, lo), hi) / (width * height))
            assert abs(w - width * scale) <= 28 and abs(h - height * scale) <= 28, (width, height, w, h)


def test_target_size_rejects_bad_bounds_and_aspect():
    with pytest.raises(ValueError, match="min_pixels"):
        target_size(100, 100, 5000, 4000)
    with pytest.raises(ValueError, match="min_pixels"):
        target_size(100, 100, 100, 4000)  # below one 28 x 28 cell
    with pytest.raises(ValueError, match="aspect ratio"):
        target_size(10000, 40, MIN, MAX)


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_process_image_from_pil_dict_and_path(tmp_path):
    image = Image.new("RGB", (250, 251), (10, 200, 30))
    path = tmp_path / "a.png"
    image.save(path)
    for source in (image, {"bytes": _png_bytes(image), "path": None}, {"bytes": None, "path": str(path)}, str(path)):
        out = process_image(source, MIN, MAX)
        assert out.mode == "RGB" and out.size == (252, 252)
        assert out.getpixel((126, 126)) == (10, 200, 30)


def test_process_image_lays_transparency_over_white():
    rgba = Image.new("RGBA", (56, 56), (0, 0, 0, 0))  # fully transparent black
    rgba.putpixel((0, 0), (255, 0, 0, 255))
    out = process_image(rgba, MIN, MAX)
    assert out.mode == "RGB" and out.size == (56, 56)
    assert out.getpixel((30, 30)) == (255, 255, 255)
    assert out.getpixel((0, 0)) == (255, 0, 0)


def test_process_image_errors_name_the_source(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(ValueError, match="nope.png"):
        process_image(str(missing), MIN, MAX)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="broken.png"):
        process_image({"bytes": None, "path": str(broken)}, MIN, MAX)
    with pytest.raises(ValueError, match="cannot read image bytes"):
        process_image({"bytes": b"garbage", "path": "x.png"}, MIN, MAX)
    with pytest.raises(ValueError, match="neither 'bytes' nor 'path'"):
        process_image({}, MIN, MAX)
    with pytest.raises(TypeError, match="int"):
        process_image(3, MIN, MAX)
