"""One virtual environment per training client (LLaMA-Factory, Axolotl), pinned and cached.

Neither client installs beside autotune's own stack (they pin older transformers), so the client tier
builds each one in a venv of its own next to the same CPU torch, under
``$AUTOTUNE_CLIENTS_CACHE`` (default ``~/.cache/autotune-clients``), keyed by the pins and the Python
version: a second run reuses it, a changed pin builds a new one. Build once by hand with

    python tests/_clients.py build llamafactory axolotl

A venv that cannot be built (no network, no wheel for this Python) is reported with pip's last lines;
the tests skip with that reason, never pass.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# torch first and in every later install, so the resolver never swaps in a CUDA build
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")


@dataclass(frozen=True)
class Client:
    name: str
    pins: tuple[str, ...]
    # wheels the client pulls that cannot load next to CPU torch (torchvision's ops need a matching build)
    remove: tuple[str, ...] = ()
    # a module whose import proves the install works
    probe_import: str = ""
    # removed modules the client imports unconditionally but a text-only run never calls: each becomes an
    # import stub whose every attribute raises ImportError (transformers' is_torchaudio_available() then
    # says True, so any code path that touches the module fails loudly rather than running something else)
    stubs: tuple[str, ...] = ()


CLIENTS: dict[str, Client] = {
    "llamafactory": Client(
        "llamafactory", ("llamafactory==0.9.5",), remove=("torchvision", "torchaudio"),
        probe_import="llamafactory.hparams.parser",
        # llamafactory/data/mm_plugin.py imports torchaudio at the top to load audio inputs; PyPI's
        # torchaudio wheels (2.11 the newest) do not load next to CPU torch 2.13
        stubs=("torchaudio",),
    ),
    # deepspeed: Axolotl imports it to load a `deepspeed:` file (the pin autotune's own extra installs)
    "axolotl": Client("axolotl", ("axolotl==0.19.0", "deepspeed==0.19.8"), probe_import="axolotl.utils.config"),
}

# what every client process gets: no telemetry (Axolotl's hangs offline after training), no hub calls
CLIENT_ENV = {
    "AXOLOTL_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "DISABLE_VERSION_CHECK": "1",
}


def cache_root() -> Path:
    return Path(os.environ.get("AUTOTUNE_CLIENTS_CACHE", Path.home() / ".cache" / "autotune-clients"))


def key(client: Client) -> str:
    text = json.dumps({"python": sys.version_info[:2], "torch": TORCH_SPEC, "pins": client.pins,
                       "remove": client.remove})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def venv_dir(client: Client) -> Path:
    return cache_root() / f"{client.name}-{key(client)}"


class BuildFailed(RuntimeError):
    pass


def _pip(python: Path, *args: str, log: Path) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        # bounded, so a hung index cannot eat CI's 90 minutes (a cold Axolotl install took ~12 min here)
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                              timeout=float(os.environ.get("AUTOTUNE_CLIENTS_PIP_TIMEOUT", "1200")))
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        tail = [ln for ln in lines if not ln.startswith("WARNING: Location")][-6:]  # pip's index noise left out
        raise BuildFailed(f"`pip {' '.join(args[:3])} ...` failed (exit {proc.returncode}): " + " | ".join(tail))


STUB = """\"\"\"autotune's client tier: an import stub for {name}, which cannot load next to CPU torch here.\"\"\"


def __getattr__(attr):
    raise ImportError("{name} is an import stub in this test venv (no wheel loads next to CPU torch); "
                      f"{name}.{{attr}} was used")
"""


def install_stubs(client: Client, python: Path) -> None:
    """Write the client's import stubs into its venv (idempotent; an installed module is never replaced)."""
    if not client.stubs:
        return
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in client.stubs:
        pkg = Path(site) / name
        init = pkg / "__init__.py"
        if pkg.exists() and not (init.exists() and "import stub" in init.read_text()):
            continue
        pkg.mkdir(exist_ok=True)
        tmp = init.with_suffix(".tmp")
        tmp.write_text(STUB.format(name=name))
        os.replace(tmp, init)


def build(client: Client) -> Path:
    """The client's venv python, built if missing; BuildFailed with pip's last lines when it cannot be."""
    root = venv_dir(client)
    python = root / "bin" / "python"
    done = root / ".complete"
    if done.exists():
        install_stubs(client, python)
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions building the same venv: one builds, one waits
        if done.exists():
            return python
        if root.exists():  # a build interrupted earlier
            shutil.rmtree(root)
        log = root.parent / f"{root.name}.log"
        log.write_text("")
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True)
            _pip(python, "install", "-q", "--upgrade", "pip", log=log)
            _pip(python, "install", "-q", TORCH_SPEC, log=log)
            _pip(python, "install", "-q", *client.pins, TORCH_SPEC, log=log)
            if client.remove:
                _pip(python, "uninstall", "-y", *client.remove, log=log)
            install_stubs(client, python)
            check = subprocess.run([str(python), "-c", f"import {client.probe_import}"],
                                   capture_output=True, text=True, env={**os.environ, **CLIENT_ENV})
            if check.returncode != 0:
                raise BuildFailed(f"import {client.probe_import} failed: {check.stderr.strip()[-400:]}")
        except (BuildFailed, subprocess.SubprocessError, OSError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise BuildFailed(f"{client.name} venv could not be built ({exc}); log: {log}") from exc
        done.write_text(json.dumps({"pins": client.pins, "torch": TORCH_SPEC,
                                    "seconds": round(time.monotonic() - t0)}))
    return python


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("build", "path"):
        print("usage: python tests/_clients.py build|path CLIENT [CLIENT ...]", file=sys.stderr)
        return 2
    for name in argv[1:]:
        client = CLIENTS[name]
        if argv[0] == "path":
            print(venv_dir(client))
            continue
        t0 = time.monotonic()
        try:
            python = build(client)
        except BuildFailed as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"{name}: {python} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
