"""Loading a checkpoint's weights with transformers, safely: safetensors only
(``use_safetensors=True``), never ``trust_remote_code``, every tensor accounted for; the vision or
the text part alone where a stage needs only one."""

from __future__ import annotations

import json
from pathlib import Path

from vlsens.core.errors import CheckpointError
from vlsens.model.checkpoint import check_checkpoint_dir
from vlsens.model.family import family_of

#: The checkpoint's two parts ``load_model`` can materialise alone.
VISION_PART, TEXT_PART = "vision", "text"


def load_model(path: str | Path, attn_implementation: str | None = None, device: str = "cpu",
               part: str | None = None):
    """Load the family's ``...ForConditionalGeneration`` (:mod:`vlsens.model.family`) in float32 from
    safetensors, eval mode.

    ``part="vision"`` materialises the vision tower only (``model.model.visual``, with
    ``model.model.get_image_features`` working as usual); ``part="text"`` the language model and
    ``lm_head`` only. The rest of the model stays on torch's ``meta`` device and takes no memory:
    the vision stages need 4 bytes per vision parameter (2.7 GB for Qwen2.5-VL-3B/7B/72B's
    669 M) instead of the whole checkpoint in float32 (15 GB for 3B), the text export 4 bytes per
    text parameter (12.4 GB for 3B)."""
    import torch

    p = check_checkpoint_dir(path)
    model_class = family_of(p).transformers_class()
    if part in ("vision", "text"):
        return _load_part(p, part, attn_implementation, device)
    if part is not None:
        raise ValueError(f"part: {part!r} (vision, text or None)")
    kwargs = dict(
        dtype=torch.float32,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = model_class.from_pretrained(str(p), output_loading_info=True, **kwargs)
    except Exception as e:  # safetensors and transformers raise their own types, naming no file
        raise CheckpointError(f"model.checkpoint: '{p}' cannot be loaded: {type(e).__name__}: {e}") from e
    problems = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems["error_msgs"] = list(info.get("error_msgs") or [])
    if any(problems.values()):
        what = "; ".join(f"{k.replace('_', ' ')} ({len(v)}): {', '.join(map(str, v[:8]))}"
                         + (" ..." if len(v) > 8 else "") for k, v in problems.items() if v)
        raise CheckpointError(
            f"model.checkpoint: '{p}' does not match its config.json: {what}. transformers would fill missing "
            "tensors with random values and every result would be wrong; fix or re-download the checkpoint.")
    return model.to(device).eval()



def _part_key(key: str, part: str) -> str | None:
    """The checkpoint key ``key`` as a name in the ``part`` it belongs to (None: another part).
    Both layouts are read: transformers 5's (``model.visual.*``, ``model.language_model.*``,
    ``lm_head.*``) and the published checkpoints' (``visual.*``, ``model.*``, ``lm_head.*``)."""
    if part == "vision":
        for prefix in ("model.visual.", "visual."):
            if key.startswith(prefix):
                return "visual." + key[len(prefix):]
        return None
    if key.startswith("lm_head."):
        return key
    if key.startswith("model.language_model."):
        return "language_model." + key[len("model.language_model."):]
    if key.startswith("model.") and not key.startswith("model.visual."):
        return "language_model." + key[len("model."):]
    return None



def _load_part(p: Path, part: str, attn_implementation: str | None, device: str):
    """The model with only ``part`` (vision: ``model.model.visual``; text: the language model and
    ``lm_head``) materialised in float32 from safetensors, tensor by tensor; the rest stays on
    torch's meta device."""
    import torch
    from transformers import AutoConfig

    model_class = family_of(p).transformers_class()
    config = AutoConfig.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    if attn_implementation:
        config._attn_implementation = attn_implementation
        for sub in (config.vision_config, config.text_config):
            sub._attn_implementation = attn_implementation
    with torch.device("meta"):
        model = model_class(config)
    tied = bool(getattr(config, "tie_word_embeddings", False) or getattr(config.text_config, "tie_word_embeddings", False))
    modules = _part_modules(model, config, part)
    state = {f"{name}.{k}": v for name, m in modules.items() for k, v in m.state_dict().items()}
    if part == "text" and tied:
        del state["lm_head.weight"]
    _read_part(p, part, state, tied)
    if part == "vision":
        model.model.visual = modules["visual"].to(device).eval()
    else:
        model.model.language_model = modules["language_model"].to(device).eval()
        model.lm_head = modules["lm_head"].to(device).eval()
        if tied:
            model.lm_head.weight = model.model.language_model.embed_tokens.weight
    return model.eval()


def _part_modules(model, config, part: str) -> dict:
    """The float32 modules of ``part`` (``{"visual": ...}``, or ``{"language_model": ...,
    "lm_head": ...}``), their parameters left uninitialised (:func:`_read_part` fills them)."""
    import torch
    from transformers.initialization import no_init_weights

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with no_init_weights():  # every parameter is loaded below; buffers are computed as usual
            if part == "vision":
                modules = {"visual": type(model.model.visual)._from_config(config.vision_config, dtype=torch.float32)}
            else:
                lm = type(model.model.language_model)._from_config(config.text_config, dtype=torch.float32)
                head = torch.nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
                modules = {"language_model": lm, "lm_head": head}
    finally:
        torch.set_default_dtype(old)
    return modules


def _read_part(p: Path, part: str, state: dict, tied: bool) -> None:
    """Every tensor of ``state`` (``part``'s, by :func:`_part_key` names) copied from the
    checkpoint's safetensors, as float32; a tensor the model does not have, a shape the config
    does not give, or one left missing is a :class:`CheckpointError`."""
    import torch
    from safetensors import safe_open

    found = set()
    try:
        for f in sorted(p.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    name = _part_key(key, part)
                    if name is None or (tied and name == "lm_head.weight"):
                        continue
                    if name not in state:
                        raise CheckpointError(f"model.checkpoint: '{f}' has tensor '{key}' that the config's model "
                                              "does not have; fix or re-download the checkpoint.")
                    t = sf.get_tensor(key)
                    if tuple(t.shape) != tuple(state[name].shape):
                        raise CheckpointError(f"model.checkpoint: '{f}' tensor '{key}' has shape {tuple(t.shape)}, "
                                              f"the config says {tuple(state[name].shape)}.")
                    with torch.no_grad():
                        state[name].copy_(t.to(torch.float32))
                    found.add(name)
                    del t
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"model.checkpoint: '{p}' cannot be loaded: {type(e).__name__}: {e}") from e
    missing = sorted(set(state) - found)
    if missing:
        as_saved = [n if n.startswith("lm_head.") else f"model.{n}" for n in missing]  # transformers' key names
        raise CheckpointError(
            f"model.checkpoint: '{p}' does not match its config.json: missing keys ({len(missing)}): "
            + ", ".join(as_saved[:8]) + (" ..." if len(missing) > 8 else "")
            + ". transformers would fill missing tensors with random values and every result would be wrong; "
            "fix or re-download the checkpoint.")



def embedding_table(checkpoint: str | Path):
    """The token embedding table (numpy, the checkpoint's dtype widened to float32) read from its
    safetensors alone. Checkpoints name it ``model.embed_tokens.weight`` (the published layout,
    which transformers 5 also writes) or ``model.language_model.embed_tokens.weight``."""
    import numpy as np
    from safetensors import safe_open

    names = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
             "language_model.model.embed_tokens.weight")
    ckpt = Path(checkpoint)
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        files = sorted({ckpt / wm[n] for n in names if n in wm})
    else:
        files = sorted(ckpt.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:  # "pt": bfloat16 checkpoints too
            for n in names:
                if n in st.keys():
                    return st.get_tensor(n).float().numpy().astype(np.float32)
    raise KeyError(f"{checkpoint}: none of {names} in its safetensors")
