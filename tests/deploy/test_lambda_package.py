"""The Lambda functions' deployment package (deploy/aws/ingest.yaml, built by `make build-<Id>`):
what the handlers import is what lambdas/requirements.txt installs, its pins are the service's,
and it fits Lambda's 250 MB unzipped limit. No network: the sizes are those of the same wheels
installed in this venv (`make lambda-package` builds the real thing for Lambda's Python).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tests.deploy.test_aws import ROOT, resources, template

LAMBDA_REQUIREMENTS = ROOT / "lambdas" / "requirements.txt"
LAMBDA_LIMIT_MB = 250
# What the package leaves out (the Makefile's LAMBDA_EXCLUDES): no handler reaches these.
EXCLUDED = ("ndstore/api/", "ndstore/client/", "ndstore/ops/", "ndstore/testing/", "ndstore/cli.py",
            "ndstore/engine/spark", "ndstore/core/slices.py",
            "ndstore/core/precomputed.py", "ndstore/core/sharded.py", "ndstore/core/zarr_view.py",
            "blaze/spark", "blaze/daemon.py", "lambdas/runner.py",
            "lambdas/requirements.txt")


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[req.name.lower()] = str(req.specifier)
    return out


def packaged_modules() -> list[str]:
    modules = []
    for package in ("lambdas", "ndstore", "blaze"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel.startswith(prefix) for prefix in EXCLUDED):
                modules.append(rel[:-3].replace("/", ".").removesuffix(".__init__"))
    return modules


def closure(names: list[str]) -> set[str]:
    """The distributions these install, with everything they require (for this platform)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for spec in md.requires(name) or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_the_lambda_pins_are_the_services_pins() -> None:
    service, lam = pins(ROOT / "requirements.txt"), pins(LAMBDA_REQUIREMENTS)
    assert lam, "lambdas/requirements.txt lists nothing"
    for name, spec in lam.items():
        assert service.get(name) == spec, f"{name}{spec} in lambdas/requirements.txt, {service.get(name)} in ours"
    assert not {"django", "pyspark", "moto", "gunicorn"} & set(lam)


def build_package_from_this_venv(target: Path) -> None:
    """The package as `make build-<Id>` lays it out, from this venv's installed distributions."""
    for name in closure(list(pins(LAMBDA_REQUIREMENTS))):
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"bin"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
    for module in packaged_modules():
        rel = Path(*module.split("."))
        source = ROOT / (f"{rel}.py" if (ROOT / f"{rel}.py").exists() else rel / "__init__.py")
        dest = target / source.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)


def test_the_packaged_code_imports_with_only_the_package_on_its_path(tmp_path: Path) -> None:
    build_package_from_this_venv(tmp_path)
    code = (f"import importlib, sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            f"for m in {packaged_modules()!r}: importlib.import_module(m)\n"
            "from ndstore.config import Config\nfrom ndstore.wiring import build\n"
            "build(Config.from_env())\n"  # the handlers' first call: wire the services (no network for the file store)
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NDSTORE_DATA_DIR": str(tmp_path / "data"),
           "NDSTORE_LOCKS": "local", "NDSTORE_INDEX": "sqlite", "NDSTORE_OBJECT_STORE": "file"}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"the handlers' code needs more than lambdas/requirements.txt:\n{done.stderr[-3000:]}"
    assert not {"django", "pyspark", "rest_framework"} & set(eval(done.stdout.splitlines()[-1]))  # noqa: S307


def test_the_package_fits_lambdas_unzipped_limit() -> None:
    size = 0
    for name in closure(list(pins(LAMBDA_REQUIREMENTS))):
        dist = md.distribution(name)
        size += sum(Path(str(dist.locate_file(f))).stat().st_size for f in dist.files or []
                     if Path(str(dist.locate_file(f))).is_file())
    for package in ("lambdas", "ndstore", "blaze"):
        size += sum(p.stat().st_size for p in (ROOT / package).rglob("*.py"))
    assert size < LAMBDA_LIMIT_MB * 1e6 * 0.9, f"{size / 1e6:.0f} MB: too close to Lambda's {LAMBDA_LIMIT_MB} MB"


def test_every_function_is_built_by_a_makefile_target_that_installs_only_the_lambda_requirements() -> None:
    functions = resources("ingest.yaml", "AWS::Serverless::Function")
    assert functions
    runtime = template("ingest.yaml")["Globals"]["Function"]["Runtime"]
    for logical_id, resource in functions.items():
        assert resource.get("Metadata", {}).get("BuildMethod") == "makefile", logical_id
        dry = subprocess.run(["make", "-n", f"build-{logical_id}", "ARTIFACTS_DIR=/tmp/artifacts"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert "-r lambdas/requirements.txt" in dry.stdout and "--target \"/tmp/artifacts\"" in dry.stdout
        assert f"--python-version {runtime.removeprefix('python')}" in dry.stdout
        excluded = set(re.findall(r"--exclude='?([^' ]+)'?", dry.stdout)) - {"__pycache__"}
        assert {e.rstrip("/").removesuffix("*") for e in excluded} == {e.rstrip("/") for e in EXCLUDED}


def test_every_handler_is_in_the_package() -> None:
    handlers = {r["Properties"]["Handler"].rsplit(".", 1)[0]
                for r in resources("ingest.yaml", "AWS::Serverless::Function").values()}
    assert handlers and handlers <= set(packaged_modules())


def test_a_build_without_an_output_folder_is_refused_naming_it() -> None:
    done = subprocess.run(["make", "build-SupercuboidFunction", "ARTIFACTS_DIR="], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "ARTIFACTS_DIR must name the output folder" in done.stdout + done.stderr
