"""app/imaging/: safe decoding of every supported format and mode, and MNIST-style normalisation."""

import base64
import io
import re
import warnings
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from app import imaging
from app.imaging import ImageError, digit, resample
from app.imaging.decode import PLAIN_GREY, PNG_SIGNATURE
from app.imaging.digit import NORM_BOX, at_norm_box, digit_ink, fit_and_centre, normalise_stroke, stroke_width
from app.imaging.ink import fit_paper, locate, source
from app.imaging.registry import PREPROCESSINGS
from app.imaging.render import IEND, OVERLAY_INPUT, png_chunk
from app.main import quiet_pillow
from model import contract
from tests.harness import FIXTURES, REAL_WORLD, encode

MAX_PIXELS = 40_000_000


@pytest.fixture(scope="module")
def seven(mnist_fixture) -> np.ndarray:
    """MNIST test image 0 (a 7) as floats in [0, 1]: already MNIST-normalised, the reference."""
    return mnist_fixture[0][0].astype(np.float32) / 255


def load(data: bytes, mode: str = "digit") -> np.ndarray:
    return imaging.preprocess(imaging.decode(data, MAX_PIXELS), mode).image


def drawn_in_corner(reference: np.ndarray, canvas: int = 280, height: int = 70, at=(12, 20)) -> np.ndarray:
    """The reference digit's ink redrawn `height` pixels tall in the top-left corner of a big canvas."""
    rows, cols = np.flatnonzero(reference.any(1)), np.flatnonzero(reference.any(0))
    crop = reference[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    width = round(crop.shape[1] * height / crop.shape[0])
    big = np.asarray(Image.fromarray(crop).resize((width, height), Image.Resampling.BICUBIC)).clip(0, 1)
    ink = np.zeros((canvas, canvas), np.float32)
    ink[at[0] : at[0] + height, at[1] : at[1] + width] = big
    return ink


def canvases(ink: np.ndarray) -> dict[str, bytes]:
    """One drawing, four ways a client may send it."""
    u8 = np.round(ink * 255).astype(np.uint8)
    rgba = np.zeros((*ink.shape, 4), np.uint8)
    rgba[..., 3] = u8  # black strokes on a transparent layer (the demo's drawing pad)
    dark_theme = np.round(0.2 * 255 + ink * (255 - 0.2 * 255)).astype(np.uint8)  # white on #333333
    return {
        "light-on-dark": encode(u8),
        "dark-on-light": encode(Image.fromarray(255 - u8).convert("RGB")),
        "rgba-transparent": encode(Image.fromarray(rgba, "RGBA")),
        "dark-theme": encode(Image.fromarray(dark_theme).convert("RGB")),
    }


def centre_of_mass(x: np.ndarray) -> tuple[float, float]:
    ys, xs = np.indices(x.shape)
    return float((ys * x).sum() / x.sum()), float((xs * x).sum() / x.sum())


def test_mnist_digits_come_back_unchanged(mnist_fixture):
    images = mnist_fixture[0][:100].astype(np.float32) / 255
    errors = [np.abs(load(encode(np.round(x * 255).astype(np.uint8))) - x).mean() for x in images]
    assert np.mean(errors) < 0.01


def test_small_digit_in_a_corner_normalises_like_mnist(seven):
    outs = {name: load(data) for name, data in canvases(drawn_in_corner(seven)).items()}
    for name, out in outs.items():
        assert out.shape == (28, 28) and out.dtype == np.float32, name
        assert out.min() >= 0.0 and out.max() == pytest.approx(1.0), name
        cy, cx = centre_of_mass(out)
        assert abs(cy - 14) <= 0.5 and abs(cx - 14) <= 0.5, (name, cy, cx)
        rows, cols = np.flatnonzero(out.any(1)), np.flatnonzero(out.any(0))
        assert max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1 <= 21, name  # 20x20 box (+1 for LANCZOS tails)
        assert np.abs(out - seven).mean() < 0.03, name  # close to the MNIST original
        assert np.corrcoef(out.ravel(), seven.ravel())[0, 1] > 0.9, name
        np.testing.assert_allclose(out, outs["light-on-dark"], atol=0.02, err_msg=name)


def test_jpeg_noise_does_not_move_the_digit(seven):
    ink = drawn_in_corner(seven)
    jpeg = encode(Image.fromarray(255 - np.round(ink * 255).astype(np.uint8)), "JPEG", quality=70)
    out = load(jpeg)
    assert np.corrcoef(out.ravel(), seven.ravel())[0, 1] > 0.85


@pytest.mark.parametrize("fmt,args", [("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}), ("GIF", {})])
def test_formats_decode_alike(seven, fmt, args):
    u8 = np.round(seven * 255).astype(np.uint8)
    np.testing.assert_allclose(load(encode(u8, fmt, **args), "none"), u8 / 255, atol=1 / 255 + 1e-6)


def test_gif_first_frame(seven):
    first = Image.fromarray(np.round(seven * 255).astype(np.uint8))
    second = Image.fromarray(np.zeros((28, 28), np.uint8))
    data = encode(first, "GIF", save_all=True, append_images=[second], duration=100)
    np.testing.assert_allclose(load(data, "none"), np.round(seven * 255) / 255, atol=1e-6)


@pytest.mark.parametrize("mode", ["L", "RGB", "P", "1", "CMYK", "LA", "I;16"])
def test_modes(seven, mode):
    u8 = (seven > 0.5).astype(np.uint8) * 255  # bilevel, so every mode can hold it exactly
    if mode == "I;16":
        image = Image.fromarray(u8.astype(np.uint16) * 257)
    elif mode == "LA":
        image = Image.merge("LA", [Image.fromarray(u8), Image.new("L", (28, 28), 255)])
    else:
        image = Image.fromarray(u8).convert(mode)
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    out = load(encode(image, fmt, **({"quality": 100} if fmt == "JPEG" else {})), "none")
    np.testing.assert_allclose(out, u8 / 255, atol=0.1 if fmt == "JPEG" else 1e-6)


def test_palette_transparency_is_ink(seven):
    u8 = np.where(seven > 0.5, 1, 0).astype(np.uint8)
    image = Image.fromarray(u8, "P")
    image.putpalette([255, 255, 255, 0, 0, 0])  # index 0 transparent white, 1 black ink
    data = encode(image, transparency=0)
    out = load(data)
    reference = load(encode(u8 * 255))
    np.testing.assert_allclose(out, reference, atol=1e-6)


@pytest.mark.parametrize("mode", ["none", "digit", "garment"])
@pytest.mark.parametrize("paper, ink", [(128, 255), (255, 100)])
def test_a_transparent_grey_value_is_transparent_at_16_bits_as_at_8(seven, mode, paper, ink):
    """A grey PNG may name one value transparent (its tRNS chunk): the paper of that value is transparent at 16
    bits as at 8, and only it, whichever preprocessing reads the picture (light ink on transparent mid-grey;
    dark ink on transparent white, whose 8-bit clip every grey of 255 x 257 and up would share)."""
    u8 = np.where(seven > 0.5, ink, paper).astype(np.uint8)
    eight = encode(Image.fromarray(u8), transparency=paper)
    sixteen = encode(Image.fromarray(u8.astype(np.uint16) * 257), transparency=paper * 257)
    assert Image.open(io.BytesIO(sixteen)).mode == "I;16"
    if mode == "garment" and ink > paper:  # a white garment cut out: shown on white, nothing stands out
        for data in (eight, sixteen):
            with pytest.raises(ImageError, match="nothing stands out"):
                load(data, mode)
        return
    out = load(sixteen, mode)
    np.testing.assert_allclose(out, load(eight, mode), atol=1e-6)
    if mode == "none":
        np.testing.assert_allclose(out, np.where(seven > 0.5, ink / 255, 0.0), atol=1e-6)


def test_a_header_with_a_negative_side_is_a_corrupt_file():
    """A BMP whose header gives a width of -28 (Pillow reads 4,294,967,268) is corrupt (422), not too large (413)."""
    data = bytearray(encode(np.zeros((28, 28), np.uint8), "BMP"))
    data[18:22] = (-28).to_bytes(4, "little", signed=True)
    with pytest.raises(ImageError, match="a size no image has: the file is corrupt") as raised:
        imaging.decode(bytes(data), MAX_PIXELS)
    assert raised.value.status_code == 422


def test_exif_orientation_is_applied(seven):
    u8 = np.round(seven * 255).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: rotate 90° clockwise to display
    stored = Image.fromarray(np.rot90(u8, 1).copy())  # what such a camera stores (rotated 90° counter-clockwise)
    out = load(encode(stored, exif=exif), "none")
    np.testing.assert_allclose(out, u8 / 255, atol=1e-6)


def test_none_needs_28x28():
    with pytest.raises(ImageError, match="28x28"):
        load(encode(np.zeros((280, 280), np.uint8)), "none")


def test_none_warns_of_an_input_unlike_the_models_images(mnist_fixture):
    """Taken as it is, a blank image, one of low contrast and dark ink on light paper are read with a warning
    each; MNIST's and Fashion-MNIST's test images with none."""

    def warnings_of(x: np.ndarray) -> list[str]:
        return imaging.preprocess(imaging.decode(encode(x), MAX_PIXELS), "none").warnings

    digit = mnist_fixture[0][0]
    with np.load(FIXTURES / "fashion_test_200.npz") as f:
        garments = f["images"]
    assert all(warnings_of(x) == [] for x in (*mnist_fixture[0][:100], *garments[:100]))
    for blank in (np.zeros((28, 28), np.uint8), np.full((28, 28), 255, np.uint8), np.full((28, 28), 120, np.uint8)):
        (note,) = warnings_of(blank)
        assert note.startswith("the image is blank")
    (note,) = warnings_of((digit // 5).astype(np.uint8))  # ink at 51 of 255 at most
    assert note.startswith("very low contrast: the image's pixels span 0.20")
    (note,) = warnings_of(255 - digit)
    assert "edges are light" in note and "preprocess=auto" in note


def test_every_preprocessing_a_card_names_has_its_function():
    assert set(PREPROCESSINGS) == set(contract.PREPROCESSING)


def test_an_unknown_preprocessing_is_refused_in_words():
    """Not a KeyError, nor the digit's pipeline in silence: a name without a function is the code's mistake."""
    with pytest.raises(ValueError, match="no preprocessing is named 'letter': a model's card names one of digit"):
        imaging.preprocess(Image.new("L", (28, 28)), "letter")


@pytest.mark.parametrize(
    "image",
    [
        Image.new("L", (280, 280), 255),
        Image.new("RGB", (100, 60), (51, 51, 51)),
        Image.new("RGBA", (280, 280), (0, 0, 0, 0)),
        Image.new("RGBA", (280, 280), (255, 255, 255, 255)),
    ],
)
def test_empty_canvas_has_no_ink(image):
    with pytest.raises(ImageError, match="no ink") as info:
        load(encode(image))
    assert info.value.status_code == 422


def test_pixel_limit_from_the_header():
    data = encode(Image.new("1", (3000, 3000)))
    with pytest.raises(ImageError, match="pixels") as info:
        imaging.decode(data, max_pixels=1_000_000)
    assert info.value.status_code == 413


def test_the_pixel_limit_is_the_services_alone():
    """A header of more pixels than Pillow's own guard allows (2 x 89,478,485) is refused in the service's
    words, with its limit; a limit above Pillow's opens it."""
    header = encode(Image.new("1", (8, 8)))[:33]  # signature and IHDR: nothing Image.open reads past them
    ihdr = b"IHDR" + (15_000).to_bytes(4, "big") * 2 + header[24:29]
    bomb = header[:12] + ihdr + zlib.crc32(ihdr).to_bytes(4, "big") + b"\x00\x00\x00\x00IEND\xaeB`\x82"
    with pytest.raises(ImageError) as info:
        imaging.open_image(bomb, MAX_PIXELS)
    assert info.value.status_code == 413
    assert info.value.detail == f"the image has 15000x15000 = 225,000,000 pixels; the limit is {MAX_PIXELS:,}"
    assert imaging.open_image(bomb, 300_000_000).size == (15_000, 15_000)


def test_a_corrupt_exif_block_is_read_without_a_warning_in_the_servers_log(seven):
    """Pillow warns of a client's file (here its EXIF block, cut short), which the answer speaks for: the
    service's lifespan turns those warnings off (app/main.py)."""
    buffer = io.BytesIO()
    exif = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff" + bytes(20)  # 65,535 entries announced, none there
    Image.fromarray(np.round(seven * 255).astype(np.uint8)).convert("RGB").save(buffer, "JPEG", exif=exif)
    for quiet in (False, True):
        with warnings.catch_warnings(record=True) as seen:  # the filters in force, and every warning recorded
            if quiet:
                quiet_pillow()
            assert imaging.decode(buffer.getvalue(), MAX_PIXELS).size == (28, 28)
        assert [str(w.message).split(".")[0] for w in seen] == ([] if quiet else ["Corrupt EXIF data"])


def grey_png(rows: bytes, width: int, height: int, *extra: bytes, layout: bytes = PLAIN_GREY) -> bytes:
    """A PNG written by hand: the signature, IHDR, `extra` chunks, one IDAT of `rows` deflated, IEND."""
    ihdr = png_chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big") + layout)
    return PNG_SIGNATURE + ihdr + b"".join(extra) + png_chunk(b"IDAT", zlib.compress(rows)) + IEND


def test_a_plain_grey_png_is_read_without_pillow_as_pillow_reads_it(mnist_fixture, seven):
    """MNIST digits saved by Pillow and by OpenCV, a noise picture with every PNG filter type, and digits on
    pictures Pillow reduces and resizes (a 280 px canvas, a 1,100 px page): the pixels are Pillow's, and so is
    every preprocessing's input, warnings and candidates."""
    digits = mnist_fixture[0][:25]
    noise = np.random.default_rng(0).integers(0, 256, (64, 61), dtype=np.uint8)
    files = [encode(x) for x in digits] + [cv2.imencode(".png", x)[1].tobytes() for x in digits[:5]]
    files.append(grey_png(b"".join(bytes([i % 5]) + row.tobytes() for i, row in enumerate(noise)), 61, 64))
    files += [encode(drawn_in_corner(seven)), on_white(drawn_in_corner(seven, 1100, 300, (200, 300)))]
    for data in files:
        pixels = imaging.plain_grey_png(data, 1100, MAX_PIXELS)
        image = imaging.decode(data, MAX_PIXELS)
        assert pixels is not None and np.array_equal(pixels, np.asarray(image))
        for kind in (*PREPROCESSINGS, "none"):
            try:
                expected = imaging.preprocess(image, kind)
            except ImageError as refused:
                with pytest.raises(ImageError, match=re.escape(refused.detail)):
                    imaging.preprocess(pixels, kind)
                continue
            got = imaging.preprocess(pixels, kind)
            assert np.array_equal(got.image, expected.image) and got.warnings == expected.warnings
            assert (got.candidates is None and expected.candidates is None) or np.array_equal(
                got.candidates, expected.candidates
            )


def test_any_other_file_is_left_to_pillow_and_libpng_never_sees_a_broken_one(capfd, seven):
    """Colour, transparency, a palette, 16 bits, interlacing, text (which may hold EXIF or XMP), an orientation,
    a picture over the side or pixel limit, and every broken file (a CRC, the deflate stream, its rows) are
    not read without Pillow; nothing reaches libpng, which would write its complaints to stderr."""
    u8 = np.round(seven * 255).astype(np.uint8)
    rows = b"".join(b"\x00" + row.tobytes() for row in u8)
    plain = grey_png(rows, 28, 28)
    assert imaging.plain_grey_png(plain, 64, MAX_PIXELS) is not None
    exif = Image.Exif()
    exif[0x0112] = 6
    broken_crc = bytearray(plain)
    broken_crc[-13] ^= 0xFF  # a byte of IDAT's CRC, its data whole (IEND is the last 12 bytes)
    deflated = zlib.compress(rows)
    broken_stream = deflated[:2] + bytes([deflated[2] ^ 0xFF]) + deflated[3:]
    others = {
        "RGB": encode(Image.fromarray(u8).convert("RGB")),
        "RGBA": encode(Image.fromarray(u8).convert("RGBA")),
        "palette": encode(Image.fromarray(u8).convert("P")),
        "16-bit": encode(Image.fromarray(u8.astype(np.uint16) * 257, "I;16")),
        "transparent value": encode(Image.fromarray(u8), transparency=0),
        "interlaced": grey_png(rows, 28, 28, layout=bytes([8, 0, 0, 0, 1])),
        "text": grey_png(rows, 28, 28, png_chunk(b"tEXt", b"Comment\x00a digit")),
        "orientation": encode(Image.fromarray(u8), exif=exif),
        "JPEG": encode(u8, "JPEG"),
        "wider than the side": encode(np.zeros((28, 65), np.uint8)),
        "over the pixel limit": plain,
        "truncated": plain[:-20],
        "a CRC": bytes(broken_crc),
        "the deflate stream": grey_png(b"", 28, 28)[:33] + png_chunk(b"IDAT", broken_stream) + IEND,
        "a row short": grey_png(rows[:-1], 28, 28),
        "a row more": grey_png(rows + rows[:29], 28, 28),
        "a filter type 5": grey_png(b"\x05" + rows[1:], 28, 28),
        "data after IEND": plain + b"\x00",
        "no IEND": plain[:-12] + png_chunk(b"IDAT", b""),
    }
    for name, data in others.items():
        limit = 28 * 28 - 1 if name == "over the pixel limit" else MAX_PIXELS
        assert imaging.plain_grey_png(data, 64, limit) is None, name
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("text", ["", "data:image/png,abc", "not base64!", "QUJD\u00e9"])
def test_bad_base64(text):
    with pytest.raises(ImageError):
        imaging.decode(imaging.from_base64(text), MAX_PIXELS)


def test_base64_and_data_url_agree(seven):
    data = encode(np.round(seven * 255).astype(np.uint8))
    encoded = base64.b64encode(data).decode()
    assert imaging.from_base64(encoded) == data
    assert imaging.from_base64("data:image/png;base64," + encoded[:40] + "\n" + encoded[40:]) == data


def test_png_data_url_holds_each_pixel_rounded_as_numpy_rounds_it(seven, capfd):
    """The PNG of a data URL holds round(clip(x, 0, 1) * 255) exactly (halves to even, as np.round; below 0
    and above 1 clipped), grey and RGB, of any size; Pillow and libpng (OpenCV) read it alike, libpng
    without a word on stderr."""
    rng = np.random.default_rng(0)
    levels = np.arange(256, dtype=np.float32)
    halves = (levels[:-1] + 0.5) / np.float32(255)
    halves = halves[halves * np.float32(255) == levels[:-1] + 0.5]  # those whose product is a half, exactly
    assert halves.size > 100
    edges = np.float32([-1.0, -1e-6, 0.0, 1.0, 1 + 1e-6, 7.0, *halves])
    pictures = {
        "a digit": seven,
        "halves and the edges": np.resize(edges, (14, 24)),
        "a row": rng.random((1, 57), np.float32),
        "one pixel": np.float32([[0.5 / 255]]),
        "the overlay": imaging.overlay(seven, np.stack([seven, np.zeros_like(seven)])),
        "RGB noise": rng.random((5, 31, 3), np.float32) * 1.4 - 0.2,
    }
    for name, x in pictures.items():
        url = imaging.png_data_url(x)
        assert url.startswith("data:image/png;base64,"), name
        data = imaging.from_base64(url)
        expected = np.round(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)
        with Image.open(io.BytesIO(data)) as png:
            assert (png.format, png.mode, png.size[::-1]) == ("PNG", "RGB" if x.ndim == 3 else "L", x.shape[:2]), name
            np.testing.assert_array_equal(np.asarray(png), expected, err_msg=name)
        read = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(read[..., ::-1] if x.ndim == 3 else read, expected, err_msg=name)
    assert capfd.readouterr().err == ""


def test_the_overlay_draws_the_first_object_red_and_the_second_green_over_the_dimmed_input(seven):
    """Fig. 5's colours: the first reconstruction in red, the second in green, each over the input at
    OVERLAY_INPUT, which the blue channel shows alone for two objects."""
    dimmed = OVERLAY_INPUT * seven
    rgb = imaging.overlay(seven, np.stack([seven, np.zeros_like(seven)]))
    np.testing.assert_allclose(rgb, np.stack([seven, dimmed, dimmed], axis=-1), atol=1e-7)


# --- photos, specks, markers: the inputs people send --------------------------------------------
def photographed(ink: np.ndarray, seed: int = 0, contrast: float = 0.55) -> bytes:
    """Ink (H, W) in [0, 1] as dark-grey pen on grey paper under uneven light (a gradient of 0.25),
    with sensor noise (sigma 0.04) and a JPEG of quality 60."""
    rng = np.random.default_rng(seed)
    h, w = ink.shape
    ramp = np.linspace(-0.125, 0.125, w, dtype=np.float32)[None, :]
    paper = 0.75 + ramp + np.zeros((h, 1), np.float32)
    grey = paper - contrast * ink + rng.normal(0, 0.04, (h, w))
    return encode(Image.fromarray(np.round(np.clip(grey, 0, 1) * 255).astype(np.uint8)), "JPEG", quality=60)


def test_a_photo_of_a_digit_on_paper_is_found(seven):
    """Noise and JPEG ringing over the whole photo are not ink: the crop is the digit, not the photo."""
    out = load(photographed(drawn_in_corner(seven, canvas=640, height=160, at=(300, 380))))
    assert np.corrcoef(out.ravel(), seven.ravel())[0, 1] > 0.85
    cy, cx = centre_of_mass(out)
    assert abs(cy - 14) <= 1 and abs(cx - 14) <= 1


def test_specks_far_from_the_digit_are_dropped(seven):
    ink = drawn_in_corner(seven, canvas=400, height=150, at=(120, 150))
    dusty = ink.copy()
    for y, x in [(10, 10), (380, 30), (20, 370), (390, 390)]:
        dusty[y : y + 4, x : x + 4] = 1.0
    clean = imaging.preprocess(imaging.decode(encode(np.round(ink * 255).astype(np.uint8)), MAX_PIXELS), "digit")
    speckled = imaging.preprocess(imaging.decode(encode(np.round(dusty * 255).astype(np.uint8)), MAX_PIXELS), "digit")
    np.testing.assert_allclose(speckled.image, clean.image, atol=1e-6)
    assert speckled.warnings == clean.warnings == []


def test_a_second_shape_is_left_out_with_a_warning(seven):
    ink = drawn_in_corner(seven, canvas=600, height=150, at=(200, 40))
    ink[200:350, 500:520] = 1.0  # a bar far to the right, as heavy as a stroke of the digit
    out = imaging.preprocess(imaging.decode(encode(np.round(ink * 255).astype(np.uint8)), MAX_PIXELS), "digit")
    assert np.corrcoef(out.image.ravel(), seven.ravel())[0, 1] > 0.9
    assert any("other shape" in w for w in out.warnings)


def test_low_contrast_is_warned(seven):
    out = imaging.preprocess(imaging.decode(photographed(drawn_in_corner(seven), contrast=0.15), MAX_PIXELS), "digit")
    assert any("low contrast" in w for w in out.warnings)
    assert np.corrcoef(out.image.ravel(), seven.ravel())[0, 1] > 0.8


def on_white(ink: np.ndarray) -> bytes:
    return encode(np.round((1 - ink) * 255).astype(np.uint8))


def test_a_black_digit_small_in_a_large_picture_has_its_full_contrast(seven):
    """40 px of 4000: the copy reduced to 128 px greys its strokes to about 0.2, but black on white is no
    low contrast."""
    out = imaging.preprocess(imaging.decode(on_white(drawn_in_corner(seven, 4000, 40, (1000, 1500))), MAX_PIXELS))
    assert out.warnings == []
    assert np.corrcoef(out.image.ravel(), seven.ravel())[0, 1] > 0.9


def test_a_digit_lost_in_the_reduced_copy_is_told_to_crop_closer(seven):
    with pytest.raises(imaging.ImageError, match="crop the picture closer"):
        imaging.preprocess(imaging.decode(on_white(drawn_in_corner(seven, 4000, 20, (1000, 2000))), MAX_PIXELS))
    for faint in (0.0, 0.05):  # white paper, and paper with a pale grey square on it: both below the contrast
        blank = np.zeros((100, 100), np.float32)
        blank[30:70, 30:70] = faint
        with pytest.raises(
            imaging.ImageError, match=r"blank \(nothing differs from the paper by 10% .*\); draw a digit$"
        ):
            imaging.preprocess(imaging.decode(on_white(blank), MAX_PIXELS))


def test_a_marker_stroke_is_thinned_into_mnists_range(seven):
    """A marker's stroke (beyond MNIST's 99th percentile, 0.25 of the side) comes out near MNIST's
    median: the 28x28 input has clearly less ink than the marker fitted as it is."""
    from scipy import ndimage

    big = drawn_in_corner(seven, canvas=400, height=300, at=(50, 80))
    marker = ndimage.distance_transform_edt(big < 0.5) <= 40  # strokes grow by 40 px each side
    ink, side, _ = digit_ink(*_located(marker.astype(np.float32)))
    assert stroke_width(at_norm_box(ink, side)) / NORM_BOX > contract.STROKE_RANGE[1]
    thinned = normalise_stroke(ink, side)
    rows, cols = np.flatnonzero(thinned.max(1) >= 0.5), np.flatnonzero(thinned.max(0) >= 0.5)
    new_side = max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1
    assert stroke_width(thinned) / new_side == pytest.approx(contract.STROKE_MEDIAN, abs=0.03)
    out = load(encode(np.round(marker * 255).astype(np.uint8)))
    assert (out > 0.5).sum() < 0.8 * (fit_and_centre(ink) > 0.5).sum()


def test_strokes_within_mnists_range_are_untouched(seven):
    ink, side, _ = digit_ink(*_located(drawn_in_corner(seven)))
    assert normalise_stroke(ink, side) is ink


def _located(ink: np.ndarray) -> tuple:
    picture, light_ink = source(Image.fromarray(np.round(ink * 255).astype(np.uint8)))
    return picture, *locate(picture, light_ink)


# --- low resolution: thumbnails, old scans, webcam crops ---------------------------------------------
def square(reference: np.ndarray) -> np.ndarray:
    """The reference digit cropped to its ink and padded to a square: it touches two borders."""
    rows, cols = np.flatnonzero(reference.any(1)), np.flatnonzero(reference.any(0))
    crop = reference[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape
    n = max(h, w)
    return np.pad(crop, (((n - h) // 2, (n - h + 1) // 2), ((n - w) // 2, (n - w + 1) // 2)))


def upscaled(ink: np.ndarray, side: int, method=Image.Resampling.BICUBIC) -> np.ndarray:
    """Ink resized so that its longer side is `side` px, aspect kept."""
    scale = side / max(ink.shape)
    size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
    return np.asarray(Image.fromarray(ink).resize(size, method)).clip(0, 1)


def low_resolution(reference: np.ndarray, method=Image.Resampling.BICUBIC) -> np.ndarray:
    """The digit as an 8x8 scan shows it (optdigits' grid) upscaled to 64x64: soft, filling its frame."""
    small = np.asarray(Image.fromarray(square(reference)).resize((8, 8), Image.Resampling.BOX))
    return upscaled(small, 64, method)


def blurred(reference: np.ndarray) -> np.ndarray:
    """The digit filling a 112 px square, out of focus (Gaussian, sigma 5 px)."""
    from scipy import ndimage

    return ndimage.gaussian_filter(upscaled(square(reference), 112), 5)


def tight(reference: np.ndarray) -> np.ndarray:
    """The digit at 112 px cropped to its ink: it touches all four borders."""
    rows, cols = np.flatnonzero(reference.any(1)), np.flatnonzero(reference.any(0))
    return upscaled(reference[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1], 112)


def read_all(client, digits, make, dark_ink: bool, method=None) -> list[int]:
    """/predict's answer (-1: refused) for each digit made by make(reference[, method])."""
    answers = []
    for image in digits[0]:
        ink = make(image.astype(np.float32) / 255, *([method] if method else []))
        u8 = np.round(ink * 255).astype(np.uint8)
        r = client.post(
            "/predict", params={"include": ""}, files={"file": ("digit.png", encode(255 - u8 if dark_ink else u8))}
        )
        answers.append(r.json()["prediction"] if r.status_code == 200 else -1)
    return answers


@pytest.mark.parametrize("dark_ink", [False, True], ids=["light-ink", "dark-ink"])
@pytest.mark.parametrize("method", [Image.Resampling.BICUBIC, Image.Resampling.BILINEAR], ids=["bicubic", "bilinear"])
def test_8x8_digits_upscaled_are_found_and_read(client, digits, method, dark_ink):
    """A lighting fit can take these soft digits for uneven paper: 098fb5b's read 6-10 of 20 and refused
    the rest as blank paper (or a 500)."""
    answers = read_all(client, digits, low_resolution, dark_ink, method)
    assert -1 not in answers
    # 19 or 20 on the int8 graph here; one digit's margin (0.02) is within what int8 kernels move between CPUs
    assert sum(a == y for a, y in zip(answers, digits[1], strict=True)) >= 18, answers


@pytest.mark.parametrize("make", [blurred, tight])
@pytest.mark.parametrize("dark_ink", [False, True], ids=["light-ink", "dark-ink"])
def test_blurred_digits_and_tight_crops_are_read(client, digits, make, dark_ink):
    """Blurred: 098fb5b's preprocessing read 11 of 20; cropped tight: 17 of 20."""
    answers = read_all(client, digits, make, dark_ink)
    assert -1 not in answers
    assert sum(a == y for a, y in zip(answers, digits[1], strict=True)) >= 19, answers


def test_the_paper_under_a_soft_digit_is_flat(seven):
    """A soft digit that fills its frame is not lighting: the paper is flat, at its black, and the noise
    is not the digit's spread (before: a bent surface and sigma 0.2, so no ink passed 4 sigma)."""
    paper, ink = fit_paper(low_resolution(seven), light_ink=False)
    assert not paper.surface[1:].any() and paper.surface[0] < 0.01
    assert paper.polarity == 1.0 and paper.sigma < 0.02
    assert ink.max() > 0.8


def test_the_paper_under_uneven_light_is_its_surface(seven):
    """A gradient (0.25 across) with noise (sigma 0.01) under a dark digit: the surface is fitted."""
    rng = np.random.default_rng(0)
    ink = drawn_in_corner(seven, canvas=128, height=60, at=(30, 40))
    paper_grey = 0.75 + np.linspace(-0.125, 0.125, 128, dtype=np.float32)[None, :] + np.zeros((128, 1), np.float32)
    x = np.clip(paper_grey - 0.5 * ink + rng.normal(0, 0.01, (128, 128)), 0, 1).astype(np.float32)
    paper, _ = fit_paper(x, light_ink=False)
    assert paper.surface[1] == pytest.approx(0.125, abs=0.01)  # u in [-1, 1] across the width
    assert paper.polarity == -1.0 and paper.sigma == pytest.approx(0.01, rel=0.3)


@pytest.mark.parametrize("size,fmt", [((280, 280), "PNG"), ((280, 280), "JPEG"), ((864, 1152), "JPEG")])
def test_blank_noisy_unevenly_lit_paper_is_refused(size, fmt):
    rng = np.random.default_rng(0)
    h, w = size
    grey = 0.7 + 0.3 * (np.arange(w)[None, :] / w - 0.5) + rng.normal(0, 0.04, (h, w))
    data = encode(Image.fromarray(np.round(np.clip(grey, 0, 1) * 255).astype(np.uint8)), fmt)
    with pytest.raises(ImageError, match="no ink"):
        load(data)


def test_a_strip_thinner_than_a_block_does_not_crash():
    """A 3x153 picture with a gradient: fit_surface's 16 blocks across are taller than it (was an IndexError)."""
    strip = np.round(np.linspace(0.2, 0.8, 153)[None, :] * np.ones((3, 1)) * 255).astype(np.uint8)
    strip[:, 70:80] = 0
    assert load(encode(strip)).shape == (28, 28)


@pytest.mark.parametrize("kind, size, box", [("digit", 28, 20), ("digit-pair", 36, 23)])
def test_a_solid_block_wider_than_any_stroke_is_fitted_as_it_is(kind, size, box):
    """An 80 px white square on black: eroding it to MNIST's stroke width left nothing (was an IndexError,
    a 500); it is now fitted unthinned: a filled box_x_box square at the centre."""
    block = np.zeros((280, 280), np.uint8)
    block[100:180, 100:180] = 255
    x = imaging.preprocess(imaging.decode(encode(block), 10**7), kind, size, box).image
    rows, cols = np.flatnonzero(x.max(1) > 0.5), np.flatnonzero(x.max(0) > 0.5)
    assert len(rows) == len(cols) == box and abs(rows.mean() - size / 2) <= 1 and abs(cols.mean() - size / 2) <= 1
    assert x[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].min() > 0.5  # filled, not an outline


# ---- the image work in OpenCV and matrix products, checked against the scipy and Pillow it replaced ----


@pytest.mark.parametrize(
    "name, resampling", [("bicubic", Image.Resampling.BICUBIC), ("lanczos", Image.Resampling.LANCZOS)]
)
def test_resample_matches_pillows_resize(name, resampling):
    """Up and down, square and not, one px to a hundred: the matrix products give Pillow's mode "F" resize."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        h, w, out_h, out_w = (int(n) for n in rng.integers(1, 110, 4))
        x = (rng.random((h, w)) * (rng.random((h, w)) > 0.5)).astype(np.float32)
        expected = np.asarray(Image.fromarray(x).resize((out_w, out_h), resampling))
        np.testing.assert_allclose(resample.resize(x, (out_w, out_h), name), expected, rtol=0, atol=2e-6)


def _stroke_width_by_scipy(ink: np.ndarray) -> float:
    """The definition stroke_width implements, in scipy.ndimage (what it was before OpenCV)."""
    from scipy import ndimage

    distance = ndimage.distance_transform_edt(ink >= 0.5)
    axis = (distance > 0) & (distance >= ndimage.maximum_filter(distance, size=3))
    return 2.0 * float(np.median(distance[axis])) if axis.any() else 0.0


def test_stroke_width_is_the_exact_medial_axis_median():
    """OpenCV's distance transform gives the same medial axis and median as scipy's exact one, ties
    included (OpenCV's float32 roots differ by up to 1e-6, which broke ties before they were snapped),
    on ink that touches the border too; and the same in every call."""
    from scipy import ndimage

    rng = np.random.default_rng(1)
    for _ in range(40):
        shape = tuple(int(n) for n in rng.integers(20, 100, 2))
        ink = ndimage.binary_dilation(rng.random(shape) > 0.985, iterations=int(rng.integers(1, 6)))
        ink[:, 0] |= rng.random(shape[0]) > 0.5
        x = ink.astype(np.float32)
        assert stroke_width(x) == _stroke_width_by_scipy(x)
    # a digit's ink in part of its picture (stroke_width transforms the ink's box and the ring around
    # it), the box anywhere from the middle to a corner, its sides on the picture's edges or one px in
    for _ in range(60):
        shape = tuple(int(n) for n in rng.integers(20, 100, 2))
        height, width = (int(rng.integers(4, side + 1)) for side in shape)
        top, left = int(rng.integers(0, shape[0] - height + 1)), int(rng.integers(0, shape[1] - width + 1))
        top = int(rng.choice([top, 0, min(1, shape[0] - height), shape[0] - height]))
        left = int(rng.choice([left, 0, min(1, shape[1] - width), shape[1] - width]))
        ink = np.zeros(shape, bool)
        ink[top : top + height, left : left + width] = ndimage.binary_dilation(
            rng.random((height, width)) > 0.97, iterations=int(rng.integers(1, 4))
        )
        x = ink.astype(np.float32)
        assert stroke_width(x) == _stroke_width_by_scipy(x)
    assert stroke_width(np.zeros((9, 9), np.float32)) == 0.0


def test_the_ink_parts_are_scipys_connected_components():
    """digit_parts labels with OpenCV (8-connected, with boxes): the kept mask equals the union of the
    same components as scipy's labels, on a speckled picture with many parts."""
    from scipy import ndimage

    from app.imaging.ink import digit_parts

    rng = np.random.default_rng(2)
    a = ndimage.binary_dilation(rng.random((96, 128)) > 0.995, iterations=3).astype(np.float32)
    a *= rng.uniform(0.5, 1.0, a.shape).astype(np.float32)
    digit = digit_parts(a, 0.1)
    labels, _ = ndimage.label(a > 0.1, np.ones((3, 3), bool))
    kept = np.unique(labels[digit.mask])
    assert 0 not in kept and np.array_equal(np.isin(labels, kept), digit.mask)
    rows, cols = np.nonzero(digit.mask)
    assert digit.box == (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)


def test_otsus_histogram_is_np_histograms():
    """ink.histogram (Otsu's) bins as np.histogram does (float32 edges, values on an edge, one value
    alone), on 8-bit-like and continuous values."""
    from app.imaging.ink import histogram

    rng = np.random.default_rng(3)
    samples = [np.full(7, 0.25, np.float32)]
    for _ in range(500):
        n = int(rng.integers(1, 400))
        samples.append((rng.integers(0, 256, n) / 255 if rng.random() < 0.5 else rng.random(n)).astype(np.float32))
    for values in samples:
        counts, edges = histogram(values, 64)
        expected_counts, expected_edges = np.histogram(values, 64)
        assert edges.dtype == expected_edges.dtype
        np.testing.assert_array_equal(edges, expected_edges)
        np.testing.assert_array_equal(counts, expected_counts)


def test_the_ink_box_bounds_every_non_zero_pixel():
    """digit.ink_box: the rows and columns of the first and past the last non-zero pixel, of floats (a
    negative one counts) and of masks, a picture's edges included."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        x = np.zeros(tuple(rng.integers(1, 120, 2)), np.float32)
        ones = rng.integers(1, 6)
        x[rng.integers(0, x.shape[0], ones), rng.integers(0, x.shape[1], ones)] = rng.choice([-0.5, 1e-7, 1.0])
        rows, cols = np.nonzero(x)
        expected = (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1)
        assert digit.ink_box(x) == expected and digit.ink_box(x != 0) == expected
        top, bottom, left, right = expected
        assert digit.ink_box(x[:, ::-1]) == (top, bottom, x.shape[1] - right, x.shape[1] - left)  # a view


def test_the_robust_sigma_is_the_upper_median_of_the_absolute_deviations():
    """robust_sigma counts the zeros apart: its median is the sorted |r|'s middle (upper) value whether most
    of r is zero (a drawn picture's detail), some, none or all of it, in float32 and float64, of odd and even
    sizes, and 0 for no values."""
    from app.imaging.ink import robust_sigma

    rng = np.random.default_rng(7)
    for _ in range(400):
        n = int(rng.integers(1, 300))
        r = rng.normal(size=n).astype(rng.choice([np.float32, np.float64]))
        r[rng.random(n) < rng.choice([0.0, 0.3, 0.5, 0.9, 1.0])] = 0
        assert robust_sigma(r) == 1.4826 * float(np.sort(np.abs(r))[n // 2])
    assert robust_sigma(np.zeros((0, 4), np.float32)) == 0.0


def test_a_digit_of_one_part_is_that_part_found_without_otsus_threshold(monkeypatch):
    """One part above the floor is the digit whatever its core (it holds the strongest ink): digit_parts
    answers it without the hysteresis' threshold, as the general path answers the same part beside a speck."""
    from app.imaging import ink

    a = np.zeros((40, 60), np.float32)
    a[8:32, 10:14] = np.linspace(0.2, 1.0, 24, dtype=np.float32)[:, None]  # a stroke, faint at its top
    a[30:32, 10:30] = 0.6
    speckled = a.copy()
    speckled[2, 55] = 0.3  # a speck far off: two parts, the general path
    general = ink.digit_parts(speckled, 0.1)
    monkeypatch.setattr(ink, "otsu", lambda values, bins=64: pytest.fail("one part needs no threshold"))
    alone = ink.digit_parts(a, 0.1)
    assert np.array_equal(alone.mask, a > 0.1) and np.array_equal(alone.mask, general.mask)
    assert alone.box == general.box == (8, 10, 32, 30)
    assert (alone.contrast, alone.other_shapes) == (general.contrast, general.other_shapes) == (a.max(), 0)


def test_parts_of_equal_ink_are_taken_in_raster_order():
    """Two identical shapes far apart, the right one a row higher: scipy's raster order finds it first,
    OpenCV's scan of 2x2 blocks the left one; the digit is the one of raster order, as before OpenCV."""
    import cv2

    from app.imaging.ink import digit_parts

    a = np.zeros((40, 100), np.float32)
    a[11:31, 5:9] = 1.0
    a[10:30, 70:74] = 1.0  # the first ink in raster order
    _, labels = cv2.connectedComponents((a > 0.1).view(np.uint8), connectivity=8)
    assert labels[11, 5] == 1  # OpenCV's numbering differs from raster order here (what the test is about)
    digit = digit_parts(a, 0.1)
    assert digit.box == (10, 70, 30, 74) and digit.mask[:, :60].sum() == 0


def test_a_picture_of_ink_alone_has_one_solid_stroke():
    """Ink everywhere leaves the distance transform no background (OpenCV answers 1.8e19): the stroke
    is the picture's shorter side."""
    assert stroke_width(np.ones((30, 40), np.float32)) == 30.0


def test_resample_leaves_an_axis_of_the_same_size_as_it_is():
    x = np.random.default_rng(4).random((17, 23)).astype(np.float32)
    assert np.array_equal(resample.resize(x, (23, 17), "lanczos"), x)
    assert np.array_equal(resample.resize(x, (23, 9), "bicubic")[:, :], resample.weights(17, 9, "bicubic") @ x)


def test_a_symmetric_digit_is_shifted_as_exact_arithmetic_shifts_it():
    """A digit symmetric about its middle has its mass centre exactly between two pixels, (n - 1) / 2 of its
    n; fit_and_centre shifts it by floor(14 - (n - 1) / 2 + 0.5) = 15 - n / 2 whatever its values (numpy's
    float32 sums of its moments tip 16 of these 40 by a pixel)."""
    for seed in range(40):
        half = np.random.default_rng(seed).uniform(0.1, 1.0, (2, 10)).astype(np.float32)
        rows, cols = half[0], half[1][: 3 + seed % 7]
        x = np.outer(np.concatenate([rows, rows[::-1]]), np.concatenate([cols, cols[::-1]])).astype(np.float32)
        out = fit_and_centre(x)  # 20 rows: fitted at its own scale, its values kept
        top, left = np.flatnonzero(out.any(1))[0], np.flatnonzero(out.any(0))[0]
        assert (top, left) == (15 - x.shape[0] // 2, 15 - x.shape[1] // 2), seed


def test_erosion_and_dilation_on_the_ink_box_are_opencvs_on_the_whole_picture():
    """eroded and dilated compute on the ink's box (grown by the disk's reach) and equal OpenCV's on the
    whole picture, ink touching the picture's edges or not, boxes narrower than the disk among them."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        height, width = rng.integers(3, 60, 2)
        x = np.zeros((height, width), np.float32)
        top, left = rng.integers(0, height), rng.integers(0, width)
        bottom, right = rng.integers(top + 1, height + 1), rng.integers(left + 1, width + 1)
        box = (bottom - top, right - left)
        x[top:bottom, left:right] = rng.random(box) * (rng.random(box) > 0.3)
        radius = float(rng.uniform(0.5, 25))
        np.testing.assert_array_equal(digit.eroded(x, radius), cv2.erode(x, digit.disk(radius)))
        np.testing.assert_array_equal(digit.dilated(x, radius), cv2.dilate(x, digit.disk(radius)))


def test_a_dot_or_a_filled_square_is_not_thinned(monkeypatch):
    """A blob's stroke (a dot, scaled up to NORM_BOX; a filled square) would need a disk wider than
    MAX_THINNING: it is left as it is, with no erosion, whose cost grows with the disk's area."""
    radii = []
    original = digit.eroded
    monkeypatch.setattr(digit, "eroded", lambda x, radius: radii.append(radius) or original(x, radius))
    dot, square = np.zeros((28, 28), np.uint8), np.zeros((28, 28), np.uint8)
    dot[14, 14], square[4:24, 4:24] = 255, 255
    for picture in (dot, square):
        prepared = digit.prepare(Image.fromarray(picture), contract.IMAGE_SIZE, contract.INK_BOX)
        assert prepared.image.max() == 1.0
        assert prepared.warnings == [digit.BLOB]  # and the person is told why it reads as it does
    assert radii == []


def test_only_a_blob_is_warned_of(mnist_fixture):
    """A digit drawn small with a broad pen (a short bar, as wide as a third of its length) is a blob, warned
    of; no MNIST digit is, nor any of the real-world fixtures, the markers' among them."""
    small_one = np.zeros((400, 400), np.uint8)
    small_one[20:64, 20:48] = 255  # a 1 of 16 px drawn with the pad's 28 px pen: 44 x 28 px of ink
    assert digit.prepare(Image.fromarray(small_one), contract.IMAGE_SIZE, contract.INK_BOX).warnings == [digit.BLOB]
    images, _ = mnist_fixture
    for picture in [Image.fromarray(x) for x in images[:200]] + [
        Image.open(path) for path in sorted(REAL_WORLD.glob("*/*"))
    ]:
        assert digit.BLOB not in digit.prepare(picture, contract.IMAGE_SIZE, contract.INK_BOX).warnings
