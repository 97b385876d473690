"""The Lambda functions' deployment package (deploy/aws/ingest.yaml, built by `make build-<Id>`):
what the handlers import is what lambdas/requirements.txt installs, its pins are the service's,
and it fits Lambda's 250 MB unzipped limit. The segmentation rebuild function's package
(lambdas/requirements-segments.txt: the mesh and skeleton builders too) does not: it is a
container image whose Dockerfile runs the same make target. No network: the sizes are those of
the same wheels installed in this venv (`make lambda-package` builds the real thing for Lambda's Python).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.deploy.test_aws import ROOT, resources

LAMBDA_REQUIREMENTS = ROOT / "lambdas" / "requirements.txt"
SEGMENTS_REQUIREMENTS = ROOT / "lambdas" / "requirements-segments.txt"
SEGMENTS_FUNCTION = "SegmentsFunction"
LAMBDA_PYTHON = re.search(r"^LAMBDA_PYTHON \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)  # type: ignore[union-attr]
LAMBDA_LIMIT_MB = 250
# What the package leaves out (the Makefile's LAMBDA_EXCLUDES): no handler reaches these.
EXCLUDED = ("ndstore/api/", "ndstore/client/", "ndstore/ops/", "ndstore/testing/", "ndstore/cli.py",
            "ndstore/engine/spark", "ndstore/core/slices.py",
            "ndstore/core/precomputed.py", "ndstore/core/sharded.py", "ndstore/core/zarr_view.py",
            "blaze/spark", "blaze/daemon.py", "lambdas/runner.py",
            "lambdas/requirements.txt", "lambdas/requirements-segments.txt")
# The segmentation builders' cores, imported on a rebuild's first build (ndstore/engine/segments/builders.py).
SEGMENT_CORES = ("ndstore.core.segments.mesh", "ndstore.core.segments.skeleton")


def pins(path: Path) -> dict[str, str]:
    """Name -> specifier of a requirements file, with those of the files it includes (-r)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out |= pins(path.parent / line.removeprefix("-r ").strip())
        elif line and not line.startswith("-"):
            req = Requirement(line)
            out[req.name.lower()] = str(req.specifier)
    return out


def image_functions() -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in resources("ingest.yaml", "AWS::Serverless::Function").items()
            if r["Properties"].get("PackageType") == "Image"}


def handler_of(function: dict[str, Any]) -> str:
    props = function["Properties"]
    return str(props["ImageConfig"]["Command"][0] if props.get("PackageType") == "Image" else props["Handler"])


def requirements_of(logical_id: str) -> Path:
    return SEGMENTS_REQUIREMENTS if logical_id == SEGMENTS_FUNCTION else LAMBDA_REQUIREMENTS


def installed_bytes(requirements: Path) -> int:
    """What the requirements and everything they pull in take installed (this venv's files)."""
    size = 0
    for name in closure(list(pins(requirements))):
        dist = md.distribution(name)
        size += sum(Path(str(dist.locate_file(f))).stat().st_size for f in dist.files or []
                    if Path(str(dist.locate_file(f))).is_file())
    return size + sum(p.stat().st_size for package in ("lambdas", "ndstore", "blaze")
                      for p in (ROOT / package).rglob("*.py"))


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
    service = pins(ROOT / "requirements.txt")
    for path in (LAMBDA_REQUIREMENTS, SEGMENTS_REQUIREMENTS):
        lam = pins(path)
        assert lam, f"{path.name} lists nothing"
        for name, spec in lam.items():
            assert service.get(name) == spec, f"{name}{spec} in lambdas/{path.name}, {service.get(name)} in ours"
        assert not {"django", "pyspark", "moto", "gunicorn"} & set(lam)


def test_the_segments_requirements_are_the_others_and_the_builders() -> None:
    segments = pins(SEGMENTS_REQUIREMENTS)
    assert "-r requirements.txt" in SEGMENTS_REQUIREMENTS.read_text().splitlines()
    assert set(segments) - set(pins(LAMBDA_REQUIREMENTS)) == {"zmesh", "dracopy", "kimimaro"}


def build_package_from_this_venv(target: Path, requirements: Path = LAMBDA_REQUIREMENTS) -> None:
    """The package as `make build-<Id>` lays it out, from this venv's installed distributions."""
    for name in closure(list(pins(requirements))):
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
            f"for m in {[m for m in packaged_modules() if m not in SEGMENT_CORES]!r}: importlib.import_module(m)\n"
            "from ndstore.config import Config\nfrom ndstore.wiring import build\n"
            "build(Config.from_env())\n"  # the handlers' first call: wire the services (no network for the file store)
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NDSTORE_DATA_DIR": str(tmp_path / "data"),
           "NDSTORE_LOCKS": "local", "NDSTORE_INDEX": "sqlite", "NDSTORE_OBJECT_STORE": "file"}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"the handlers' code needs more than lambdas/requirements.txt:\n{done.stderr[-3000:]}"
    assert not {"django", "pyspark", "rest_framework"} & set(eval(done.stdout.splitlines()[-1]))  # noqa: S307


def test_the_segments_package_imports_its_handler_and_builders_with_only_the_package(tmp_path: Path) -> None:
    """The rebuild handler and, on its first build, the mesh and skeleton cores with their
    libraries (zmesh, DracoPy, kimimaro and what kimimaro pulls in)."""
    build_package_from_this_venv(tmp_path, SEGMENTS_REQUIREMENTS)
    cores = [m for m in SEGMENT_CORES if m in packaged_modules()]
    if len(cores) < len(SEGMENT_CORES):
        pytest.skip(f"{set(SEGMENT_CORES) - set(cores)} not written yet: the "
                    "handler and its libraries are checked by the test below")
    code = (f"import importlib, sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            f"for m in ['lambdas.segments', *{cores!r}]: importlib.import_module(m)\n"
            "import zmesh, DracoPy, kimimaro\n"
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    needs = f"the segments code needs more than {SEGMENTS_REQUIREMENTS.name}"
    assert done.returncode == 0, f"{needs}:\n{done.stderr[-3000:]}"
    assert not {"django", "pyspark", "rest_framework"} & set(eval(done.stdout.splitlines()[-1]))  # noqa: S307


def test_the_segments_handler_imports_with_only_the_segments_package(tmp_path: Path) -> None:
    build_package_from_this_venv(tmp_path, SEGMENTS_REQUIREMENTS)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "import lambdas.segments, ndstore.engine.segments.builders, zmesh, DracoPy, kimimaro\n"
            "assert callable(lambdas.segments.rebuild)")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_package_fits_lambdas_unzipped_limit() -> None:
    size = installed_bytes(LAMBDA_REQUIREMENTS)
    assert size < LAMBDA_LIMIT_MB * 1e6 * 0.9, f"{size / 1e6:.0f} MB: too close to Lambda's {LAMBDA_LIMIT_MB} MB"


def test_a_function_past_the_zip_limit_is_a_container_image() -> None:
    """The segments package (about 470 MB with scipy) cannot be a zip: its function is an image
    (10 GB allowed); one that would fit stays a zip."""
    size = installed_bytes(SEGMENTS_REQUIREMENTS)
    images = image_functions()
    if size >= LAMBDA_LIMIT_MB * 1e6 * 0.9:
        assert SEGMENTS_FUNCTION in images, f"{size / 1e6:.0f} MB: {SEGMENTS_FUNCTION} must be a container image"
    assert set(images) <= {SEGMENTS_FUNCTION}


def dockerfile_lines(path: Path) -> list[str]:
    """Instructions, comments dropped and backslash continuations joined."""
    return [line.strip() for line in re.sub(r"\\\n\s*", " ", path.read_text()).splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_each_image_is_built_on_lambdas_python_by_its_make_target() -> None:
    runtime = LAMBDA_PYTHON
    for logical_id, resource in image_functions().items():
        meta = resource["Metadata"]
        assert meta["DockerContext"] == "../../", logical_id  # the repository, as CodeUri of the zips
        dockerfile = ROOT / meta["Dockerfile"]
        lines = dockerfile_lines(dockerfile)
        stages = [line.split()[1] for line in lines if line.startswith("FROM ")]
        assert stages[-1] == f"public.ecr.aws/lambda/python:{runtime}", stages
        assert any(line.startswith("RUN make build-" + logical_id + " ") for line in lines), logical_id
        assert "COPY --from=package /package ${LAMBDA_TASK_ROOT}" in lines
        assert json.loads(lines[-1].removeprefix("CMD ")) == [handler_of(resource)]
        for line in lines:  # what it copies exists
            if line.startswith("COPY ") and "--from=" not in line:
                assert all((ROOT / src).exists() for src in line.split()[1:-1]), line
        hadolint = Path(sys.executable).parent / "hadolint"
        linted = subprocess.run([hadolint, "--config", ROOT / ".hadolint.yaml", dockerfile], capture_output=True,
                                text=True)
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_every_function_is_built_by_a_makefile_target_that_installs_only_its_requirements() -> None:
    functions = resources("ingest.yaml", "AWS::Serverless::Function")
    assert functions and SEGMENTS_FUNCTION in functions
    for logical_id, resource in functions.items():
        if logical_id not in image_functions():
            assert resource.get("Metadata", {}).get("BuildMethod") == "makefile", logical_id
            assert resource["Properties"]["Runtime"] == f"python{LAMBDA_PYTHON}", logical_id
        dry = subprocess.run(["make", "-n", f"build-{logical_id}", "ARTIFACTS_DIR=/tmp/artifacts"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert f"-r {requirements_of(logical_id).relative_to(ROOT)}" in dry.stdout, logical_id
        assert "--target \"/tmp/artifacts\"" in dry.stdout
        assert f"--python-version {LAMBDA_PYTHON}" in dry.stdout
        excluded = set(re.findall(r"--exclude='?([^' ]+)'?", dry.stdout)) - {"__pycache__"}
        assert {e.rstrip("/").removesuffix("*") for e in excluded} == {e.rstrip("/") for e in EXCLUDED}


def test_every_handler_is_in_the_package() -> None:
    handlers = {handler_of(r).rsplit(".", 1)[0] for r in resources("ingest.yaml", "AWS::Serverless::Function").values()}
    assert handlers and handlers <= set(packaged_modules())


def test_a_build_without_an_output_folder_is_refused_naming_it() -> None:
    done = subprocess.run(["make", "build-SupercuboidFunction", "ARTIFACTS_DIR="], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "ARTIFACTS_DIR must name the output folder" in done.stdout + done.stderr
