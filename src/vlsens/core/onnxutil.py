"""ONNX files and ONNX Runtime sessions.

Every model vlsens writes is ``model.onnx`` plus one external data file ``model.onnx.data``
beside it, whatever its size (protobuf cannot hold more than 2 GB inline, and one layout for all
sizes keeps the DAG uniform). Only path-based ONNX APIs touch models that may exceed 2 GB.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DATA_SUFFIX = ".data"


def data_path(model_path: str | Path) -> Path:
    model_path = Path(model_path)
    return model_path.with_name(model_path.name + DATA_SUFFIX)


def model_bytes(model_path: str | Path) -> int:
    """A graph file and its external data file (where it has one), as shipped."""
    data = data_path(model_path)
    return Path(model_path).stat().st_size + (data.stat().st_size if data.is_file() else 0)


#: Tensors below this many bytes stay inline: ORT needs small shape/axes constants inline, and
#: every real weight matrix is far larger.
INLINE_MAX_BYTES = 1024


class DataFile:
    """An external data file written tensor by tensor through one file handle: each tensor's
    bytes go to the end of the file, the tensor is pointed there and its inline bytes dropped, so
    no weight is held twice. ``total`` (the bytes expected) places the tests' ``write`` fault
    point (:mod:`vlsens.core.faults`) half-way."""

    def __init__(self, path: str | Path, total: int = 0):
        self.path, self.total, self.written, self._fired = Path(path), total, 0, False

    def __enter__(self) -> "DataFile":
        self._f = open(self.path, "wb")
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def add(self, tensor, chunks: Iterable[bytes]) -> None:
        """Write ``chunks`` as ``tensor``'s data and point the tensor at them."""
        from vlsens.core import faults

        start = self.written
        for c in chunks:
            self._f.write(c)
            self.written += len(c)
        tensor.ClearField("raw_data")
        set_external_data_(tensor, self.path.name, start, self.written - start)
        if not self._fired and self.total and self.written * 2 >= self.total:
            self._fired = True
            self._f.flush()
            faults.point("write")  # tests: killed with half of a model's data on disk

    def move_out(self, tensor) -> bool:
        """Move an inline tensor of :data:`INLINE_MAX_BYTES` or more into the file."""
        if is_large_inline(tensor):
            self.add(tensor, [tensor.raw_data])
            return True
        return False


def is_large_inline(tensor) -> bool:
    import sys

    return tensor.HasField("raw_data") and sys.getsizeof(tensor.raw_data) >= INLINE_MAX_BYTES


def external_extents(model, base: str | Path) -> dict[Path, list[tuple[int, int]]]:
    """``{data file: [(offset, length), ...]}`` of every tensor of ``model`` (a ModelProto loaded
    without weights) stored outside the graph file, locations resolved against ``base``."""
    out: dict[Path, list[tuple[int, int]]] = {}
    for t in _external_tensors(model):
        path, offset, length = _external_range(t, Path(base))
        out.setdefault(path, []).append((offset, length))
    return out


def check_compact(model_path: str | Path, model=None) -> int:
    """Raise :class:`~vlsens.core.errors.ArtifactError` unless the model's own data file
    (``<model>.data``) holds exactly the bytes its tensors reference: the union of their extents
    covers the file from its first to its last byte (no unreferenced bytes, e.g. an earlier model
    appended to by a writer that does not truncate), and no tensor of any data file it reads
    reaches past that file's end. Reads only the graph (``model``: it, already loaded). Returns
    the data file's size."""
    import onnx

    from vlsens.core.errors import ArtifactError

    model_path = Path(model_path)
    if model is None:
        model = onnx.load(str(model_path), load_external_data=False)
    own = data_path(model_path)
    extents = external_extents(model, model_path.parent)
    for path, spans in extents.items():
        size = path.stat().st_size if path.exists() else -1
        end = max(o + n for o, n in spans)
        if end > size:
            raise ArtifactError(f"{model_path}: a tensor reaches byte {end} of {path}, which has {max(size, 0)} bytes; "
                                "the model is incomplete.")
    size = own.stat().st_size if own.exists() else 0
    covered, reach = 0, 0
    for o, n in sorted(extents.get(own, [])):
        if o + n > reach:
            covered += o + n - max(o, reach)
            reach = o + n
    if covered != size:
        raise ArtifactError(f"{own}: {size - covered} of its {size} bytes are referenced by no tensor of {model_path} "
                            "(a writer appended to an existing data file, or left padding); vlsens writes every data "
                            "file compact. Re-run the job that wrote it.")
    return size


def save_with_external_data(model, dst: str | Path) -> Path:
    """Save a ModelProto (external data already loaded into it) as ``dst`` + ``dst.data``.

    Initializers of at least :data:`INLINE_MAX_BYTES` go to the data file (:class:`DataFile`).
    The graph file is written after its data file. The data file always exists afterwards (empty
    only for a model without any large tensor).
    """
    import onnx
    from onnx.external_data_helper import _get_initializer_tensors

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    big = [t for t in _get_initializer_tensors(model) if is_large_inline(t)]
    with DataFile(data_path(dst), total=sum(len(t.raw_data) for t in big)) as out:
        for t in big:
            out.move_out(t)
    onnx.save_model(model, str(dst))
    check_compact(dst, model)
    return dst


def _external_range(tensor, base: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor whose location is relative to ``base``."""
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    path = base / info.location
    offset = int(info.offset or 0)
    length = int(info.length) if info.length is not None else path.stat().st_size - offset
    return path, offset, length


def _inline(tensor, base: Path) -> None:
    """Read an external tensor's bytes into the proto."""
    import onnx

    path, offset, length = _external_range(tensor, base)
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = raw


def _chunks(path: Path, offset: int, length: int, size: int = 64 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            buf = f.read(min(size, left))
            if not buf:
                raise ValueError(f"{path}: ends {left} bytes short of a tensor's data")
            yield buf
            left -= len(buf)


def resave(src: str | Path, dst: str | Path) -> Path:
    """Re-save ``src`` (whatever external data layout it has: the legacy exporter writes one file
    per tensor above 2 GB) in vlsens' layout, one tensor in memory at a time: external tensors
    are copied from their files in 64 MB chunks, inline ones of :data:`INLINE_MAX_BYTES` or more
    are moved out, small external ones and Constant values come back inline. Peak memory: the
    graph without weights plus one chunk."""
    import sys

    import onnx
    from onnx.external_data_helper import _get_attribute_tensors, _get_initializer_tensors, uses_external_data

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    dst.parent.mkdir(parents=True, exist_ok=True)
    for t in _get_attribute_tensors(model):  # Constant values the exporter wrote out: back inline
        if uses_external_data(t):
            _inline(t, src.parent)
    with DataFile(data_path(dst)) as out:
        for t in _get_initializer_tensors(model):
            if not uses_external_data(t):
                out.move_out(t)
                continue
            path, offset, length = _external_range(t, src.parent)
            if sys.getsizeof(b"") + length < INLINE_MAX_BYTES:  # small: inline, as save_with_external_data
                _inline(t, src.parent)
            else:
                out.add(t, _chunks(path, offset, length))
    onnx.save_model(model, str(dst))
    check_compact(dst, model)
    return dst


def tensor_array(tensor, weights_dir: str | Path | None = None, dtype=None) -> np.ndarray:
    """A tensor's values: from the proto, or memory-mapped from its external data file (as
    ``dtype`` when given: the type the bytes were written in)."""
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if uses_external_data(tensor) and not tensor.HasField("raw_data"):
        info = ExternalDataInfo(tensor)
        dtype = dtype or helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
        if count == 0:
            return np.zeros(tuple(tensor.dims), dtype=dtype)
        return np.memmap(Path(weights_dir) / info.location, dtype=dtype, mode="r", offset=int(info.offset or 0),
                         shape=tuple(tensor.dims) or (1,))
    return numpy_helper.to_array(tensor)


def save_streamed(model, weights_dir: str | Path, dst: str | Path, read_as: dict | None = None,
                  convert=None) -> Path:
    """Write ``model`` whose large initializers still point at a data file in ``weights_dir``
    (loaded without its weights, then changed): every such initializer is read from there (as
    ``read_as[name]``'s dtype where given: the type its bytes were written in), passed through
    ``convert(tensor, array)`` when given, and written to ``dst.data``, one tensor in memory at a
    time; the others move out as they are. Checked compact (:func:`check_compact`)."""
    import onnx
    from onnx import helper
    from onnx.external_data_helper import _get_initializer_tensors, uses_external_data

    dst = Path(dst)
    read_as = read_as or {}
    tensors = list(_get_initializer_tensors(model))
    lazy = {t.name for t in tensors if uses_external_data(t) and not t.HasField("raw_data")}
    total = sum(int(np.prod(t.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
                for t in tensors if t.name in lazy)
    with DataFile(data_path(dst), total) as out:
        for t in tensors:
            if t.name not in lazy:
                out.move_out(t)
                continue
            arr = tensor_array(t, weights_dir, read_as.get(t.name))
            if convert is not None:
                arr = convert(t, arr)
            buf = np.ascontiguousarray(arr).tobytes()
            del arr
            out.add(t, [buf])
            del buf
    onnx.save_model(model, str(dst))
    check_compact(dst, model)
    return dst


def set_external_data_(tensor, location: str, offset: int, length: int) -> None:
    """Point ``tensor`` (which holds no bytes) at ``location`` [offset, offset + length)."""
    from onnx import TensorProto

    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = tensor.external_data.add()
        e.key, e.value = k, v


def copy_model(src: str | Path, dst: str | Path, model=None) -> Path:
    """Copy a model saved in vlsens' layout to ``dst`` + ``dst.data`` without loading its weights
    (the data file is copied as bytes; only the small graph file is rewritten). ``model``: the
    graph of ``src`` (loaded without weights), already edited by the caller, written instead."""
    import onnx

    from vlsens.core.fsutil import copy_file

    src, dst = Path(src), Path(dst)
    if model is None:
        model = onnx.load(str(src), load_external_data=False)
    old, new = data_path(src).name, data_path(dst).name
    for t in _external_tensors(model):
        for entry in t.external_data:
            if entry.key == "location":
                if entry.value != old:
                    raise ValueError(f"{src}: tensor {t.name} lives in '{entry.value}', not in '{old}'")
                entry.value = new
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_file(data_path(src), data_path(dst))
    onnx.save_model(model, str(dst))
    check_compact(dst, model)
    return dst


def _external_tensors(model):
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


#: Ops that ONNX Runtime registers in the default ONNX domain although ONNX has no such op
#: (onnxruntime-genai's model builder writes them).
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def check_model(path: str | Path) -> None:
    """The ONNX checker, path-based (works above 2 GB). A graph with one of
    :data:`ORT_DEFAULT_DOMAIN_OPS` is checked (weights not loaded) with those nodes moved to
    ORT's own domain, so every other node is still checked against the ONNX spec."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    own = [n for n in model.graph.node if n.domain in ("", "ai.onnx") and n.op_type in ORT_DEFAULT_DOMAIN_OPS]
    if not own:
        onnx.checker.check_model(str(path))
        return
    for n in own:
        n.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    tmp = Path(path).parent / f".check-{os.getpid()}-{Path(path).name}"  # beside it: the data file resolves
    try:
        onnx.save_model(model, str(tmp))
        onnx.checker.check_model(str(tmp))
    finally:
        tmp.unlink(missing_ok=True)


def available_providers(device: str = "auto") -> list[str]:
    """ORT execution providers for ``device`` (auto: CUDA when onnxruntime-gpu sees a GPU)."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in have:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "cuda":
        raise RuntimeError(
            "device: cuda was requested but onnxruntime has no CUDAExecutionProvider "
            f"(available: {have}); install the 'gpu' extra (onnxruntime-gpu)."
        )
    return ["CPUExecutionProvider"]


def make_session(path, threads: int = 0, device: str = "auto",
                 providers: Sequence[str] | None = None, basic: bool = False, lean: bool = False,
                 data_dir: str | Path | None = None):
    """An InferenceSession of a graph file ``path``, or of a ModelProto (a graph changed in memory)
    whose external data files lie in ``data_dir`` (read from there as from the file's folder: the
    same memory); ``threads`` = 0 lets ORT choose. ``basic``: basic graph optimizations
    only (Q/DQ stay fake quantization, not fused into integer kernels: the sensitivity engine's
    arithmetic), else ORT's default level. ``lean``: for analysis passes that run a model once:
    basic optimizations (constants folded once), no weight prepacking (a second copy of every
    MatMul/Conv weight), and priority-based execution order (with the default order, reductions
    appended to a graph keep every intermediate they read alive: 9.2 GB instead of 2.9 for the
    dynamic 3B vision tower's FP16 range analysis)."""
    import onnxruntime as ort

    from vlsens.core.device import NO_SPIN, passive

    so = ort.SessionOptions()
    if basic:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if lean:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.add_session_config_entry("session.disable_prepacking", "1")
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if passive():
        for k, v in NO_SPIN.items():
            so.add_session_config_entry(k, v)
    so.log_severity_level = 3
    providers = list(providers or available_providers(device))
    if isinstance(path, (str, Path)):
        return ort.InferenceSession(str(path), sess_options=so, providers=providers)
    if data_dir is None:
        raise ValueError("make_session: a ModelProto needs data_dir, the folder of its external data files")
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(data_dir))
    return ort.InferenceSession(path.SerializeToString(), sess_options=so, providers=providers)


def input_batch(model) -> tuple[str, int | None]:
    """Name and fixed batch size (the static first dimension; None when dynamic) of the first
    input of a model: a path, a ModelProto or an InferenceSession."""
    import onnx

    if hasattr(model, "get_inputs"):  # a session
        inp = model.get_inputs()[0]
        d0 = inp.shape[0] if inp.shape else None
        return inp.name, (d0 if isinstance(d0, int) and d0 > 0 else None)
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    inp = m.graph.input[0]
    dims = inp.type.tensor_type.shape.dim
    d0 = dims[0] if len(dims) else None
    return inp.name, (d0.dim_value if d0 is not None and d0.HasField("dim_value") and d0.dim_value > 0 else None)


def untie_identity_initializers(model) -> int:
    """Replace ``Identity(initializer)`` nodes by initializers of their own (in place).

    The TorchScript exporter deduplicates identical weights (e.g. equal bias vectors) and feeds
    them to many nodes through Identity nodes. Per-node transforms (FP16 fallback, per-op
    quantization) need each node to own its weights. Returns the number of nodes removed.
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    graph_outputs = {o.name for o in model.graph.output}
    removed = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits and node.output[0] not in graph_outputs:
            src = inits[node.input[0]]
            if src.data_location == src.EXTERNAL and not src.HasField("raw_data"):
                own = model.graph.initializer.add()  # weights not loaded: the copy points at the same bytes
                own.CopyFrom(src)
                own.name = node.output[0]
            else:
                arr = numpy_helper.to_array(src)
                model.graph.initializer.append(numpy_helper.from_array(arr, name=node.output[0]))
            removed.append(node)
    for node in removed:
        model.graph.node.remove(node)
    names = {n.output[0] for n in removed}
    for vi in [v for v in model.graph.value_info if v.name in names]:
        model.graph.value_info.remove(vi)
    if removed:
        used = {i for n in model.graph.node for i in n.input} | graph_outputs
        for init in [i for i in model.graph.initializer if i.name not in used]:
            model.graph.initializer.remove(init)
    return len(removed)
