"""The deployment recipes in examples/deploy/ parse, and use the commands as they are."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from zmesh.cli.up import Host, _launch

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_sbatch_script_is_valid_bash_and_uses_zmesh_up_attached() -> None:
    script = DEPLOY / "zmesh-agents.sbatch"
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert "zmesh up " in text and "--attach" in text and "srun" in text


def test_the_daemonset_runs_one_keyed_agent_per_node() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DEPLOY / "zmesh-daemonset.yaml").read_text())
    assert doc["kind"] == "DaemonSet"
    spec = doc["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    args = spec["containers"][0]["args"][0]
    assert 'zmesh agent --bind "tcp://${NODE_IP}:7411"' in args and "--keys /keys" in args


def test_launchers_get_the_command_as_their_shell_wants_it() -> None:
    h = Host("node1", "10.0.0.1")
    assert _launch("ip netns exec {host}", h, "echo hi") == [
        "ip", "netns", "exec", "node1", "sh", "-c", "echo hi"
    ]  # fmt: skip
    # ssh joins its arguments into one command line for the remote shell: one word.
    assert _launch("ssh {host} --", h, "echo 'a b'") == [
        "ssh", "node1", "--", "sh -c 'echo '\"'\"'a b'\"'\"''"
    ]  # fmt: skip
