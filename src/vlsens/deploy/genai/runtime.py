"""ONNX-only inference: the pieces a user imports in their application.

:class:`Chat` is a deploy folder (``results/<model>/deploy/<precision>/``) run by onnxruntime-genai:
its own image preprocessing, vision, embedding and KV-cache decoder sessions, chat template and
search -- a thin convenience layer, so that there is one runtime and it is the one the folders are
proven with (:mod:`vlsens.deploy`)::

    from vlsens.deploy.genai.runtime import Chat
    chat = Chat("results/tiny/deploy/int8-mixed")
    print(chat("Describe this image.", images=["photo.jpg"], max_new_tokens=64))

:class:`VisionEncoder` runs the dynamic vision graph (analysis folders) on PIL images of any size
(several per call), with the checkpoint's own image processor: vision features, no generation.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.export.towers.vision_dynamic import graph_inputs


def _session(path, threads: int = 0, device: str = "auto"):
    from vlsens.core.onnxutil import make_session

    return make_session(path, threads=threads, device=device)


class VisionEncoder:
    """The dynamic vision graph + the checkpoint's image processor."""

    def __init__(self, model: str | Path, checkpoint: str | Path, threads: int = 0, device: str = "auto",
                 verify: bool = True):
        """``verify``: a graph vlsens published (a record beside it lists it) is checked against its
        record first, size and SHA-256 of the graph and its data file (:func:`vlsens.core.artifacts.verify`);
        a graph without a record is loaded as it is."""
        from transformers import AutoConfig

        from vlsens.core import artifacts
        from vlsens.model.checkpoint import check_checkpoint_dir
        from vlsens.model.processor import load_image_processor

        if verify and artifacts.find_record(model) is not None:
            artifacts.verify(model)
        check_checkpoint_dir(checkpoint)
        self.config = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False)
        self.vision_config = self.config.vision_config
        self.image_processor = load_image_processor(checkpoint)
        self.session = _session(model, threads, device)

    def preprocess(self, images: Sequence, sizes: Sequence[tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
        """Processor output (``pixel_values`` patches, ``image_grid_thw``) for PIL images, resized
        by the processor itself or, with ``sizes``, to exactly (H, W) each (multiples of 28)."""
        from vlsens.model.vision import processor_inputs

        if sizes is None:
            out = self.image_processor(images=list(images), return_tensors="np")
            return {"pixel_values": np.asarray(out["pixel_values"], np.float32),
                    "image_grid_thw": np.asarray(out["image_grid_thw"], np.int64)}
        parts = [processor_inputs(self.image_processor, [im], h, w) for im, (h, w) in zip(images, sizes)]
        return {"pixel_values": np.concatenate([p["pixel_values"] for p in parts]),
                "image_grid_thw": np.concatenate([p["image_grid_thw"] for p in parts])}

    def features(self, pixel_values: np.ndarray, image_grid_thw: np.ndarray) -> np.ndarray:
        """All images' merged tokens, concatenated (as ``get_image_features`` concatenates them)."""
        return self.session.run(None, graph_inputs(pixel_values, image_grid_thw, self.vision_config))[0]

    def __call__(self, images: Sequence, sizes: Sequence[tuple[int, int]] | None = None) -> list[np.ndarray]:
        """Features per image: (tokens_i, out_hidden) each."""
        p = self.preprocess(images, sizes)
        feats = self.features(p["pixel_values"], p["image_grid_thw"])
        merge = int(self.vision_config.spatial_merge_size) ** 2
        counts = (p["image_grid_thw"].prod(-1) // merge).tolist()
        return np.split(feats, np.cumsum(counts)[:-1])


def verify_folder(folder: str | Path) -> str:
    """Raise a VlsensError naming the first file of a deploy folder that is not what vlsens
    wrote; returns how it was checked. Inside ``results/``: against the record beside the folder
    (every file; unchanged stat keys are not read, :mod:`vlsens.core.outputs`). A folder copied
    elsewhere: every file against the sizes and SHA-256 its ``eval.json`` lists (a folder written
    before eval.json listed them: its graphs and data files, from ``parity.json``). A file's hash
    is remembered in the user's cache (:func:`vlsens.data.inputs.user_cache`) by its (size, mtime,
    ctime, inode), which any write changes: a copied folder is read once (about 1 s per GB), and
    later loads of the same files stat them only. A folder without either record (not written by
    vlsens): not checked."""
    from vlsens.core.errors import VlsensError
    from vlsens.core.outputs import check_output, record_path
    from vlsens.data.inputs import HashCache, user_cache

    folder = Path(folder)
    if record_path(folder).is_file():
        problems = check_output(folder)
        if problems:
            raise VlsensError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        return "record"
    listed, source = {}, None
    for name in ("eval.json", "parity.json"):  # eval.json lists every other file; older folders: the graphs
        rec = folder / name
        try:
            files = (json.loads(rec.read_text()).get("files") or {}) if rec.is_file() else {}
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            raise VlsensError(f"{rec}: not a JSON record ({e}); the folder's record is damaged") from None
        listed = {n: f for n, f in files.items() if isinstance(f, dict) and "sha256" in f}
        if listed:
            source = rec
            break
    cache = HashCache(user_cache())
    try:
        for name, want in listed.items():
            p = folder / name
            if not p.is_file():
                raise VlsensError(f"{p}: missing, but {source} lists it")
            size = p.stat().st_size
            if size != want["bytes"] or cache.sha256(p)[1] != want["sha256"]:
                how = "truncated" if size < want["bytes"] else "changed"
                raise VlsensError(f"{p}: {how} since vlsens wrote it ({size} bytes; {source} lists {want['bytes']} "
                                  f"bytes, sha256 {want['sha256'][:12]}…); copy the folder again or rebuild it")
    finally:
        cache.save(must=False)
    return source.name if source else "none"


def _parts(folder: Path) -> list[str]:
    """The sections of a folder's ``genai_config.json`` that hold a session (decoder, vision, ...)."""
    model = json.loads((folder / "genai_config.json").read_text())["model"]
    return [k for k, v in model.items() if isinstance(v, dict) and "filename" in v]


def _provider_view(folder: Path, provider: str | None):
    """A temporary view of ``folder`` whose ``genai_config.json`` names ``provider`` (every other
    file linked, not copied), or None when the folder already names it: onnxruntime-genai's config
    overlay adds provider options but cannot remove the folder's own."""
    import os
    import tempfile

    from vlsens.deploy.genai.folder import provider_options

    if provider is None:
        return None
    cfg = json.loads((folder / "genai_config.json").read_text())
    sessions = [v["session_options"] for v in cfg["model"].values() if isinstance(v, dict) and "session_options" in v]
    if all(so.get("provider_options", []) == provider_options(provider) for so in sessions):
        return None
    view = tempfile.TemporaryDirectory(prefix="vlsens-chat-")
    for f in folder.iterdir():
        if f.is_file() and f.name != "genai_config.json":
            os.symlink(f.resolve(), Path(view.name) / f.name)
    for so in sessions:
        so["provider_options"] = provider_options(provider)
    (Path(view.name) / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return view


class Chat:
    """A deploy folder run by onnxruntime-genai (greedy search by default, KV cache): the one
    wrapper of the runtime, for users (:meth:`__call__`, :meth:`tokens`) and for the deploy
    stage's checks (:meth:`generate`, :meth:`forced_logits` on a ready prompt text)."""

    def __init__(self, folder: str | Path, prepack: bool = True, check_images: bool = True, verify: bool = True,
                 provider: str | None = None):
        """``prepack=False``: ONNX Runtime keeps the folder's weights memory-mapped from their data
        files instead of copying each MatMul weight into a prepacked buffer (the folder's own
        ``genai_config.json`` is not changed): a float32 folder then costs file pages, not
        anonymous memory (the 36-layer 3B fp32 folder: 16.4 GB of weights). ``check_images``: every
        image file is decoded by the pipeline's own reader (:func:`vlsens.data.images.open_rgb`,
        once per file version) and handed to onnxruntime-genai as RGB PNG bytes, so a file that is
        no image, a truncated one or a decompression bomb raises an ImageError naming it instead of
        reaching onnxruntime-genai's decoder (which ends the process on the first and hangs on the
        second), and GIF, TIFF, WebP, CMYK JPEG or 16-bit PNG files are read as the pipeline reads
        them (onnxruntime-genai reads only RGB / grayscale PNG and JPEG). ``verify``: the folder is checked against
        its records before it is loaded (:func:`verify_folder`). ``provider``: run the folder on this
        execution provider (``cpu``, ``cuda``, ``dml``) instead of the one its ``genai_config.json``
        names (``deploy.provider``); a provider this onnxruntime-genai cannot load is one error naming
        the folder and the package that has it."""
        import onnxruntime_genai as og

        from vlsens.core.errors import VlsensError

        if not Path(folder).is_dir():
            raise VlsensError(f"{folder}: {'not a folder' if Path(folder).exists() else 'no such folder'}; Chat takes a "
                              "deploy folder (results/<model>/deploy/<precision>/, with genai_config.json)")
        if not (Path(folder) / "genai_config.json").is_file():
            raise VlsensError(f"{folder}: no genai_config.json in it; is it a deploy folder "
                              "(results/<model>/deploy/<precision>/)?")
        if verify:
            verify_folder(folder)

        self.og = og
        self.folder = Path(folder)
        self.check_images, self._decoded_cache = check_images, {}
        from vlsens.core.device import NO_SPIN, passive

        self._view = _provider_view(self.folder, provider)
        #: the folder's own search.max_length (its context length): the most a generator is given
        self.max_length = int(json.loads((self.folder / "genai_config.json").read_text())["search"]["max_length"])
        config = og.Config(self._view.name if self._view else str(self.folder))
        options = {**({} if prepack else {"session.disable_prepacking": "1"}), **(NO_SPIN if passive() else {})}
        if options:
            config.overlay(json.dumps({"model": {part: {"session_options": options} for part in _parts(self.folder)}}))
        try:
            self.model = og.Model(config)
        except Exception as e:  # onnxruntime-genai's own error: a provider its build does not have
            from vlsens.deploy.genai.folder import PROVIDERS

            if not any(p in str(e).lower() for p in PROVIDERS if p != "cpu"):
                raise
            raise VlsensError(f"{folder}: written for another execution provider than this onnxruntime-genai "
                              f"has ({str(e).splitlines()[0]}); install its build for that provider (e.g. "
                              "onnxruntime-genai-cuda), or run it here with Chat(folder, provider='cpu')") from None
        self.processor = self.model.create_multimodal_processor()
        self.tokenizer = og.Tokenizer(self.model)

    def close(self) -> None:
        """Release the folder's sessions now (the object may still be referenced elsewhere): a
        check that runs two folders one after the other holds one at a time."""
        import gc

        self.model = self.processor = self.tokenizer = None
        gc.collect()
        if getattr(self, "_view", None) is not None:
            self._view.cleanup()
            self._view = None

    def prompt(self, text: str, n_images: int = 0) -> str:
        """The folder's chat template around ``text`` with ``n_images`` image placeholders."""
        content = [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
        return self.tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": content}]),
                                                  add_generation_prompt=True)

    def _decoded(self, path: str | Path) -> bytes:
        """``path`` decoded by the pipeline's reader (an ImageError naming it when it is not a
        readable image; EXIF orientation, 16-bit and CMYK / palette / alpha modes handled as for
        calibration), as 8-bit RGB PNG bytes: onnxruntime-genai's own decoder reads only RGB and
        grayscale PNG / JPEG (a GIF, TIFF, WebP or CMYK JPEG fails there with a message naming no
        file). A file version (path, size, mtime) is decoded once (the last 16 kept)."""
        from vlsens.core.errors import ImageError
        from vlsens.data.images import ImageRef, open_rgb

        st = Path(path).stat() if Path(path).is_file() else None
        if st is None:
            raise ImageError(f"image '{path}' does not exist (or is not a file)")
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._decoded_cache:
            buf = io.BytesIO()
            open_rgb(ImageRef(Path(path), Path(path).name)).save(buf, format="PNG", compress_level=1)
            while len(self._decoded_cache) >= 16:
                self._decoded_cache.pop(next(iter(self._decoded_cache)))
            self._decoded_cache[key] = buf.getvalue()
        return self._decoded_cache[key]

    def _images(self, images: Sequence):
        if not images:
            return None
        if not self.check_images and all(isinstance(i, (str, Path)) for i in images):
            return self.og.Images.open(*[str(i) for i in images])
        blobs = []
        for im in images:  # files decoded by the pipeline's reader, PIL images as they are: PNG bytes
            if isinstance(im, (str, Path)):
                blobs.append(self._decoded(im) if self.check_images else Path(im).read_bytes())
            else:
                buf = io.BytesIO()
                im.convert("RGB").save(buf, format="PNG", compress_level=1)
                blobs.append(buf.getvalue())
        return self.og.Images.open_bytes(*blobs)

    def inputs(self, prompt: str, images: Sequence = ()):
        """The folder's own multimodal processor on a ready chat text and its images."""
        return self.processor(prompt, images=self._images(images))

    def _generator(self, prompt: str, images: Sequence, new_tokens: int, **search):
        """A greedy generator on ``prompt`` and ``images`` whose KV cache holds the prompt's
        positions and ``new_tokens`` more, at most the folder's own (``search``'s ``max_length`` wins). The folder's
        ``search.max_length`` is its context length (128 000 at Qwen2.5-VL-3B), and with the
        shared past/present buffer the runtime allocates the cache at that length for every
        generator: layers x 2 x KV heads x head size x 4 bytes a position, 9.4 GB for the 36-layer
        3B decoder in float32, allocated again for each prompt. The tokens and logits do not depend
        on the buffer's length (``tests/test_deploy.py``; :func:`search_length`)."""
        try:
            inputs = self.inputs(prompt, images)
            params = self.og.GeneratorParams(self.model)
            length = min(search_length(inputs, new_tokens), self.max_length)
            params.set_search_options(**{"do_sample": False, "max_length": length, **search})
            gen = self.og.Generator(self.model, params)
            gen.set_inputs(inputs)
        except RuntimeError as e:
            raise runtime_error(e, self.folder, self.max_length, images) from None
        return gen

    def generate(self, prompt: str, images: Sequence = (), max_new_tokens: int = 64, **search) -> list[int]:
        """New token ids after ``prompt``, a ready chat text (template applied, one image
        placeholder per image), ``search``: onnxruntime-genai search options."""
        gen = self._generator(prompt, images, max_new_tokens, **search)
        out: list[int] = []
        while not gen.is_done() and len(out) < max_new_tokens:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out

    def forced_logits(self, prompt: str, images: Sequence, tokens: Sequence[int]) -> np.ndarray:
        """Next-token logits (steps, vocab) at ``prompt``'s end and after each of ``tokens[:-1]``
        appended (teacher forcing)."""
        gen = self._generator(prompt, images, len(tokens))
        out = [np.asarray(gen.get_logits(), np.float64).reshape(-1)]
        for t in tokens[:-1]:
            gen.append_tokens(np.array([[t]], dtype=np.int32))
            out.append(np.asarray(gen.get_logits(), np.float64).reshape(-1))
        return np.stack(out)

    def tokens(self, text: str, images: Sequence = (), max_new_tokens: int = 64, **search) -> list[int]:
        """New token ids for one user turn (the folder's chat template around ``text``)."""
        return self.generate(self.prompt(text, len(images)), images, max_new_tokens, **search)

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` as transformers decodes it (the folder's ``tokenizer.json`` through
        the tokenizers library, special tokens skipped, invalid UTF-8 as U+FFFD):
        onnxruntime-genai's own ``Tokenizer.decode`` stops at the first invalid UTF-8 sequence, and
        its streaming decoder drops such bytes."""
        if getattr(self, "_text_tokenizer", None) is None:
            from tokenizers import Tokenizer

            self._text_tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        return self._text_tokenizer.decode(list(map(int, tokens)), skip_special_tokens=True)

    def __call__(self, text: str, images: Sequence = (), max_new_tokens: int = 64, **search) -> str:
        """The answer to one user turn: the new tokens only (at most ``max_new_tokens``; greedy
        unless ``search`` says otherwise), decoded as transformers does (:meth:`decode`)."""
        return self.decode(self.tokens(text, images, max_new_tokens, **search))


def search_length(inputs, new_tokens: int) -> int:
    """The sequence length a generator needs for the processor's ``inputs`` (``input_ids`` with
    every image's tokens in place) and ``new_tokens`` after them: onnxruntime-genai's
    ``max_length``, the length its KV cache is allocated at."""
    return int(inputs["input_ids"].shape()[-1]) + max(int(new_tokens), 1)


@functools.lru_cache(maxsize=2)
def _rope_model(checkpoint: str):
    """The checkpoint's transformers model on torch's meta device (no weights, nothing allocated):
    what :func:`rope_positions` asks for its positions, built once per checkpoint (building it
    took 0.07 s a case on the tiny preset, every layer's modules at 3B)."""
    import torch
    from transformers import AutoConfig

    from vlsens.model.family import family_of

    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True, trust_remote_code=False)
    with torch.device("meta"):
        return family_of(checkpoint).transformers_class()(config)


def rope_positions(checkpoint: str | Path, inputs: dict) -> np.ndarray:
    """The 3-D mRoPE ``position_ids`` (3, B, S) of processor-style ``inputs`` (``input_ids``,
    ``attention_mask``, ``mm_token_type_ids``, grids, ``second_per_grid_ts``), by transformers' own
    ``get_rope_index`` on a weightless model (torch's meta device: index arithmetic only; built
    once per checkpoint, :func:`_rope_model`)."""
    import torch

    model = _rope_model(str(checkpoint))
    t = {k: torch.as_tensor(np.asarray(v)) for k, v in inputs.items()
         if k in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw", "video_grid_thw",
                  "second_per_grid_ts")}
    pos, _ = model.model.get_rope_index(**t)
    return pos.numpy().astype(np.int64)


def runtime_error(error: RuntimeError, folder: Path, max_length: int, images: Sequence) -> Exception:
    """onnxruntime-genai's RuntimeError on a prompt as vlsens' own error: what was wrong with the
    input and what would be valid (a VlsensError; an ImageError when an image is the cause)."""
    import re

    from vlsens.core.errors import ImageError, VlsensError

    text = str(error)
    names = ", ".join(str(i) if isinstance(i, (str, Path)) else f"image {k + 1}" for k, i in enumerate(images))
    m = re.search(r"contained (\d+) vision_start tokens but received (\d+) images", text)
    if m:
        return VlsensError(f"the prompt holds {m.group(1)} image placeholder(s) but {m.group(2)} image(s) were given "
                           "(Chat.prompt(text, n_images) writes one per image; Chat(text, images) does it for you)")
    m = re.search(r"input_ids size \((\d+)\).*exceeds max length \((\d+)\)", text)
    if m:
        return VlsensError(f"the prompt is {m.group(1)} tokens, past {folder}'s context length of {max_length} "
                           "(genai_config.json: search.max_length): shorten it, or use fewer or smaller images")
    if "aspect ratio" in text:
        return ImageError(f"{names}: an image's long side is over 200 times its short side (the Qwen-VL "
                          "processor's limit); crop or pad it")
    if "dimensions exceed" in text:
        return ImageError(f"{names}: an image is larger than onnxruntime-genai's decoder reads; resize it")
    return VlsensError(f"{folder}: onnxruntime-genai refused the prompt: {text}")


def prompt_logits(checkpoint: str | Path, vision_graph: str | Path, text_graph: str | Path, inputs: dict,
                  video: bool = False, zero_deepstack: bool = False, threads: int = 0) -> np.ndarray:
    """Logits of a multimodal prompt with ONNX graphs only: the dynamic vision graph on the
    processor's patches (``pixel_values`` / ``image_grid_thw``, or with ``video``
    ``pixel_values_videos`` / ``video_grid_thw``), its tokens written into the image (video) token
    slots of the checkpoint's embedding table, :func:`rope_positions`, and the text graph
    ``embeds.onnx``. Qwen3-VL's DeepStack maps go in as ``deepstack_embeds``
    (``zero_deepstack``: zeros, to show what dropping them costs)."""
    from transformers import AutoConfig

    from vlsens.model.family import deepstack_count, dense_deepstack, split_features
    from vlsens.model.loading import embedding_table

    config = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False)
    pv, grid = (inputs["pixel_values_videos"], inputs["video_grid_thw"]) if video else \
        (inputs["pixel_values"], inputs["image_grid_thw"])
    feats = _session(vision_graph, threads).run(None, graph_inputs(np.asarray(pv, np.float32), np.asarray(grid),
                                                                    config.vision_config))[0]
    k = deepstack_count(config.vision_config)
    main, maps = split_features(feats, k)
    ids = np.asarray(inputs["input_ids"], dtype=np.int64)
    slots = ids == int(config.video_token_id if video else config.image_token_id)
    if int(slots.sum()) != len(main):
        raise ValueError(f"{int(slots.sum())} placeholder tokens for {len(main)} vision tokens")
    embeds = embedding_table(checkpoint)[ids]
    embeds[slots] = main
    feed = {"inputs_embeds": embeds.astype(np.float32),
            "attention_mask": np.asarray(inputs["attention_mask"], dtype=np.int64),
            "position_ids": rope_positions(checkpoint, inputs)}
    if k:
        dense = dense_deepstack(maps, slots)
        feed["deepstack_embeds"] = np.zeros_like(dense) if zero_deepstack else dense
    return _session(text_graph, threads).run(None, feed)[0]
