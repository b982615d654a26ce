"""The inference engine: ONNX Runtime sessions for CapsNet and its decoder, each behind a batcher.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829

Sessions are created once (the app's lifespan), on the providers of the settings that this
onnxruntime build has and this host can run (CUDA only where the driver reports a device, probed
before onnxruntime's loader gets to log its errors); the providers really in use are
`session.get_providers()` (ORT still falls back to CPU when CUDA cannot start) and that is what
gets logged and shown. A warm-up run at
batch 1 and max_batch precedes readiness (cuDNN picks its conv algorithms on first sight of a
shape; HEURISTIC search keeps that short).
"""
import ctypes
import hashlib
import json
import logging
import threading
from typing import Any

import numpy as np
import onnxruntime as ort

from app.batcher import DynamicBatcher
from app.metrics import EngineMetrics
from app.settings import Settings
from model import contract

log = logging.getLogger(__name__)

# use_tf32 0: with TF32 convolutions and matmuls (ORT's default on Ampere and later) the CUDA outputs
# left the CPU's by up to 1.2e-3 (reconstruction) and 1.2e-4 (lengths) on an H100; in fp32, 2.1e-6
# (benchmarks/provider_parity.py, 1,000 test images), at no measurable cost for a model this small.
PROVIDER_OPTIONS = {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0"}}
REQUIRED_OUTPUTS = (contract.LENGTHS, contract.CAPSULES, contract.ROUTING, contract.RECONSTRUCTION)
Outputs = dict[str, np.ndarray]  # contract output name -> array


def routing_maps(routing: np.ndarray, vote_lengths: np.ndarray | None = None) -> np.ndarray:
    """Per-class 6x6 maps of where the routing sent each digit's evidence from.

    map_j(row, col) = Σ over the 32 primary types t of c_ij · ||u_hat_j|i||, i = t*36 + row*6 + col
    (contract's capsule index), with c_ij the final coupling coefficients of Procedure 1 and u_hat
    the prediction vectors of Eq. 2. Without vote lengths (an export older than the contract's
    `vote_lengths` output) the map is the mean coupling over the types instead.

    Args:
        routing: c_ij, (1152, 10).
        vote_lengths: ||u_hat_j|i||, (1152, 10), or None.
    Returns:
        (10, 6, 6) float32.
    """
    g, t = contract.PRIMARY_GRID, contract.PRIMARY_TYPES
    if vote_lengths is None:
        maps = routing.reshape(t, g, g, -1).mean(axis=0)  # (6, 6, 10)
    else:
        maps = (routing * vote_lengths).reshape(t, g, g, -1).sum(axis=0)  # (6, 6, 10)
    return np.ascontiguousarray(maps.transpose(2, 0, 1), dtype=np.float32)  # (10, 6, 6)


def cuda_devices() -> int:
    """CUDA devices the NVIDIA driver reports; 0 without a driver or a GPU.

    cuInit and cuDeviceGetCount from libcuda through ctypes: a probe that needs no CUDA toolkit and
    runs before onnxruntime's CUDA loader, which logs an ERROR for every library it cannot load.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def select_providers(requested: list[str], explicit: bool = True) -> list[Any]:
    """The requested providers this onnxruntime build has and this host can run, in order, with options.

    CUDA is left out without asking onnxruntime when no CUDA device is usable (cuda_devices): one
    WARNING if the settings asked for it explicitly, one INFO line if it came from the defaults.
    """
    available = ort.get_available_providers()
    chosen = [p for p in requested if p in available]
    skipped = [p for p in requested if p not in available]
    if skipped:
        log.warning("execution providers %s are not in this onnxruntime build; skipped", skipped)
    if "CUDAExecutionProvider" in chosen and cuda_devices() == 0:
        chosen.remove("CUDAExecutionProvider")
        (log.warning if explicit else log.info)(
            "CUDAExecutionProvider left out: no usable CUDA device here (no NVIDIA driver or no GPU)")
    if not chosen:
        raise RuntimeError(f"none of the execution providers {requested} can run here; this onnxruntime "
                           f"has {available}, and {cuda_devices()} CUDA device(s) are usable")
    if "CUDAExecutionProvider" in chosen and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA/cuDNN from the pip `nvidia-*` wheels; the driver comes from the host
    return [(p, PROVIDER_OPTIONS[p]) if p in PROVIDER_OPTIONS else p for p in chosen]


def choose_precision(setting: str, card: dict, on_cpu: bool, int8_present: bool) -> str:
    """The graph to run: the setting when it names one; for auto, int8 on a CPU where the model's card
    ships the int8 graph (training/quantize.py measured it as accurate to 0.05 points, and faster)
    and the folder has it."""
    if setting != "auto":
        return setting
    return "int8" if on_cpu and int8_present and card.get("int8", {}).get("shipped") else "fp32"


class Engine:
    """CapsNet and decoder sessions with their dynamic batchers; `ready` after warm-up.

    Args:
        settings: model_dir, providers, threads and batching limits.
        metrics: where batch sizes and inference times go (None: nowhere).
    """

    def __init__(self, settings: Settings, metrics: EngineMetrics | None = None):
        self.settings = settings
        self.card = json.loads((settings.model_dir / contract.MODEL_CARD).read_text())
        self._providers = select_providers(settings.providers, explicit="providers" in settings.model_fields_set)
        first = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        self.precision = choose_precision(settings.precision, self.card, first == "CPUExecutionProvider",
                                          (settings.model_dir / contract.CAPSNET_INT8_ONNX).is_file())
        self.capsnet_file = contract.CAPSNET_INT8_ONNX if self.precision == "int8" else contract.CAPSNET_ONNX
        self.capsnet = self._session(self.capsnet_file)
        self._version = hashlib.sha256((settings.model_dir / self.capsnet_file).read_bytes()).hexdigest()[:12]
        self.decoder = self._session(contract.DECODER_ONNX)
        self.output_names = self._check_contract()
        self.providers = self.capsnet.get_providers()
        log.info("model %s %s (%s) loaded from %s; execution providers in use: %s", self.name, self.version,
                 self.precision, settings.model_dir / self.capsnet_file, self.providers)
        if self.providers[0] != first:  # onnxruntime could not start it and fell back
            log.warning("%s was asked for first but the session runs on %s", first, self.providers[0])
        wait = settings.max_wait_ms / 1000
        deadline = settings.request_deadline_s
        self._capsnet_batcher = DynamicBatcher(self._run_capsnet, "capsnet", settings.max_batch, wait,
                                               settings.max_queue, metrics, deadline)
        self._decoder_batcher = DynamicBatcher(self._run_decoder, "decoder", settings.max_reconstruct_batch,
                                               wait, settings.max_queue, metrics, deadline)
        self._warmer = threading.Thread(target=self._warm_up_logged, name="warm-up", daemon=True)
        self.ready = False
        self.state = "loaded, not warmed up"

    @property
    def name(self) -> str:
        return self.card["name"]

    @property
    def version(self) -> str:
        """First 12 hex digits of the served graph's sha256 (the card's `version` for capsnet.onnx)."""
        return self._version

    @property
    def routing_weighting(self) -> str:
        """How routing_maps weighs c_ij: by ||u_hat|| when the graph outputs it (see routing_maps)."""
        return "vote_length" if contract.VOTE_LENGTHS in self.output_names else "coupling"

    def _session(self, filename: str) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.settings.intra_op_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", str(int(self.settings.intra_op_spinning)))
        return ort.InferenceSession(str(self.settings.model_dir / filename), options, providers=self._providers)

    def _check_contract(self) -> list[str]:
        """The capsnet outputs to fetch; raises if either graph does not follow model/contract.py."""
        outputs = [o.name for o in self.capsnet.get_outputs()]
        missing = [name for name in REQUIRED_OUTPUTS if name not in outputs]
        inputs = [i.name for i in self.capsnet.get_inputs()]
        decoder = ([i.name for i in self.decoder.get_inputs()], [o.name for o in self.decoder.get_outputs()])
        if missing or inputs != list(contract.CAPSNET_INPUTS) or decoder != (
                list(contract.DECODER_INPUTS), list(contract.DECODER_OUTPUTS)):
            raise RuntimeError(f"the ONNX files in {self.settings.model_dir} do not follow model/contract.py: "
                               f"capsnet {inputs} -> {outputs}, decoder {decoder[0]} -> {decoder[1]}")
        return [name for name in contract.CAPSNET_OUTPUTS if name in outputs]

    # --- running ---------------------------------------------------------------------------------
    def _run_capsnet(self, images: np.ndarray) -> list[np.ndarray]:
        return self.capsnet.run(self.output_names, {contract.IMAGE: images})

    def _run_decoder(self, capsules: np.ndarray) -> list[np.ndarray]:
        return self.decoder.run(list(contract.DECODER_OUTPUTS), {contract.CAPSULES: capsules})

    async def predict(self, image: np.ndarray) -> Outputs:
        """One (28, 28) float32 image in [0, 1] -> its outputs, batched with concurrent requests."""
        outputs = await self._capsnet_batcher.submit(image[None, None].astype(np.float32))
        return {name: out[0] for name, out in zip(self.output_names, outputs)}

    async def reconstruct(self, digits: np.ndarray, capsules: np.ndarray) -> np.ndarray:
        """Digits (n,) and their 16D capsules (n, 16) -> decoder images (n, 28, 28).

        The decoder's input is the 10 digit capsules with all but the chosen one zeroed (section 4.1).
        """
        masked = np.zeros((len(digits), contract.NUM_CLASSES, contract.CAPSULE_DIM), np.float32)
        masked[np.arange(len(digits)), digits] = capsules
        (reconstruction,) = await self._decoder_batcher.submit(masked)
        return reconstruction

    def outputs_of(self, session: ort.InferenceSession) -> list[str]:
        """The output names infer() returns for one of the engine's two sessions."""
        return self.output_names if session is self.capsnet else list(contract.DECODER_OUTPUTS)

    async def infer(self, session: ort.InferenceSession, x: np.ndarray) -> Outputs:
        """Raw graph tensors through that graph's batcher (the Open Inference Protocol's infer): the
        CapsNet's images (n, 1, H, W) or the decoder's masked capsules (n, 10, 16) -> its outputs."""
        batcher = self._capsnet_batcher if session is self.capsnet else self._decoder_batcher
        return dict(zip(self.outputs_of(session), await batcher.submit(x)))

    # --- life cycle ------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Run both graphs at batch 1 and at their largest batch, then mark the engine ready."""
        size = contract.IMAGE_SIZE
        for n in sorted({1, self.settings.max_batch}):
            self._run_capsnet(np.zeros((n, 1, size, size), np.float32))
        for n in sorted({1, self.settings.max_reconstruct_batch}):
            self._run_decoder(np.zeros((n, contract.NUM_CLASSES, contract.CAPSULE_DIM), np.float32))
        self.ready, self.state = True, "ready"
        log.info("warm-up done; ready on %s", self.providers)

    def start(self) -> None:
        """Start the batchers and, unless already warm, warm up on a background thread (GET /ready
        says when done)."""
        self._capsnet_batcher.start()
        self._decoder_batcher.start()
        if not self.ready:
            self.state = "warming up"
            self._warmer.start()

    def _warm_up_logged(self) -> None:
        try:
            self.warm_up()
        except Exception as exc:
            log.exception("warm-up failed")
            self.state = f"warm-up failed: {exc}"

    def close(self) -> None:
        if self._warmer.is_alive():
            self._warmer.join()  # a session must not be torn down while it runs
        self._capsnet_batcher.close()
        self._decoder_batcher.close()
