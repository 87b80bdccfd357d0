"""The token embedding table as raw binaries: read back through the manifest, they equal the
checkpoint's table as transformers loads it (bf16: torch's own rounding, bit for bit)."""

import json

import ml_dtypes
import numpy as np
import pytest
import torch

from vlsens.core.errors import CheckpointError
from vlsens.core.fsutil import file_sha256
from vlsens.npu import embeddings


def test_binaries_equal_transformers_table(tiny_ckpt, tmp_path):
    from transformers import AutoModelForImageTextToText

    man = embeddings.export_embeddings(tiny_ckpt, tmp_path / "e", ["bf16", "fp32"])
    model = AutoModelForImageTextToText.from_pretrained(tiny_ckpt, dtype=torch.float32)
    table = model.get_input_embeddings().weight.detach()
    fp32 = embeddings.load_binary(tmp_path / "e", "fp32")
    np.testing.assert_array_equal(fp32, table.numpy())
    bf16 = embeddings.load_binary(tmp_path / "e", "bf16")
    assert bf16.dtype == ml_dtypes.bfloat16 and bf16.shape == tuple(table.shape)
    np.testing.assert_array_equal(bf16.view(np.int16), table.to(torch.bfloat16).view(torch.int16).numpy())
    assert json.loads((tmp_path / "e" / "manifest.json").read_text()) == man
    for name, entry in man["files"].items():
        f = tmp_path / "e" / name
        assert entry["bytes"] == f.stat().st_size == np.prod(entry["shape"]) * (2 if "bf16" in name else 4)
        assert entry["sha256"] == file_sha256(f) and entry["byte_order"] == "little"
    assert man["tensor"].endswith("embed_tokens.weight") and man["vocab_size"] == table.shape[0]


def test_a_bf16_checkpoint_is_copied_as_stored(tmp_path):
    from safetensors.torch import save_file

    t = torch.randn(300, 16).to(torch.bfloat16)
    save_file({"model.language_model.embed_tokens.weight": t, "model.visual.embed_tokens.weight": t[:2].clone()},
              str(tmp_path / "model.safetensors"))
    man = embeddings.export_embeddings(tmp_path, tmp_path / "e", ["bf16", "fp32"])
    assert man["stored_as"] == "bfloat16" and man["tensor"] == "model.language_model.embed_tokens.weight"
    raw = (tmp_path / "e" / "embed_tokens.bf16.bin").read_bytes()
    assert raw == t.view(torch.int16).numpy().astype("<i2").tobytes()
    np.testing.assert_array_equal(embeddings.load_binary(tmp_path / "e", "fp32"), t.float().numpy())


def test_no_table_is_a_clear_error(tmp_path):
    from safetensors.torch import save_file

    save_file({"lm_head.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"expected one token embedding tensor .* found none"):
        embeddings.export_embeddings(tmp_path, tmp_path / "e", ["bf16"])
    assert not (tmp_path / "e").exists()
