"""From a Dockerfile and a rendered Kubernetes container to a local process (the smoke test's parts).

`build_image_venv` installs the package the way a Dockerfile's build stage does (its COPY lines
give the build context, its `pip install` line is run with `--prefix=/install` dropped) into a
fresh virtual environment outside the checkout; `container_process` turns a rendered container
(args, env with secretKeyRef/fieldRef, volume mounts, ports) into argv and environment for that
venv's console script, with cluster service hosts and listen ports mapped to local ones.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ids import CHANNEL_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
IMAGE_PYTHON = "/usr/bin/python3.11" if Path("/usr/bin/python3.11").is_file() else sys.executable
# The image's user has no home directory (useradd --no-create-home) and the root filesystem is
# read-only: HOME points nowhere writable, as in the pod.
POD_HOME = "/nonexistent"
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class Dockerfile:
    build_copies: list[tuple[list[str], str]]  # (sources, destination) relative to WORKDIR
    build_run: list[str]  # the build stage's RUN lines
    runtime_env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    user: str = "0"  # the runtime stage's USER (uid[:gid])


def _json_or_shell(text: str) -> list[str]:
    text = text.strip()
    return list(json.loads(text)) if text.startswith("[") else shlex.split(text)


def parse_dockerfile(path: Path) -> Dockerfile:
    """The instructions the smoke test mirrors: COPY/RUN of the first stage, ENV/ENTRYPOINT/CMD/USER of the last."""
    stages: list[list[str]] = []
    joined = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    build, runtime = stages[0], stages[-1]
    copies: list[tuple[list[str], str]] = []
    runs: list[str] = []
    for line in build:
        op, _, rest = line.partition(" ")
        if op.upper() == "COPY" and "--from" not in rest:
            *sources, dest = shlex.split(rest)
            copies.append((sources, dest))
        elif op.upper() == "RUN":
            runs.append(rest)
    env: dict[str, str] = {}
    entrypoint: list[str] = []
    cmd: list[str] = []
    user = "0"
    for line in runtime:
        op, _, rest = line.partition(" ")
        if op.upper() == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
        elif op.upper() == "ENTRYPOINT":
            entrypoint = _json_or_shell(rest)
        elif op.upper() == "CMD":
            cmd = _json_or_shell(rest)
        elif op.upper() == "USER":
            user = rest.strip()
        elif op.upper() == "COPY" and "--from=build" not in rest:
            raise AssertionError(f"{path.name}: runtime COPY {rest!r} is not mirrored by the smoke test")
    return Dockerfile(copies, runs, env, entrypoint, cmd, user)


def _context(df: Dockerfile, into: Path) -> None:
    """COPY semantics: a directory's contents go into the destination; files into it when it ends in /."""
    for sources, dest in df.build_copies:
        for src in sources:
            origin = ROOT / src
            if origin.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
                shutil.copytree(origin, into / dest, ignore=ignore, dirs_exist_ok=True)
            else:
                into_dir = dest.endswith("/") or len(sources) > 1
                target = into / dest / origin.name if into_dir else into / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)


def build_image_venv(dockerfile: Path, workdir: Path) -> tuple[Path, Dockerfile]:
    """A fresh venv holding what the image's runtime stage holds; cached per distinct build stage."""
    df = parse_dockerfile(dockerfile)
    key = hashlib.sha256(json.dumps([df.build_copies, df.build_run]).encode()).hexdigest()[:12]
    env_dir = workdir / f"venv-{key}"
    if (env_dir / "bin" / "llmfleet").exists():
        return env_dir, df
    context = workdir / f"context-{key}"
    context.mkdir(parents=True)
    _context(df, context)
    # The image's interpreter stands in for python:3.11-slim's; it must be readable by the pod's
    # user (a pyenv build under /root is not), so the system one is preferred.
    subprocess.run([IMAGE_PYTHON, "-m", "venv", str(env_dir)], check=True, timeout=300)
    for run in df.build_run:
        argv = shlex.split(run)
        assert argv[:2] == ["pip", "install"], f"unexpected build step {run!r}"
        argv = [a for a in argv[2:] if not a.startswith("--prefix")]
        # pip's cache stays on (the Dockerfile's --no-cache-dir is for image size only).
        argv = [a for a in argv if a != "--no-cache-dir"]
        subprocess.run(
            [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", *argv],
            cwd=context,
            check=True,
            timeout=900,
        )
    shutil.rmtree(context)
    return env_dir, df


@dataclass(frozen=True)
class Cluster:
    """What the pod would get from the cluster, mapped to this machine."""

    secrets: Mapping[str, Mapping[str, str]]  # Secret name -> key -> value
    hosts: Mapping[str, str]  # "<svc>.<ns>.svc:<port>" or "127.0.0.1:<port>" -> "127.0.0.1:<local port>"
    ports: Mapping[int, int]  # containerPort the process listens on -> local port
    mounts: Mapping[str, Path]  # mountPath -> local directory


def _env_value(entry: Mapping[str, Any], cluster: Cluster, pod_name: str) -> str:
    if "value" in entry:
        return str(entry["value"])
    source = entry["valueFrom"]
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return cluster.secrets[ref["name"]][ref["key"]]
    if source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
        return pod_name
    raise AssertionError(f"env {entry['name']}: unsupported valueFrom {source}")


def _map(text: str, cluster: Cluster) -> str:
    for remote, local in cluster.hosts.items():
        text = text.replace(remote, local)
    for mount, local_dir in cluster.mounts.items():
        if text == mount or text.startswith(mount + "/"):
            text = str(local_dir) + text[len(mount) :]
    return text


def container_process(
    container: Mapping[str, Any], df: Dockerfile, env_dir: Path, cluster: Cluster, pod_name: str
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of `container` run from `env_dir` as its image would run it."""
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": POD_HOME, **df.runtime_env}
    # Not from the object: the test run's pub/sub namespace (Redis channels are server-wide).
    env["LLMFLEET_CHANNEL_NAMESPACE"] = CHANNEL_NAMESPACE
    for entry in container.get("env", []):
        value = _map(_env_value(entry, cluster, pod_name), cluster)
        if entry["name"].endswith("_PORT") and value.isdigit() and int(value) in cluster.ports:
            value = str(cluster.ports[int(value)])  # a listen port (e.g. LLMFLEET_NODE_PORT)
        env[entry["name"]] = value
    command = list(container.get("command", df.entrypoint))
    args = list(container.get("args", df.cmd))
    mapped: list[str] = []
    for i, arg in enumerate(args):
        arg = VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), arg)
        if i and args[i - 1].endswith("-port") and int(arg) in cluster.ports:
            arg = str(cluster.ports[int(arg)])
        mapped.append(_map(arg, cluster))
    assert command[:1] == ["llmfleet"], command
    return [str(env_dir / "bin" / "llmfleet"), *command[1:], *mapped], env


def dockerfile_for(image: str) -> Path:
    """docker/<app>.Dockerfile of an image reference `…/<app>:tag` or `…/<app>@sha256:…`."""
    app = re.split(r"[:@]", image.rsplit("/", 1)[-1])[0]
    path = ROOT / "docker" / f"{app}.Dockerfile"
    assert path.is_file(), f"no Dockerfile for image {image!r}"
    return path


def run_as(pod: Mapping[str, Any], container: Mapping[str, Any], df: Dockerfile) -> tuple[int, int]:
    """(uid, gid) the kubelet runs `container` with: its securityContext, then the pod's, then the
    image's USER."""
    image_uid, _, image_gid = df.user.partition(":")
    uid, gid = int(image_uid), int(image_gid or image_uid)
    for ctx in (pod.get("securityContext") or {}, container.get("securityContext") or {}):
        uid = int(ctx.get("runAsUser", uid))
        gid = int(ctx.get("runAsGroup", gid))
    return uid, gid


# In a private mount namespace: the writable volumes become mount points of their own, every other
# mount outside /proc, /sys and /dev is remounted read-only (readOnlyRootFilesystem), then the
# process runs as the pod's user. `unshare` and `setpriv` exec, so the pid is the container's.
_SANDBOX = r"""
set -eu
for w in $WRITABLE; do mount --bind "$w" "$w"; done
for mp in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  case "$mp" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  keep=0
  for w in $WRITABLE; do [ "$mp" = "$w" ] && keep=1; done
  [ "$keep" = 1 ] || mount -o remount,bind,ro "$mp"
done
exec setpriv --reuid "$RUN_UID" --regid "$RUN_GID" --clear-groups $CAPS -- "$@"
"""


def sandboxed(
    argv: list[str], uid: int, gid: int, writable: list[Path], drop_all_caps: bool = True
) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment that run `argv` as the pod does: uid/gid, read-only root
    filesystem, only `writable` (the container's rendered read-write volume mounts) writable,
    no capabilities when the container drops ALL."""
    for path in writable:
        assert " " not in str(path), path
    wrapper = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _SANDBOX, "sandbox", *argv]
    extra = {
        "WRITABLE": " ".join(str(p) for p in writable),
        "RUN_UID": str(uid),
        "RUN_GID": str(gid),
        "CAPS": "--inh-caps=-all --bounding-set=-all" if drop_all_caps else "--inh-caps=-all",
    }
    return wrapper, extra


def writable_mounts(container: Mapping[str, Any], cluster: Cluster) -> list[Path]:
    """The local directories of the container's rendered volume mounts that are not readOnly."""
    return [
        cluster.mounts[m["mountPath"]]
        for m in container.get("volumeMounts", [])
        if not m.get("readOnly", False)
    ]


def drops_all_capabilities(container: Mapping[str, Any]) -> bool:
    return "ALL" in (container.get("securityContext") or {}).get("capabilities", {}).get("drop", [])
