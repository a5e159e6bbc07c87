"""Pure image functions: the resize contract on every kind of input (no Spark)."""
import numpy as np
import pytest
from PIL import Image

from pipelines.etl.images import (ACCEPTED_FORMATS, ImageRejected, decode_and_fit, paste_centred, resize_to_square,
                                   to_rgb, what_pillow_sees, white_canvas)
from tests.support.env import REPO
from tests.support.imagegen import EPS, PDF, animated, encode, jpeg_with_orientation, png_bomb


def as_array(rgb: bytes, size: int) -> np.ndarray:
    assert len(rgb) == size * size * 3
    return np.frombuffer(rgb, np.uint8).reshape(size, size, 3)


def content_box(arr: np.ndarray):
    """Rows and columns that are not pure white."""
    mask = (arr != 255).any(axis=2)
    rows, cols = np.where(mask.any(axis=1))[0], np.where(mask.any(axis=0))[0]
    return rows.min(), rows.max(), cols.min(), cols.max()


def test_640x480_jpeg_is_299x224_pasted_at_row_37():
    out = resize_to_square(encode(Image.new("RGB", (640, 480), (10, 20, 30))), 299)
    arr = as_array(out.rgb, 299)
    top, bottom, left, right = content_box(arr)
    assert (top, bottom - top + 1, left, right - left + 1) == (37, 224, 0, 299)
    assert (out.height, out.width) == (480, 640)
    assert (arr[:37] == 255).all() and (arr[37 + 224:] == 255).all()


def test_grey_image_gives_equal_channels():
    arr = as_array(resize_to_square(encode(Image.new("L", (100, 80), 77)), 64).rgb, 64)
    assert (arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all()
    assert abs(int(arr[32, 32, 0]) - 77) <= 2


def test_cmyk_pure_red_comes_out_red():
    data = encode(Image.new("CMYK", (120, 120), (0, 255, 255, 0)), quality=95)
    arr = as_array(resize_to_square(data, 99).rgb, 99)
    assert np.abs(arr[49, 49].astype(int) - (255, 0, 0)).max() <= 3


def test_fully_transparent_png_is_white():
    data = encode(Image.new("RGBA", (50, 40), (0, 0, 0, 0)), "PNG")
    assert (as_array(resize_to_square(data, 32).rgb, 32) == 255).all()


def test_half_transparent_red_is_composited_on_white():
    data = encode(Image.new("RGBA", (8, 8), (255, 0, 0, 128)), "PNG")
    arr = as_array(resize_to_square(data, 8).rgb, 8)
    assert tuple(arr[4, 4]) == (255, 127, 127)


def test_palette_with_transparency_is_white_under_it():
    img = Image.new("P", (10, 10), 0)
    img.putpalette([0, 0, 0] + [255, 0, 0] * 255)
    data = encode(img, "PNG", transparency=0)
    assert (as_array(resize_to_square(data, 10).rgb, 10) == 255).all()


def test_exif_orientation_6_turns_400x200_portrait():
    out = resize_to_square(jpeg_with_orientation(400, 200, 6), 299)
    arr = as_array(out.rgb, 299)
    top, bottom, left, right = content_box(arr)
    assert (bottom - top + 1, right - left + 1) == (299, 149)
    assert (out.height, out.width) == (400, 200)
    # stored left half red -> after rotating 90 degrees clockwise, the top half is red
    assert arr[60, 149, 0] > 200 and arr[60, 149, 2] < 60
    assert arr[240, 149, 2] > 200 and arr[240, 149, 0] < 60


def test_8000x3_strip_survives():
    out = resize_to_square(encode(Image.new("RGB", (8000, 3), (0, 0, 0)), "PNG"), 299)
    arr = as_array(out.rgb, 299)
    top, bottom, left, right = content_box(arr)
    assert bottom - top + 1 == 1 and right - left + 1 == 299


def test_16_bit_grey_is_scaled_not_clipped():
    img = Image.fromarray(np.full((10, 10), 32768, np.uint16))
    rgb = to_rgb(img)
    assert rgb.getpixel((5, 5)) == (128, 128, 128)


def test_small_image_is_not_enlarged():
    arr = as_array(resize_to_square(encode(Image.new("RGB", (28, 28), 0), "PNG"), 299).rgb, 299)
    top, bottom, left, right = content_box(arr)
    assert (top, bottom - top + 1, left, right - left + 1) == (135, 28, 135, 28)


def test_large_jpeg_uses_draft_and_keeps_the_contract(monkeypatch):
    from PIL import JpegImagePlugin
    scales = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def recording(self, mode, size):
        result = draft(self, mode, size)
        scales.append(result[1] if result else None)  # (mode, (x0, y0, x1, y1) scaled box) or None
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", recording)
    out = resize_to_square(encode(Image.new("RGB", (4000, 3000), (200, 10, 10))), 299)
    arr = as_array(out.rgb, 299)
    assert (out.height, out.width) == (3000, 4000)
    assert np.abs(arr[150, 150].astype(int) - (200, 10, 10)).max() <= 3
    # decoded at 1/8 scale in the DCT (500 x 375, short side still >= 299), not at full size
    assert scales == [(0, 0, 500, 375)], scales


def test_square_input_of_the_right_size_passes_through():
    img = Image.new("RGB", (16, 16), (1, 2, 3))
    assert paste_centred(img, white_canvas(16)).tobytes() == img.tobytes()


def test_paste_offsets_match_the_recipe():
    canvas = paste_centred(Image.new("RGB", (3, 2), (0, 0, 0)), white_canvas(8))
    rows, cols = np.where((canvas != 255).any(axis=2))
    assert (rows.min(), cols.min()) == ((8 - 2) // 2, (8 - 3) // 2)


def test_decode_and_fit_keeps_small_images_and_reports_the_original_size():
    fitted = decode_and_fit(encode(Image.new("RGB", (640, 480))), 299)
    assert fitted.image.size == (299, 224) and (fitted.height, fitted.width) == (480, 640)


@pytest.mark.parametrize("data, reason", [
    (b"", "empty file"),
    (b"hello, not an image" * 10, "not a supported raster image (Pillow cannot identify it"),
    (EPS, "not a supported raster image (EPS"),
    (b"%!PS-Adobe-3.0\nshowpage\n", "not a supported raster image (PostScript"),
    (PDF, "not a supported raster image (a PDF document"),
    (encode(Image.new("RGB", (8, 8)), "PPM"), "not a supported raster image (a Netpbm image"),
    (encode(Image.new("RGB", (8, 8)), "PCX"), "not a supported raster image (a PCX image"),
    (png_bomb(), "decompression bomb"),
])
def test_bad_input_is_rejected_with_a_reason(data, reason):
    with pytest.raises(ImageRejected) as info:
        resize_to_square(data, 32)
    assert info.value.reason.startswith(reason)


def test_truncated_jpeg_is_rejected():
    rng = np.random.default_rng(0)
    full = encode(Image.fromarray(rng.integers(0, 255, (200, 300, 3), dtype=np.uint8)), quality=95)
    with pytest.raises(ImageRejected, match="undecodable"):
        resize_to_square(full[: len(full) // 2], 64)


def test_max_pixels_is_configurable():
    data = encode(Image.new("RGB", (100, 100)))
    with pytest.raises(ImageRejected, match="decompression bomb"):
        resize_to_square(data, 32, max_pixels=9999)
    assert len(resize_to_square(data, 32, max_pixels=10000).rgb) == 32 * 32 * 3


RED = (200, 30, 20)


@pytest.mark.parametrize("fmt, kwargs", [
    ("JPEG", {"quality": 95}), ("PNG", {}), ("GIF", {}), ("BMP", {}), ("WEBP", {"lossless": True}),
    ("TIFF", {}), ("TIFF", {"compression": "tiff_lzw"}), ("TIFF", {"compression": "jpeg"}),
])
def test_every_accepted_format_decodes_by_content(fmt, kwargs):
    """Size, offset and colour of a 40x20 red image in each format (no file name involved)."""
    out = resize_to_square(encode(Image.new("RGB", (40, 20), RED), fmt, **kwargs), 32)
    arr = as_array(out.rgb, 32)
    assert (out.height, out.width) == (20, 40)
    assert content_box(arr) == (8, 23, 0, 31)
    tolerance = 12 if fmt == "GIF" else 4  # GIF quantises to a 256-colour palette
    assert np.abs(arr[16, 16].astype(int) - RED).max() <= tolerance


def test_webp_is_supported_by_this_pillow():
    from PIL import features
    assert features.check("webp") and "WEBP" in ACCEPTED_FORMATS


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "TIFF"])
def test_animations_and_multi_page_files_give_their_first_frame(fmt):
    arr = as_array(resize_to_square(animated(fmt), 12).rgb, 12)
    assert np.abs(arr[6, 6].astype(int) - (255, 0, 0)).max() <= 8


def test_palette_gif_with_transparency_is_white_under_it_and_keeps_its_colours():
    img = Image.new("P", (10, 10), 0)
    img.putpalette([0, 0, 0, 0, 200, 0] + [0, 0, 0] * 254)
    img.paste(1, (0, 0, 5, 10))  # left half index 1 (green), right half index 0 (transparent)
    arr = as_array(resize_to_square(encode(img, "GIF", transparency=0), 10).rgb, 10)
    assert (arr[:, 5:] == 255).all()
    assert tuple(arr[5, 2]) == (0, 200, 0)


def test_transparent_webp_and_tiff_are_composited_on_white():
    for fmt, kwargs in (("WEBP", {"lossless": True}), ("TIFF", {})):
        data = encode(Image.new("RGBA", (8, 8), (255, 0, 0, 128)), fmt, **kwargs)
        assert np.abs(as_array(resize_to_square(data, 8).rgb, 8)[4, 4].astype(int) - (255, 127, 127)).max() <= 2


def test_16_bit_grey_tiff_is_scaled_like_png():
    data = encode(Image.fromarray(np.full((6, 6), 32768, np.uint16)), "TIFF")
    assert tuple(as_array(resize_to_square(data, 6).rgb, 6)[3, 3]) == (128, 128, 128)


def test_bmp_palette_and_grey_modes_come_out_rgb():
    palette = Image.new("P", (6, 6), 1)
    palette.putpalette([0, 0, 0, 10, 20, 250] + [0, 0, 0] * 254)
    for img, expected in ((Image.new("L", (6, 6), 77), (77, 77, 77)), (Image.new("1", (6, 6), 1), (255, 255, 255)),
                          (palette, (10, 20, 250))):
        arr = as_array(resize_to_square(encode(img, "BMP"), 6).rgb, 6)
        assert tuple(arr[3, 3]) == expected, img.mode


def test_what_pillow_sees_never_names_an_accepted_format_and_never_renders():
    # EPS is identified by its magic bytes only: no Pillow plugin parses it (tests/unit/etl/test_etl_dedupe.py).
    assert what_pillow_sees(EPS) == "EPS"
    assert what_pillow_sees(b"") == "Pillow cannot identify it"
    assert what_pillow_sees(b"\xff\xd8\xff\xe0" + bytes(1000)) == "Pillow cannot identify it"


PEAK_PROBE = """
import resource, sys
from pipelines.etl.images import decode_and_fit
data = open(sys.argv[1], 'rb').read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
decode_and_fit(data, 299, None)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.parametrize("mode", ["RGBA", "I;16"])
def test_decoding_stays_within_the_stated_bytes_per_pixel(tmp_path, mode):
    """The memory bound's DECODE_BYTES_PER_PIXEL, measured on its worst cases: a transparent
    image turned by its EXIF orientation, and 16-bit greyscale (peak RSS of a fresh process)."""
    import os
    import subprocess
    import sys
    from pipelines.etl.memory import DECODE_BYTES_PER_PIXEL
    side = 2500
    rng = np.random.default_rng(0)
    if mode == "RGBA":
        img = Image.fromarray(rng.integers(0, 255, (side, side, 4), dtype=np.uint8))
    else:
        img = Image.fromarray(rng.integers(0, 65535, (side, side), dtype=np.uint16))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "big.png"
    img.save(path, "PNG", exif=exif.tobytes(), compress_level=1)
    root = REPO
    proc = subprocess.run([sys.executable, "-c", PEAK_PROBE, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown = int(proc.stdout.split()[-1])
    assert grown <= DECODE_BYTES_PER_PIXEL * side * side + 16 * 2**20, grown / side / side
