"""The inference engine: ONNX Runtime sessions for CapsNet and its decoder, each behind a batcher.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829

The engine keeps the sessions and batches the runs; what an answer makes of the outputs is app/answer.py's.
Sessions are created once (the app's lifespan), on the providers of the settings that this onnxruntime
build has and this host can run (CUDA only where the driver reports a device, probed before onnxruntime's
loader gets to log its errors); the providers really in use are `session.get_providers()` (ORT still falls
back to CPU when CUDA cannot start) and that is what gets logged and shown. A warm-up run at batch 1 and
max_batch precedes readiness (cuDNN picks its conv algorithms on first sight of a shape; HEURISTIC search
keeps that short).
"""

import hashlib
import json
import logging
import threading
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from app import memory
from app.batcher import DynamicBatcher
from app.conv_matmul import conv_as_matmul
from app.cores import Board, this_worker
from app.cuda_graph import CudaGraph, fold
from app.metrics import EngineMetrics
from app.pruning import prune
from app.settings import Settings, cuda_devices
from model import contract
from model.card import read_serving

log = logging.getLogger(__name__)

# use_tf32 0: TF32 convolutions and matmuls (ORT's default on Ampere and later) take the CUDA outputs
# orders of magnitude further from the CPU's than fp32 does (benchmarks/provider_parity.py measures both),
# and fp32 costs a model this small no measurable time.
PROVIDER_OPTIONS = {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0"}}
CUDA_GRAPH_WARM_RUNS = 3  # ONNX Runtime runs a CUDA-graph session plainly before it captures, then replays
Outputs = dict[str, np.ndarray]  # contract output name -> array


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
            "CUDAExecutionProvider left out: no usable CUDA device here (no NVIDIA driver or no GPU)"
        )
    if not chosen:
        raise RuntimeError(
            f"none of the execution providers {requested} can run here; this onnxruntime "
            f"has {available}, and {cuda_devices()} CUDA device(s) are usable"
        )
    if "CUDAExecutionProvider" in chosen and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA/cuDNN from the pip `nvidia-*` wheels; the driver comes from the host
    return with_options(chosen)


def with_options(providers: list[str]) -> list[Any]:
    """Providers as a session takes them, each with this service's options for it (PROVIDER_OPTIONS)."""
    return [(p, PROVIDER_OPTIONS[p]) if p in PROVIDER_OPTIONS else p for p in providers]


def choose_precision(
    setting: Literal["auto", "fp32", "int8"], card: dict, on_cpu: bool, int8_present: bool
) -> Literal["fp32", "int8"]:
    """The graph to run: the setting when it names one; for auto, int8 on a CPU where the model's card
    ships the int8 graph (training/quantize.py measured it as accurate to 0.05 points, and faster)
    and the folder has it."""
    if setting != "auto":
        return setting
    return "int8" if on_cpu and int8_present and card.get("int8", {}).get("shipped") else "fp32"


class Engine:
    """One model folder's CapsNet and decoder sessions with their dynamic batchers; `ready` after warm-up.

    Every size comes from the folder's card (model/card.py), checked against the graphs' own inputs and
    outputs; a folder that does not agree raises a ValueError naming it.

    Args:
        name: what clients call the model (?model=NAME, the Open Inference Protocol's model name).
        directory: holds capsnet.onnx, decoder.onnx, capsnet.json (and capsnet.int8.onnx).
        settings: providers, threads and batching limits.
        metrics: where batch sizes and inference times go (None: nowhere).
        board: this worker's slot on the workers' board (app/cores.py), for the default model on several cores:
            a single image of the server's only request then runs on `capsnet_wide`, every core.
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        settings: Settings,
        metrics: EngineMetrics | None = None,
        board: Board | None = None,
    ):
        self.name, self.directory, self.settings, self.metrics = name, Path(directory), settings, metrics
        self.board = board
        self.card = json.loads((self.directory / contract.MODEL_CARD).read_text())
        self.spec = read_serving(self.card, f"{self.directory} (model {name})")
        self._providers = select_providers(settings.providers, explicit="providers" in settings.model_fields_set)
        first = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        self._on_cpu = first == "CPUExecutionProvider"
        self.precision = choose_precision(
            settings.precision,
            self.card,
            self._on_cpu,
            (self.directory / contract.CAPSNET_INT8_ONNX).is_file(),
        )
        self.capsnet_file = contract.CAPSNET_INT8_ONNX if self.precision == "int8" else contract.CAPSNET_ONNX
        self.capsnet = self._session(self.capsnet_file)
        self.lean_names = list(contract.CAPSULE_OUTPUTS)  # what a request for the class capsules alone fetches
        # A request alone on the server runs on every core (app/cores.py), its threads spinning within the
        # run (threads that sleep between its parallel parts wait to be woken for each) and stopping at its end,
        # on the graph folded for its one image (fold: its shape arithmetic and constants computed once, here)
        wide = settings.lone_request_threads if board is not None and self._on_cpu else 0
        lone = self._lone_graph() if wide else None
        self.capsnet_wide = self._session(lone, wide) if lone is not None else None
        # and one whose answer reads only the class capsules, on that graph pruned to them (app/pruning.py)
        self.capsnet_lean = self._lean_session(lone, wide) if lone is not None else None
        self._version = hashlib.sha256((self.directory / self.capsnet_file).read_bytes()).hexdigest()[:12]
        self.decoder = self._session(contract.DECODER_ONNX)
        self.iteration_names = self._check_contract()  # CAPSNET_ITERATION_OUTPUTS, or none (em, qp, older graphs)
        self.output_names = list(contract.CAPSNET_OUTPUTS)  # what a plain request fetches
        # a single image of a plain request on CUDA, replayed as a CUDA graph (Settings.cuda_graph)
        self.capsnet_graph = self._cuda_graph() if settings.cuda_graph else None
        self.every_output = self.output_names + self.iteration_names
        # images per session.run: bounded on the CPU (app/memory.py), the whole batch on a GPU
        self.run_rows = memory.rows_per_run(self.spec.primary_capsules.count) if self._on_cpu else None
        self.providers = self.capsnet.get_providers()
        log.info(
            "model %s %s (%s) loaded from %s; execution providers in use: %s",
            name,
            self.version,
            self.precision,
            self.directory / self.capsnet_file,
            self.providers,
        )
        if self.providers[0] != first:  # onnxruntime could not start it and fell back
            log.warning("%s was asked for first but the session runs on %s", first, self.providers[0])
        wait = settings.max_wait_ms / 1000
        deadline = settings.request_deadline_s
        batching = (settings.max_batch, wait, settings.max_queue, metrics, deadline)
        self._capsnet_batcher = DynamicBatcher(
            partial(self._run_capsnet, names=self.output_names),
            name,
            *batching,
            on_start=self._capture_cuda_graph if self.capsnet_graph is not None else None,
        )
        # Requests for the iterations (N x R x primary x classes) are batched apart, on the same session,
        # so that a plain request never fetches them
        self._iterations_batcher = (
            DynamicBatcher(partial(self._run_capsnet, names=self.every_output), f"{name}_iterations", *batching)
            if self.iteration_names
            else None
        )
        # Requests for the class capsules alone, while alone on the server, are batched apart too, so that
        # their runs fetch only those: a single image then runs on capsnet_lean
        self._lean_batcher = (
            DynamicBatcher(partial(self._run_capsnet, names=self.lean_names), f"{name}_lean", *batching)
            if self.capsnet_lean is not None
            else None
        )
        self._decoder_batcher = DynamicBatcher(
            self._run_decoder,
            f"{name}_decoder",
            settings.max_reconstruct_batch,
            wait,
            settings.max_queue,
            metrics,
            deadline,
        )
        self._batchers = [
            b
            for b in (self._capsnet_batcher, self._iterations_batcher, self._lean_batcher, self._decoder_batcher)
            if b is not None
        ]
        self._warmer = threading.Thread(target=self._warm_up_logged, name=f"warm-up-{name}", daemon=True)
        self.ready = False
        self.state = "loaded, not warmed up"

    @property
    def version(self) -> str:
        """First 12 hex digits of the served graph's sha256 (the card's `version` for capsnet.onnx)."""
        return self._version

    @property
    def size(self) -> int:
        """Side of the model's square input (and of its reconstructions)."""
        return self.spec.size

    def _lone_graph(self) -> str | bytes:
        """The graph of a lone request's image: the served one folded for one image (fold), or as it is where
        ONNX Runtime cannot fold it (logged)."""
        try:
            return fold(self.directory / self.capsnet_file, 1)
        except Exception as exc:  # the optimiser's, or its temporary folder's
            log.warning("model %s: a lone request runs the graph unfolded: %s", self.name, exc)
            return self.capsnet_file

    def _lean_session(self, graph: str | bytes, threads: int) -> ort.InferenceSession | None:
        """A lone request's session (on `threads`) of `graph` pruned to the class capsules' outputs, or None
        where onnx cannot prune it or ONNX Runtime cannot load what it made (logged): such a request then runs
        on the wide session."""
        try:
            whole = graph if isinstance(graph, bytes) else (self.directory / graph).read_bytes()
            return self._session(prune(whole, self.lean_names), threads)
        except Exception as exc:  # onnx's, reading a graph it does not know, or ONNX Runtime's
            log.warning("model %s: a lone request for the class capsules runs the whole graph: %s", self.name, exc)
            return None

    def _session(self, graph: str | bytes, wide: int = 0) -> ort.InferenceSession:
        """A session of `graph` (a file of the model's folder, or a serialized graph) on the settings' threads,
        or on `wide` threads that spin within a run and stop at its end (a lone request's, app/cores.py)."""
        options = ort.SessionOptions()
        # On the CPU, ONNX Runtime's warnings while it loads a graph are about its own rewriting (it cannot
        # constant-fold the exporter's CastLike nodes, which it inlines later), nothing a user can act on: at
        # debug only. On a GPU they also say which nodes run on the CPU, and they stay.
        options.log_severity_level = 3 if self._on_cpu and self.settings.log_level != "debug" else 2
        options.intra_op_num_threads = wide or self.settings.session_threads
        spinning = bool(wide) or self.settings.intra_op_spinning
        options.add_session_config_entry("session.intra_op.allow_spinning", str(int(spinning)))
        if wide:
            options.add_session_config_entry("session.force_spinning_stop", "1")
        if self._on_cpu:
            memory.configure(options, one_shape=bool(wide))  # the wide session runs a single image only
        model = graph if isinstance(graph, bytes) else str(self.directory / graph)
        return ort.InferenceSession(model, options, providers=self._providers)

    def _cuda_graph(self) -> CudaGraph | None:
        """The CUDA graph of a single image's run (captured by _capture_cuda_graph), or None (and why, logged)
        where there is none."""
        provider = self.capsnet.get_providers()[0]
        if provider != "CUDAExecutionProvider":
            log.debug("model %s runs on %s: no CUDA graph", self.name, provider)
            return None
        try:
            folded = fold(self.directory / self.capsnet_file, 1)
        except Exception as exc:  # the optimiser's, or its temporary folder's
            self._no_cuda_graph(exc)
            return None
        options = (provider, PROVIDER_OPTIONS[provider])
        try:  # PrimaryCaps' convolution a matrix product (app/conv_matmul.py)
            return CudaGraph(conv_as_matmul(folded), self.output_names, options)
        except Exception as exc:  # onnx cannot read a graph of the user's, or ONNX Runtime cannot take its rewrite
            log.warning(
                "model %s: its CUDA graph replays the folded graph, its convolutions as they are: %s", self.name, exc
            )
        try:
            return CudaGraph(folded, self.output_names, options)
        except Exception as exc:  # ONNX Runtime refuses a capture while a node runs on the CPU
            self._no_cuda_graph(exc)
            return None

    def _capture_cuda_graph(self) -> None:
        """On the CapsNet batcher's thread, as it starts: ONNX Runtime keeps a CUDA graph per thread, and captures
        it on a session's first runs, which nothing else may run on the GPU meanwhile (Engines.start)."""
        one = np.zeros((1, 1, self.size, self.size), np.float32)
        try:
            for _ in range(CUDA_GRAPH_WARM_RUNS):
                self.capsnet_graph.run(one)  # type: ignore[union-attr]  # on_start only when there is one
        except Exception as exc:
            self._no_cuda_graph(exc)

    def _no_cuda_graph(self, why: Exception) -> None:
        log.warning("model %s: no CUDA graph, single images run as batches do: %s", self.name, why)
        self.capsnet_graph = None

    def _check_contract(self) -> list[str]:
        """Raises if either graph does not follow model/contract.py (every output, vote_lengths included)
        with the card's sizes (input size, primary capsules, class capsules). The CapsNet graph may have
        CAPSNET_ITERATION_OUTPUTS (dynamic routing's), all or none, R being the card's routing iterations;
        returns those it has."""
        spec, n = self.spec, contract.BATCH
        s, p, c, d = spec.size, spec.primary_capsules.count, spec.class_capsules.count, spec.class_capsules.dim
        r = spec.routing.iterations
        want = {
            contract.IMAGE: [1, s, s],
            contract.LENGTHS: [c],
            contract.CAPSULES: [c, d],
            contract.ROUTING: [p, c],
            contract.RECONSTRUCTION: [s, s],
            contract.VOTE_LENGTHS: [p, c],
            contract.ROUTING_ITERATIONS: [r, p, c],
            contract.LOGIT_CHANGES: [r],
        }
        graphs = {
            "capsnet": (self.capsnet, list(contract.CAPSNET_INPUTS), contract.CAPSNET_OUTPUTS),
            "decoder": (self.decoder, list(contract.DECODER_INPUTS), contract.DECODER_OUTPUTS),
        }
        problems = []
        for graph, (session, inputs, required) in graphs.items():
            nodes = {node.name: node.shape for node in session.get_inputs() + session.get_outputs()}
            names = [node.name for node in session.get_inputs()]
            if names != inputs or any(name not in nodes for name in required):
                problems.append(
                    f"{graph} has {names} -> {[o.name for o in session.get_outputs()]}, the contract "
                    f"says {inputs} -> {list(required)}"
                )
                continue
            for name, shape in nodes.items():
                if name in want and list(shape[1:]) != want[name]:
                    problems.append(f"{graph}'s {name} is {[n, *shape[1:]]}, the card says {[n, *want[name]]}")
        outputs = {node.name for node in self.capsnet.get_outputs()}
        iterations = [name for name in contract.CAPSNET_ITERATION_OUTPUTS if name in outputs]
        if 0 < len(iterations) < len(contract.CAPSNET_ITERATION_OUTPUTS):
            problems.append(
                f"capsnet has {', '.join(iterations)} but not all of {', '.join(contract.CAPSNET_ITERATION_OUTPUTS)}"
            )
        if problems:
            raise ValueError(
                f"the ONNX files in {self.directory} (model {self.name}) do not match model/contract.py "
                f"and their card: {'; '.join(problems)}"
            )
        return iterations

    # --- running ---------------------------------------------------------------------------------
    def _run_capsnet(self, images: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """The graph's `names` outputs for images (n, 1, size, size), at most run_rows images a run; a single
        image of a plain request replayed as a CUDA graph (capsnet_graph), else, the server's only request, on
        every core (capsnet_wide; capsnet_lean for the class capsules alone)."""
        graph = self.capsnet_graph
        if graph is not None and len(images) == 1 and names == self.output_names and self.ready:  # its batcher's
            try:
                outputs = graph.run(images)
                if (metrics := self.metrics) is not None:
                    metrics.later(metrics.count, metrics.graph_replays, self.name)
                return outputs
            except Exception as exc:  # a replay that fails: plain runs from now on
                self._no_cuda_graph(exc)
        rows = self.run_rows or len(images)
        session, wide, board = self.capsnet, self.capsnet_wide, self.board
        if wide is not None and board is not None and len(images) == 1 and self.ready and board.alone():
            # not while warming up: a request then may be a test client's /ready
            session = self.capsnet_lean if names == self.lean_names and self.capsnet_lean is not None else wide
        outputs = memory.in_slices(lambda x: session.run(names, {contract.IMAGE: x}), images, rows)
        if session is not self.capsnet and (metrics := self.metrics) is not None:
            metrics.later(metrics.count, metrics.lone_runs, self.name)
        return outputs

    def _run_decoder(self, capsules: np.ndarray) -> list[np.ndarray]:
        return self.decoder.run(list(contract.DECODER_OUTPUTS), {contract.CAPSULES: capsules})

    def _capsnet_runner(self, iterations: bool, lean: bool = False) -> tuple[DynamicBatcher, list[str]]:
        """The CapsNet batcher for requests with or without the iteration outputs, or for a single image's class
        capsules alone (lean, while this request is alone on the server), and what it returns."""
        if lean and not iterations and self._lean_batcher is not None and self.board is not None and self.board.alone():
            return self._lean_batcher, self.lean_names
        if not iterations:
            return self._capsnet_batcher, self.output_names
        if self._iterations_batcher is None:
            raise ValueError(f"model {self.name}'s graph has no {', '.join(contract.CAPSNET_ITERATION_OUTPUTS)}")
        return self._iterations_batcher, self.every_output

    async def predict(self, image: np.ndarray, iterations: bool = False, lean: bool = False) -> Outputs:
        """One (size, size) float32 image in [0, 1] -> its outputs, batched with concurrent requests."""
        return (await self.predict_many(image[None], iterations, lean))[0]

    async def predict_many(self, images: np.ndarray, iterations: bool = False, lean: bool = False) -> list[Outputs]:
        """Images (k, size, size) float32 in [0, 1] -> their outputs, one batch with concurrent requests;
        with iterations, CAPSNET_ITERATION_OUTPUTS too (a ValueError when the graph has none); lean: the
        caller reads only the class capsules (contract.CAPSULE_OUTPUTS), which may be all that comes back."""
        batcher, names = self._capsnet_runner(iterations, lean and len(images) == 1)  # several: never on capsnet_lean
        outputs = await batcher.submit(images[:, None].astype(np.float32, copy=False))
        return [{name: out[k] for name, out in zip(names, outputs, strict=True)} for k in range(len(images))]

    async def reconstruct(self, classes: np.ndarray, capsules: np.ndarray) -> np.ndarray:
        """Classes (n,) and their 16D capsules (n, 16) -> decoder images (n, size, size).

        The decoder's input is the class capsules with all but the chosen one zeroed (section 4.1).
        """
        spec = self.spec.class_capsules
        masked = np.zeros((len(classes), spec.count, spec.dim), np.float32)
        masked[np.arange(len(classes)), classes] = capsules
        (reconstruction,) = await self._decoder_batcher.submit(masked)
        return reconstruction

    def outputs_of(self, session: ort.InferenceSession) -> list[str]:
        """The output names infer() can return for one of the engine's two sessions."""
        return self.every_output if session is self.capsnet else list(contract.DECODER_OUTPUTS)

    async def infer(self, session: ort.InferenceSession, x: np.ndarray, names: list[str]) -> Outputs:
        """Raw graph tensors through that graph's batcher (the Open Inference Protocol's infer): the
        CapsNet's images (n, 1, H, W) or the decoder's masked capsules (n, 10, 16) -> its outputs, `names`
        (of outputs_of) among them; the CapsNet's iteration outputs are fetched only when named."""
        if session is self.decoder:
            batcher, fetched = self._decoder_batcher, list(contract.DECODER_OUTPUTS)
        else:
            batcher, fetched = self._capsnet_runner(any(name in self.iteration_names for name in names))
        return dict(zip(fetched, await batcher.submit(x), strict=True))

    # --- life cycle ------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Run both graphs at batch 1 and at their largest batch (the lone request's sessions at batch 1), then
        mark the engine ready."""
        capsules = self.spec.class_capsules
        for n in sorted({1, self.settings.max_batch}):
            self._run_capsnet(np.zeros((n, 1, self.size, self.size), np.float32), self.every_output)
        one = np.zeros((1, 1, self.size, self.size), np.float32)
        if self.capsnet_wide is not None:
            self.capsnet_wide.run(self.every_output, {contract.IMAGE: one})
        if self.capsnet_lean is not None:
            self.capsnet_lean.run(self.lean_names, {contract.IMAGE: one})
        for n in sorted({1, self.settings.max_reconstruct_batch}):
            self._run_decoder(np.zeros((n, capsules.count, capsules.dim), np.float32))
        memory.release_freed_heap()
        self.ready, self.state = True, "ready"
        if self.metrics:
            self.metrics.model_ready.labels(self.name).set(1)
        replayed = "; a single image replays a CUDA graph" if self.capsnet_graph is not None else ""
        log.info("model %s: warm-up done; ready on %s%s", self.name, self.providers, replayed)

    def start_batchers(self) -> None:
        """Start the batchers (the CapsNet one captures the CUDA graph first, when there is one)."""
        for batcher in self._batchers:
            batcher.start()

    def start_warm_up(self) -> None:
        """Unless already warm, warm up on a background thread (GET /ready says when done)."""
        if not self.ready:
            self.state = "warming up"
            self._warmer.start()

    def thread_ids(self) -> list[int]:
        """The kernel's ids of the started batchers' threads, where this engine's runs happen."""
        return [b.native_id for b in self._batchers if b.native_id is not None]

    def _warm_up_logged(self) -> None:
        try:
            self.warm_up()
        except Exception as exc:
            log.exception("model %s: warm-up failed", self.name)
            self.state = f"warm-up failed: {exc}"

    def close(self) -> None:
        if self._warmer.is_alive():
            self._warmer.join()  # a session must not be torn down while it runs
        for batcher in self._batchers:
            batcher.close()


class ModelLoadError(RuntimeError):
    """A configured model cannot load or run; the message names it."""


class Engines:
    """Every served model's Engine by name, in the order of the settings; one of them the default.

    Args:
        settings: which models (settings.model_dirs) and the default one.
        metrics: shared by the engines.
    Raises:
        ModelLoadError naming the model, if one cannot load (or, from warm_up, run).
    """

    def __init__(self, settings: Settings, metrics: EngineMetrics | None = None):
        self.default = settings.default_model
        self.engines: dict[str, Engine] = {}
        board = this_worker()
        for name, directory in settings.model_dirs.items():
            try:
                # the board for the default model only: its engine holds one more session
                self.engines[name] = Engine(name, directory, settings, metrics, board if name == self.default else None)
            except Exception as exc:
                self.close()
                raise ModelLoadError(f"model {name} ({directory}): {exc}") from exc

    def __getitem__(self, name: str) -> Engine:
        return self.engines[name]

    def __iter__(self):
        return iter(self.engines.values())

    @property
    def names(self) -> list[str]:
        return list(self.engines)

    @property
    def ready(self) -> bool:
        return all(engine.ready for engine in self)

    @property
    def state(self) -> str:
        """What the models are doing, for a 503: every model not ready yet, with its state."""
        return "; ".join(f"{e.name}: {e.state}" for e in self if not e.ready) or "ready"

    def warm_up(self) -> None:
        """Warm every model up in turn; a failure names the model."""
        for engine in self:
            try:
                engine.warm_up()
            except Exception as exc:
                raise ModelLoadError(f"model {engine.name} ({engine.directory}): warm-up failed: {exc}") from exc

    def start(self) -> None:
        """Every engine's batchers, one engine after another, then the warm-ups of those not warm yet: a CUDA
        graph is captured as its batcher starts, while nothing else of this process runs on the GPU."""
        for engine in self:
            engine.start_batchers()
        for engine in self:
            engine.start_warm_up()

    def thread_ids(self) -> list[int]:
        """The kernel's ids of every started batcher's thread."""
        return [tid for engine in self for tid in engine.thread_ids()]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
