"""The built wheel, installed (not editable) into a fresh venv, runs the README's quick start.

Run from a folder outside the checkout, so nothing can come from the source
tree: the image sources and policies must travel in the wheel itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO, scrubbed_env

BUILD_TIMEOUT_S = 600  # pip builds the wheel in an isolated env, then installs its dependencies


def run(argv, cwd, timeout=BUILD_TIMEOUT_S, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_the_wheel_installs_and_runs_the_quick_start_from_anywhere(tmp_path):
    dist, venv, home = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    home.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)], cwd=home)
    wheel = next(dist.glob("wakeloop-*.whl"))
    run([sys.executable, "-m", "venv", str(venv)], cwd=home)
    run([str(venv / "bin/pip"), "install", "-q", str(wheel)], cwd=home)
    wakeloop = str(venv / "bin/wakeloop")
    env = scrubbed_env()

    from orchestrator import __version__

    assert run([wakeloop, "--version"], home, env=env).stdout.strip() == f"wakeloop {__version__}"
    console = (
        "import orchestrator.console.app as a; assert (a.HERE / 'templates' / 'fleet.html').is_file() "
        "and (a.HERE / 'static' / 'console.css').is_file()"
    )  # serve --http's pages travel too
    run([str(venv / "bin/python"), "-c", console], home, env=env)
    in_box = (
        "import re; from orchestrator.sandbox.containers import programs as p; "
        "assert 'def bare_repo' in p.WRITE_SCRIPT and 'wakeloop:ready' in p.LAUNCHER and 'os.fork()' in p.GUARD "
        "and not re.search(r'__[A-Z][A-Z_]*__', p.GUARD)"  # every mark filled in (dunders are lower case)
    )
    run([str(venv / "bin/python"), "-c", in_box], home, env=env)  # the in-box programs travel as files
    run([str(venv / "bin/python"), "-c", "import orchestrator.testing.fakeapi"], home, env=env)  # and the stand-ins
    assert "built wakeloop-sandbox" in run([wakeloop, "image", "build"], home, env=env).stdout
    run([wakeloop, "init", "agents/mine", "--policy", "strict"], home, env=env)
    assert "policies/strict.yaml" in run([wakeloop, "policy", "explain", "agents/mine"], home, env=env).stdout
    run([wakeloop, "init", "agents/open"], home, env=env)
    out = run([wakeloop, "sandbox", "exec", "agents/open", "--", "id -u; ls /workspace"], home, env=env).stdout
    assert out.startswith("[exit 0]") and "memory" in out
    receipt = json.loads(run([wakeloop, "wake", "agents/open"], home, env=env).stdout)
    assert receipt["status"] == "done" and receipt["live"] is False
