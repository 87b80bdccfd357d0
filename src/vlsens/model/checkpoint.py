"""Checking a checkpoint directory before anything loads it: a supported family, safetensors
weights only (a directory that holds only pickle weights is refused), complete files. Reads
``config.json`` and safetensors headers, no torch: it runs when the DAG is built."""

from __future__ import annotations

import json
from pathlib import Path

from vlsens.core.errors import CheckpointError
from vlsens.model.family import FAMILIES
from vlsens.model.presets import PRESETS


def check_checkpoint_dir(path: str | Path, key: str = "model.checkpoint") -> Path:
    """Raise :class:`CheckpointError` unless ``path`` is a loadable safetensors checkpoint of a
    supported family (:mod:`vlsens.model.family`).

    Cheap (reads ``config.json`` and lists files), so it runs when the DAG is built.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"{key}: checkpoint directory '{path}' does not exist. Give a local Hugging Face "
            f"Qwen2.5-VL directory (with config.json and *.safetensors) or a preset: {', '.join(PRESETS)}."
        )
    if not p.is_dir():
        raise CheckpointError(f"{key}: '{path}' is a file; a checkpoint is a directory with config.json.")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{key}: '{path}' has no config.json; is it a Hugging Face checkpoint directory?")
    config = _json_object(cfg, key, sections=("vision_config", "text_config"))
    model_type = config.get("model_type")
    for name in CHECKPOINT_JSON:  # the other JSON files vlsens or transformers read from a checkpoint
        if (p / name).is_file():
            _json_object(p / name, key)
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{key}: '{path}' holds model_type '{model_type}'; vlsens takes "
            + ", ".join(f"'{k}' ({f.title})" for k, f in FAMILIES.items()) + "."
        )
    if not any(p.glob("*.safetensors")):
        pickles = sorted(x.name for x in p.iterdir() if x.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise CheckpointError(
                f"{key}: '{path}' holds only pickle weights ({', '.join(pickles[:3])}); vlsens loads "
                "safetensors only, because unpickling runs arbitrary code. Convert it once in a trusted "
                "environment (model.save_pretrained(dir, safe_serialization=True))."
            )
        raise CheckpointError(f"{key}: '{path}' has no *.safetensors weight files.")
    check_safetensors_files(p, key)
    check_processor_files(p, key)
    check_config_values(config, cfg, key, max_token_id(p, key))
    return p


def check_processor_files(p: Path, key: str = "model.checkpoint") -> None:
    """The files transformers' processor is made from: a tokenizer (``tokenizer.json``, or
    ``vocab.json`` + ``merges.txt``) and the image processor's settings (``preprocessor_config.json``,
    or a ``processor_config.json`` that holds them); a CheckpointError naming what is missing."""
    if not (p / "tokenizer.json").is_file() and not ((p / "vocab.json").is_file() and (p / "merges.txt").is_file()):
        raise CheckpointError(f"{key}: '{p}' has no tokenizer (tokenizer.json, or vocab.json and merges.txt); copy "
                              "the checkpoint's tokenizer files with its weights.")
    proc = p / "processor_config.json"
    if not (p / "preprocessor_config.json").is_file() and not (
            proc.is_file() and isinstance(_json_object(proc, key).get("image_processor"), dict)):
        raise CheckpointError(f"{key}: '{p}' has no preprocessor_config.json (the image processor's settings: patch "
                              "size, pixel limits, normalization); copy it from the checkpoint's source.")


def max_token_id(p: Path, key: str = "model.checkpoint") -> int | None:
    """The largest token id of the checkpoint's ``tokenizer.json`` (its vocabulary and added
    tokens); None without one. A CheckpointError naming the file when it is not a tokenizer."""
    tok = p / "tokenizer.json"
    if not tok.is_file():
        return None
    data = _json_object(tok, key)
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    ids = list(vocab.values()) if isinstance(vocab, dict) else [i for _, i in vocab] if isinstance(vocab, list) else []
    ids += [t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)]
    ids = [i for i in ids if isinstance(i, int)]
    if not ids:
        raise CheckpointError(f"{key}: '{tok}' holds no token ids (model.vocab, added_tokens); is it a tokenizers "
                              "tokenizer.json?")
    return max(ids)


#: token ids of a VLM config that index its embedding table
TOKEN_ID_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                 "bos_token_id", "eos_token_id", "pad_token_id")


def check_config_values(config: dict, path: Path, key: str = "model.checkpoint", tokens: int | None = None) -> None:
    """The config values a graph is built from, consistent before any job builds one: attention
    widths divisible by their heads (where no ``head_dim`` is given), key/value heads dividing the
    heads, and every token id (the config's and the tokenizer's largest, ``tokens``) inside the
    embedding table (``vocab_size``). A CheckpointError naming the file and the keys."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vision = config.get("vision_config") or {}

    def ints(d, *names):
        return [d.get(n) if isinstance(d.get(n), int) and not isinstance(d.get(n), bool) else None for n in names]

    width = vision.get("embed_dim", vision.get("hidden_size"))
    (heads,) = ints(vision, "num_heads")
    if isinstance(width, int) and heads and "head_dim" not in vision and (heads < 1 or width % heads):
        name = "embed_dim" if "embed_dim" in vision else "hidden_size"
        raise CheckpointError(f"{key}: '{path}': vision_config.{name} {width} is not divisible by "
                              f"vision_config.num_heads {heads}.")
    hidden, heads, kv, vocab = ints(text, "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    where = "text_config." if text is not config else ""
    if hidden and heads and "head_dim" not in text and (heads < 1 or hidden % heads):
        raise CheckpointError(f"{key}: '{path}': {where}hidden_size {hidden} is not divisible by "
                              f"{where}num_attention_heads {heads}.")
    if heads and kv and (kv < 1 or heads % kv):
        raise CheckpointError(f"{key}: '{path}': {where}num_attention_heads {heads} is not a multiple of "
                              f"{where}num_key_value_heads {kv}.")
    if not vocab:
        return
    ids = {}
    for d, prefix in ((config, ""), (text, where)):
        for k in TOKEN_ID_KEYS:
            for v in (d.get(k) if isinstance(d.get(k), list) else [d.get(k)]):
                if isinstance(v, int) and not isinstance(v, bool):
                    ids.setdefault(f"{prefix}{k}", v)
    bad = {k: v for k, v in ids.items() if not 0 <= v < vocab}
    if bad:
        raise CheckpointError(f"{key}: '{path}': {', '.join(f'{k} {v}' for k, v in bad.items())} outside the "
                              f"embedding table ({where}vocab_size {vocab}: ids 0..{vocab - 1}).")
    if tokens is not None and tokens >= vocab:
        raise CheckpointError(f"{key}: '{path}': {where}vocab_size {vocab} is smaller than the tokenizer's "
                              f"(tokenizer.json has token id {tokens}); the embedding table must hold every id.")



#: JSON files of a checkpoint that are read (when present), each a JSON object
CHECKPOINT_JSON = ("generation_config.json", "preprocessor_config.json", "tokenizer_config.json",
                   "processor_config.json", "video_preprocessor_config.json")


def _json_object(path: Path, key: str, sections: tuple[str, ...] = ()) -> dict:
    """``path`` read as a JSON object (its ``sections``, where present, objects too); a
    CheckpointError naming the file (and the section) otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{key}: '{path}' is not valid JSON ({str(e).splitlines()[0][:120]}).") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{key}: '{path}' holds a JSON {type(data).__name__}, not an object of keys "
                              "(is it the file its name says?).")
    for s in sections:
        if s in data and not isinstance(data[s], dict):
            raise CheckpointError(f"{key}: '{path}': {s} is a JSON {type(data[s]).__name__}, not an object of keys.")
    return data


def check_safetensors_files(directory: Path, key: str = "model.checkpoint") -> None:
    """Each ``*.safetensors`` file is complete (its header's tensors end exactly at the end of the
    file), and every shard an index names exists. Reads headers only, so it is cheap at any size."""
    for f in sorted(directory.glob("*.safetensors")):
        safetensors_header(f, key)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{key}: '{index}' is not a valid safetensors index ({e}).") from e
        missing = sorted(s for s in shards if not (directory / s).is_file())
        if missing:
            raise CheckpointError(f"{key}: '{index}' names shard(s) {missing} that are not in '{directory}'.")



def tied_weights_differ(directory: str | Path, key: str = "model.checkpoint") -> str | None:
    """Where a checkpoint stores both its embedding table and an ``lm_head.weight``, whether they
    differ (the reason, else None): dtype and shape from the headers, then the bytes in 8 MiB
    chunks, stopping at the first difference (a tied checkpoint usually stores the table alone:
    nothing to read). A config that says ``tie_word_embeddings`` is checked by value with this."""
    tensors = safetensors_tensors(Path(directory), key)
    table = next((k for k in tensors if k.endswith("embed_tokens.weight")), None)
    if table is None or "lm_head.weight" not in tensors:
        return None
    (fa, ea, sa), (fb, eb, sb) = tensors[table], tensors["lm_head.weight"]
    if (ea["dtype"], ea["shape"]) != (eb["dtype"], eb["shape"]):
        return f"{table} is {ea['dtype']} {ea['shape']}, lm_head.weight {eb['dtype']} {eb['shape']}"
    n, chunk = ea["data_offsets"][1] - ea["data_offsets"][0], 8 << 20
    with open(fa, "rb") as a, open(fb, "rb") as b:
        a.seek(sa + ea["data_offsets"][0])
        b.seek(sb + eb["data_offsets"][0])
        for at in range(0, n, chunk):
            if a.read(min(chunk, n - at)) != b.read(min(chunk, n - at)):
                return f"lm_head.weight differs from {table} (first in bytes {at}..{min(at + chunk, n)})"
    return None


def safetensors_tensors(directory: Path, key: str = "model.checkpoint") -> dict[str, tuple[Path, dict, int]]:
    """``{tensor: (file, header entry, data start)}`` over the ``*.safetensors`` files of
    ``directory`` (headers only, each checked by :func:`safetensors_header`); a tensor's bytes are
    ``data start + entry["data_offsets"]`` of its file."""
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        header, start = safetensors_header(f, key)
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (f, v, start)
    return out


def safetensors_header(path: Path, key: str = "model.checkpoint") -> tuple[dict, int]:
    """The JSON header of a safetensors file and where its tensors' bytes start (after the 8-byte
    length and the header); :class:`CheckpointError` naming the file when the file is not one, or
    is shorter or longer than its header says (truncated or corrupt)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise CheckpointError(f"{key}: '{path}' is not a complete safetensors file ({size} bytes; its header "
                                  "cannot be read). Copy the file again.")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{key}: '{path}' has a corrupt safetensors header ({e}). Copy the file again.") from e
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise CheckpointError(
            f"{key}: '{path}' is {size} bytes but its safetensors header describes {8 + n + end}: the file is "
            f"{'truncated' if size < 8 + n + end else 'corrupt'}. Copy the file again.")
    return header, 8 + n
