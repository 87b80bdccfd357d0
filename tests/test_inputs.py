"""Content-addressed inputs: manifests change with content only; hashes are cached by stat."""

import json
import os

from vlsens.data.images import ImageRef, resolve_images
from vlsens.data.inputs import HashCache, checkpoint_dir, image_refs, write_if_changed, write_manifests


def test_hash_cache_rehashes_only_changed_files(tmp_path, monkeypatch):
    import vlsens.data.inputs as inputs

    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 100)
    calls = []
    real = inputs.file_sha256
    monkeypatch.setattr(inputs, "file_sha256", lambda p: calls.append(p) or real(p))
    cache = HashCache(tmp_path / "cache.json")
    first = cache.sha256(f)
    cache.save()
    assert HashCache(tmp_path / "cache.json").sha256(f) == first and len(calls) == 1  # from the cache
    st = f.stat()
    f.write_bytes(b"b" * 100)  # same size, and the old mtime put back: ctime still moves
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = HashCache(tmp_path / "cache.json").sha256(f)
    assert again != first and len(calls) == 2


def test_manifest_is_rewritten_only_when_content_changes(tmp_path):
    p = tmp_path / "m.json"
    assert write_if_changed(p, {"a": 1})
    mtime = p.stat().st_mtime_ns
    assert not write_if_changed(p, {"a": 1}) and p.stat().st_mtime_ns == mtime
    assert write_if_changed(p, {"a": 2}) and json.loads(p.read_text()) == {"a": 2}


def test_write_manifests_round_trip(tmp_path, tiny_ckpt):
    refs = resolve_images("builtin")[:2]
    out = write_manifests(tmp_path / "inputs", tiny_ckpt, refs, refs[:1], None)
    assert set(out) == {"checkpoint", "parity_images", "calibration_images"}
    assert [r.name for r in image_refs(out["parity_images"])] == [r.name for r in refs]
    assert checkpoint_dir(out["checkpoint"]) == str(tiny_ckpt)
    assert checkpoint_dir(str(tiny_ckpt)) == str(tiny_ckpt)  # a preset's directory passes through
    man = json.loads(open(out["checkpoint"]).read())
    assert "model.safetensors" in man["files"] and "config.json" in man["files"]
    img = json.loads(open(out["parity_images"]).read())["images"][0]
    assert img["width"] == 512 and img["mode"] == "RGB" and len(img["sha256"]) == 64
    assert isinstance(refs[0], ImageRef)
